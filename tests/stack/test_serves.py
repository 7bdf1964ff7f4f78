"""`serves`: a name shared by interchangeable models, which must be one of its own (no model's, no alias)."""

from __future__ import annotations

from pathlib import Path

import pytest

HEAD = 'version = 1\nname = "t"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n'


def worker(name: str, extra: str) -> str:
    return f'\n[models.{name}]\nruntime = "command"\ncommand = ["true"]\nmemory = "1GiB"\n{extra}'


CASES = {
    "a model's name": (
        worker("a", 'serves = ["b"]\n') + worker("b", ""),
        'stack.toml:11:11: models.a.serves[0]: "b" is already models.b: a shared name must be one of its own\n'
        "  hint: use a name no model and no alias has\n",
    ),
    "an alias": (
        worker("a", 'serves = ["x"]\n') + worker("b", 'aliases = ["x"]\n'),
        'stack.toml:11:11: models.a.serves[0]: "x" is already models.b.aliases: a shared name must be one of its '
        "own\n  hint: use a name no model and no alias has\n",
    ),
    "twice": (worker("a", 'serves = ["x", "x"]\n'), 'stack.toml:11:16: models.a.serves[1]: "x" is listed twice\n'),
}


@pytest.mark.parametrize("models,expected", CASES.values(), ids=CASES.keys())
def test_a_shared_name_that_is_not_its_own_is_refused(tmp_path: Path, run_cli, models: str, expected: str) -> None:
    (tmp_path / "stack.toml").write_text(HEAD + models)
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (2, "", expected)


def test_models_sharing_a_name_are_valid_and_the_plan_says_it(tmp_path: Path, run_cli) -> None:
    import json

    (tmp_path / "stack.toml").write_text(
        HEAD + worker("a", 'serves = ["coder"]\n') + worker("b", 'serves = ["coder"]\n')
    )
    code, _, err = run_cli("build", "stack.toml", "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert code == 0, err
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert (plan["models"]["a"]["serves"], plan["models"]["b"]["serves"]) == (["coder"], ["coder"])
