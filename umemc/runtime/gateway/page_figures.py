"""What the page and `status` show of a model's traffic (its tokens/s, its requests' latencies and tokens, the
memory drawn over time) outlives the gateway: kept in RUN/state/gateway-figures.json, written at most every
SAVE_S while they change and when the gateway stops, read back by the next gateway of the same run (the same
supervisord). A gateway restarted by a reconcile, a crash or a kill -9 shows the figures it had (a kill -9 loses
at most the last SAVE_S of them).

The file is input like any state file: read within MAX_BYTES, anything malformed in it is dropped whole, said
once, and the gateway starts with empty figures."""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec

from ...records import read_file, write_atomic
from .history import Answered, Memory, Requests
from .traffic import Traffic

_ENCODE = msgspec.json.Encoder().encode  # compact JSON: a window's item once, as it enters

SAVE_S = 5.0
MAX_BYTES = 8 * 1024 * 1024
FORMAT = "umemc-gateway-figures"


class Texts:
    """Each item's JSON text of a window (a deque that gains at its end and loses at its start: the requests
    answered, the memory drawn), made once: a full window is 5000 requests and 1800 points, ~14 ms of the event
    loop to write out whole, and an item stays in it for up to ten minutes, written every SAVE_S."""

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.texts: deque[str] = deque()

    def of(self, items: deque[Any]) -> str:
        """The window as a JSON array, as json.dumps writes it (compact)."""
        kept = self.items
        while kept and (not items or kept[0] is not items[0]):  # what left the window's start
            kept.popleft()
            self.texts.popleft()
        n = len(kept)
        if n and (n > len(items) or items[n - 1] is not kept[-1]):  # not a start of it (replaced: load)
            kept.clear()
            self.texts.clear()
            n = 0
        for item in itertools.islice(items, n, None):
            kept.append(item)
            self.texts.append(_ENCODE(item).decode())
        return "[" + ",".join(self.texts) + "]"


class Saver:
    """save() for one gateway: the windows' texts kept between saves (Texts)."""

    def __init__(self) -> None:
        self.answered, self.memory = Texts(), Texts()

    def save(
        self, path: Path, supervisord_pid: int | None, traffic: dict[str, Traffic], answered: Requests, memory: Memory
    ) -> None:
        doc = {
            "format": FORMAT,
            "version": 1,
            "supervisord_pid": supervisord_pid,
            "traffic": {
                n: {
                    "tokens_in": t.tokens_in,
                    "tokens_out": t.tokens_out,
                    "prompt_speed": t.prompt_speed,
                    "speed": [list(x) for x in t.speed],
                }
                for n, t in traffic.items()
            },  # fmt: skip
        }
        head = json.dumps(doc, separators=(",", ":"))
        windows = f',"answered":{self.answered.of(answered.items)},"memory":{self.memory.of(memory.points)}}}'
        try:
            write_atomic(path, head[:-1] + windows)
        except OSError as exc:
            print(f"umemc-gateway: cannot keep its figures in {path}: {exc}", file=sys.stderr, flush=True)


def load(
    path: Path, supervisord_pid: int | None, traffic: dict[str, Traffic], answered: Requests, memory: Memory
) -> bool:
    """The figures an earlier gateway of this run kept, into these (models no longer in the stack dropped); False
    where there were none to take (another run's, or none, or malformed: said)."""
    if not path.exists() and not path.is_symlink():
        return False
    try:
        doc = json.loads(read_file(path, MAX_BYTES))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != 1:
            raise ValueError("not a umemc gateway figures file")
        if doc.get("supervisord_pid") != supervisord_pid:
            return False  # another run's
        # read whole before anything is taken: nothing half taken from a malformed file
        kept = {n: Traffic() for n in traffic}
        rows, points = Requests(), Memory(memory.step_s)
        taken = _traffic(doc["traffic"], kept), _answered(doc["answered"], rows), _memory(doc["memory"], points)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # whatever its damage: not used
        why = "it nests too deep" if isinstance(exc, RecursionError) else exc
        print(f"umemc-gateway: its kept figures in {path} are not used: {why}", file=sys.stderr, flush=True)
        return False
    for name, t in kept.items():
        traffic[name].tokens_in, traffic[name].tokens_out = t.tokens_in, t.tokens_out
        traffic[name].prompt_speed = t.prompt_speed
        traffic[name].speed.extend(t.speed)
    answered.items.extend(rows.items)
    memory.points.extend(points.points)
    return any(taken)


def _num(x: Any, kind: type = float) -> Any:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)) or (kind is int and not isinstance(x, int)):
        raise ValueError(f"{x!r} is not a number")
    return x


def _traffic(doc: Any, traffic: dict[str, Traffic]) -> bool:
    for name, t in dict(doc).items():
        if name in traffic:
            kept = traffic[name]
            kept.tokens_in, kept.tokens_out = _num(t["tokens_in"], int) or 0, _num(t["tokens_out"], int) or 0
            kept.prompt_speed = _num(t["prompt_speed"])
            kept.speed.extend((_num(a, int), _num(b)) for a, b in t["speed"])
    return bool(doc)


def _answered(rows: Any, answered: Requests) -> bool:
    for r in list(rows)[-answered.items.maxlen if answered.items.maxlen else None :]:
        t, model, status, latency, queue, tin, tout, tps, pps = r
        if not isinstance(model, str):
            raise ValueError(f"{model!r} is not a model's name")
        answered.add(Answered(_num(t), model, _num(status, int), _num(latency), _num(queue), _num(tin, int),
                              _num(tout, int), _num(tps), _num(pps)))  # fmt: skip
    return bool(rows)


def _memory(rows: Any, memory: Memory) -> bool:
    for t, usage, gpu, pressure, committed in list(rows):
        if not isinstance(usage, dict) or not all(isinstance(k, str) for k in usage):
            raise ValueError("a memory point without its models")
        usage = {k: _num(v, int) for k, v in usage.items()}
        memory.points.append((_num(t), usage, _num(gpu, int), _num(pressure), _num(committed, int)))
    return bool(rows)


def due(last: float) -> bool:
    return time.monotonic() - last >= SAVE_S
