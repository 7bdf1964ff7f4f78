"""umemc.targets.yamltext against PyYAML's reader (an independent parser): every string a manifest can hold comes
back as the same string, every structure as the same structure, and the strings YAML 1.1 or 1.2 readers would take
for something else (go-yaml's y/n booleans, 1.2's 0o17 and 1e3) are quoted."""

from __future__ import annotations

import random
import string

import pytest
import yaml

from umemc.targets.yamltext import dump_all

AWKWARD = [
    "", " lead", "trail ", "a: b", "a #b", "#c", "-x", "- x", "-1", "-.5", "--", "---", "...", "x:", "?", "? x",
    "yes", "no", "on", "off", "y", "Y", "n", "N", "True", "null", "Null", "~", "=", "<<", "1:20", "0o17", "0x1F",
    "1e3", ".inf", ".nan", "12345", "3.0", "1_000", "0.0.0.0", "@a", "`x", "%x", "!x", "*x", "&x", "|", ">", "'q'",
    '"d"', "[x]", "{x}", "a,b", "a:b", "http://x:80/y", "é", "\x07", "\x85", "\u2028", "\ufeff", "a\r\nb", "x\ny",
    "x\ny\n", "x\ny\n\n\n", "\tx\ny", " x\ny", "\nx", "a\n  b\n\nc", "a\n   \nb", "tab\tinside",
]  # fmt: skip


def test_awkward_strings_come_back_as_themselves() -> None:
    docs = [
        {"list": AWKWARD, "map": {s or "empty": s for s in AWKWARD}},
        {"nested": [{"a": [1, [2, [3, {}]], []], "b": None, "c": True, "d": False, "e": {"f": "g\nh"}}]},
    ]
    assert list(yaml.safe_load_all(dump_all(docs))) == docs


def test_numbers_and_yaml11_booleans_are_quoted_plain_words_are_not() -> None:
    text = dump_all([{"a": ["y", "0o17", "1e3", "-m", "--port", "on", "chat", "registry.example.com/serve:1.0"]}])
    assert text == ('a:\n- "y"\n- "0o17"\n- "1e3"\n- -m\n- --port\n- "on"\n- chat\n- registry.example.com/serve:1.0\n')


def test_literal_blocks_keep_how_the_text_ends() -> None:
    assert dump_all([{"a": "x\ny"}]) == "a: |-\n  x\n  y\n"
    assert dump_all([{"a": "x\ny\n"}]) == "a: |\n  x\n  y\n"
    assert dump_all([{"a": "x\ny\n\n"}]) == "a: |+\n  x\n  y\n\n"
    assert dump_all([{"a": [{"b": "x\n"}]}]) == "a:\n- b: |\n    x\n"


@pytest.mark.parametrize("seed", range(4))
def test_random_strings_round_trip(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = string.printable + "é\x85\u2028:#-?"
    for _ in range(5000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        docs = [{"k": s, s or "e": [s, {"x": s}]}]
        assert list(yaml.safe_load_all(dump_all(docs))) == docs, repr(s)


def test_only_plain_document_values() -> None:
    with pytest.raises(TypeError, match="no YAML text for float values here"):
        dump_all([{"a": 1.5}])


def test_long_lists_of_names_are_flow_sequences_wrapped_under_their_key() -> None:
    names = [f"n{i:03d}" for i in range(30)]
    text = dump_all([{"a": {"values": names, "few": ["x", "y"], "awkward": [*names[:17], "x,y"]}}])
    assert text.splitlines()[:4] == [
        "a:",
        "  values: [n000, n001, n002, n003, n004, n005, n006, n007, n008, n009, n010, n011, n012, n013, n014, n015,",
        "    n016, n017, n018, n019, n020, n021, n022, n023, n024, n025, n026, n027, n028, n029]",
        "  few:",
    ]
    assert list(yaml.safe_load_all(text)) == [
        {"a": {"values": names, "few": ["x", "y"], "awkward": [*names[:17], "x,y"]}}
    ]
    assert "- x,y" in text  # a comma in a flow sequence would split the item: that list stays in block style


@pytest.mark.parametrize("seed", range(2))
def test_random_lists_round_trip(seed: int) -> None:
    rng = random.Random(seed)
    chars = string.ascii_letters + string.digits + "-_./:, #"
    for _ in range(2000):
        items = ["".join(rng.choice(chars) for _ in range(rng.randrange(1, 12))) for _ in range(rng.randrange(10, 40))]
        docs = [{"k": {"v": items}}, {"top": items}]
        assert list(yaml.safe_load_all(dump_all(docs))) == docs, items
