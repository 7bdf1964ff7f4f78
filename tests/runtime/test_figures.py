"""The figures the page shows, kept for the next gateway (umemc.runtime.gateway.page_figures): the file a Saver writes
is the document written whole, however its windows (the requests answered, the memory drawn) moved since the
last save, and each item of a window is written out once, not at every save."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umemc.runtime.gateway import page_figures as figures
from umemc.runtime.gateway.history import Answered, Memory, Requests
from umemc.runtime.gateway.traffic import Traffic

DUMPS = json.dumps  # the test's own, not the one it counts
ENCODE = figures._ENCODE


def whole(pid: int, traffic: dict[str, Traffic], answered: Requests, memory: Memory) -> str:
    """The document as one json.dumps of it all writes it (the windows' items as arrays)."""
    doc = {
        "format": "umemc-gateway-figures",
        "version": 1,
        "supervisord_pid": pid,
        "traffic": {
            n: {
                "tokens_in": t.tokens_in,
                "tokens_out": t.tokens_out,
                "prompt_speed": t.prompt_speed,
                "speed": [list(x) for x in t.speed],
            }
            for n, t in traffic.items()
        },  # fmt: skip
        "answered": [list(a) for a in answered.items],
        "memory": [list(p) for p in memory.points],
    }
    return DUMPS(doc, separators=(",", ":"))


def answer(i: int) -> Answered:
    return Answered(1000.0 + i, "m" if i % 2 else 'we"ird', 200, 0.25 + i / 7, 0.001, 30 + i, 64, 91.5 + i, None)


def test_the_file_is_the_whole_document_as_the_windows_move(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "figures.json"
    traffic = {"m": Traffic()}
    traffic["m"].tokens_in, traffic["m"].tokens_out = 120, 640
    answered, memory = Requests(max_requests=4), Memory(step_s=1.0, window_s=2.0)  # 4 requests, 3 points
    saver = figures.Saver()
    made: list[object] = []

    def counting(obj: object, **kw: object) -> str:
        made.append(obj)
        return DUMPS(obj, **kw)  # type: ignore[arg-type]

    def encoding(obj: object) -> bytes:  # a window's item
        made.append(obj)
        return ENCODE(obj)

    monkeypatch.setattr(figures.json, "dumps", counting)
    monkeypatch.setattr(figures, "_ENCODE", encoding)

    def saved() -> str:
        made.clear()
        saver.save(path, 7, traffic, answered, memory)
        return path.read_text()

    assert saved() == whole(7, traffic, answered, memory)  # empty windows
    for i in range(3):
        answered.add(answer(i))
    memory.record(10.0, {"m": 5}, 0, None, 5)
    assert saved() == whole(7, traffic, answered, memory)
    assert made[1:] == [answer(0), answer(1), answer(2), (10.0, {"m": 5}, 0, None, 5)]  # the head, then each item

    for i in range(3, 7):  # past the window's 4: three leave its start
        answered.add(answer(i))
    memory.record(11.0, {"m": 6}, 0, 0.5, 6)
    assert saved() == whole(7, traffic, answered, memory)
    assert [a[0] for a in answered.items] == [1003.0, 1004.0, 1005.0, 1006.0]
    assert made[1:] == [answer(3), answer(4), answer(5), answer(6), (11.0, {"m": 6}, 0, 0.5, 6)]  # only the new

    assert saved() == whole(7, traffic, answered, memory)
    assert len(made) == 1  # nothing new: the head alone

    answered.items.clear()  # the window replaced (as load() fills a new gateway's)
    answered.add(answer(9))
    assert saved() == whole(7, traffic, answered, memory)
    assert made[1:] == [answer(9)]

    back_answered, back_memory = Requests(), Memory(step_s=1.0)
    back = {"m": Traffic()}
    assert figures.load(path, 7, back, back_answered, back_memory)
    assert list(back_answered.items) == [answer(9)]
    assert list(back_memory.points) == [(10.0, {"m": 5}, 0, None, 5), (11.0, {"m": 6}, 0, 0.5, 6)]
    assert (back["m"].tokens_in, back["m"].tokens_out) == (120, 640)
