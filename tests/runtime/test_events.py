"""The event kinds `umemc events --kind` accepts are every kind the code records: read from the source of
umemc itself (each EventLog.add / _event / emit call with a literal kind, and the kinds given by name)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from umemc.runtime.event_log import KINDS

PACKAGE = Path(__file__).resolve().parents[2] / "umemc"
# kinds passed in a variable (why="lease_release" and the like): the literals at their call sites
BY_NAME = {
    "lease_release",
    "lease_expire",
    "ttl_unload",
    "ttl_unload_failed",
    "unload",
    "unload_failed",
    "defragment",
    "defragment_failed",
}  # *_failed: f"{why}_failed"


def recorded_kinds() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add", "_event", "emit")
            ):
                for arg in node.args[:2]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.isidentifier():
                        found.add(arg.value)
    return found


def test_every_recorded_kind_is_listed() -> None:
    assert recorded_kinds() - set(KINDS) == set()
    assert set(KINDS) - recorded_kinds() == BY_NAME
    assert BY_NAME <= set(KINDS)
    for kind in BY_NAME:  # and each named kind really is written somewhere
        assert any(f'"{kind}"' in p.read_text() for p in PACKAGE.rglob("*.py")), kind


def test_every_kind_reads_in_words() -> None:
    from umemc.runtime.eventtext import SAID

    assert set(SAID) == set(KINDS)


@pytest.mark.parametrize(
    ("kind", "detail", "words"),
    [
        ("evict", {"by": "gateway", "for_model": "chat", "usage_bytes": 1}, "evicted to start chat"),
        ("evict", {"by": "gateway", "for_lease": "l-1"}, "evicted for lease l-1"),
        ("evict", {"by": "enforcer", "reason": "pressure", "pressure": 0.9712},
         "evicted for memory pressure 97% by the enforcer"),
        ("exit", {"cause": "exited", "exitstatus": 3}, "exited (status 3)"),
        ("exit", {"cause": "hard quota (enforcer)", "exitstatus": None}, "exited: hard quota (enforcer)"),
        ("hard_limit_kill", {"by": "enforcer", "usage_bytes": 3 * 2**30, "hard_bytes": 2 * 2**30},
         "killed over its hard quota (3.0 GiB of 2.0 GiB)"),
        ("cold_start", {"seconds": 2.345, "evicted": ["a", "b"]}, "started on demand in 2.3 s, evicting a, b"),
        ("cold_start", {"seconds": 7.0, "evicted": []}, "started on demand in 7.0 s, evicting nothing"),
        ("evict", {"by": "gateway", "for_lease": "l-1", "holder": "comfyui", "priority": 40, "for_priority": 75},
         "evicted for lease l-1 of comfyui (priority 40 < 75)"),
        ("evict", {"by": "gateway", "for_model": "b", "priority": 50, "for_priority": 50},
         "evicted to start b (both priority 50: the idle one gives way)"),
        ("evict", {"for_model": "b", "priority": 50, "for_priority": 50, "restore_s": 0.412,
                   "restore_from": "measured"},
         "evicted to start b (both priority 50: bringing it back takes 0.412 s by its last start; the quicker to "
         "bring back, then the longer idle, gives way)"),
        ("evict", {"for_model": "b", "priority": 50, "for_priority": 50, "restore_s": 2.5, "restore_from": "size"},
         "evicted to start b (both priority 50: bringing it back takes 2.5 s from its size; the quicker to bring "
         "back, then the longer idle, gives way)"),
        ("action", {"action": "start", "evicts": ["a"]}, "a start asked from the page or the API (evicting a)"),
        ("ttl_unload", {"by": "gateway", "ttl_s": 1.0}, "unloaded: idle past its ttl"),
        ("evict", {"for_model": None, "reason": 5}, "evicted"),  # odd shapes read plainly, never raise
        ("no_such_kind", {}, "no_such_kind"),
        ("slot_restore", {"slot": 0, "tokens": 412, "ms": 9.5, "saved_s": 1.27},
         "KV of slot 0 restored: 412 tokens in 9.5 ms, about 1.3 s of prompt reading saved"),
        ("give_up", {"kills": "x"}, "left stopped: x hard-quota kills in a row"),
        ("estimate_drift", None, "estimate_drift"),
        ("defragment", {"unused_bytes": 3 << 30, "held_s": 301},
         "restarted at a quiet moment: its allocator held 3.0 GiB beyond its tensors for 301 s"),
        ("defragment", {"unused_bytes": 3 << 30, "held_s": 301, "measure": "beyond_buffers"},
         "restarted at a quiet moment: its process held 3.0 GiB beyond its buffers for 301 s"),
    ],
)  # fmt: skip
def test_an_event_in_words(kind: str, detail: Any, words: str) -> None:
    from umemc.runtime.eventtext import said

    assert said(kind, detail) == words


def test_a_process_start_noted_after_its_cold_start_reads_as_the_cold_start(tmp_path: Path) -> None:
    """The enforcer notes a new process when it samples it, which may come after the gateway's word that it
    started the model on demand: that start is the cold start (the latest event a person is shown says why). A
    start after an exit (supervisord's restart after a crash) is news of its own."""
    from umemc.runtime.event_log import EventLog

    log = EventLog(tmp_path / "events.db")
    try:
        log.add("up", None)
        log.add("cold_start", "b", seconds=0.1, evicted=["a"], waiting=1)
        log.add("start", "b", pid=12)
        log.add("start", "c", pid=13)
        log.add("cold_start", "d", seconds=0.2, evicted=[], waiting=1)
        log.add("exit", "d", cause="killed by a signal", exitstatus=None)
        log.add("start", "d", pid=14)
        latest = log.latest(log.last_id("up"))
        assert {m: e.kind for m, e in latest.items()} == {"b": "cold_start", "c": "start", "d": "start"}
    finally:
        log.close()


def test_an_exit_after_an_eviction_reads_as_the_eviction_and_a_start_after_a_restore_as_the_restore(
    tmp_path: Path,
) -> None:
    """An evicted worker dies by the signal its stop took: its exit is that eviction's (with its cause), not "killed
    by a signal"; the gateway's restore, then the enforcer's note of the new process, reads as the restore. An exit
    with no stop before it (a crash) is news of its own, as is an exit after a start that followed a stop."""
    from umemc.runtime.event_log import EventLog
    from umemc.runtime.eventtext import said

    log = EventLog(tmp_path / "events.db")
    try:
        log.add("up", None)
        log.add("start", "a", pid=11)
        log.add("evict", "a", for_lease="L1", holder="comfyui", priority=10, for_priority=50)
        log.add("exit", "a", cause="killed by a signal", exitstatus=None)
        log.add("start", "b", pid=12)
        log.add("exit", "b", cause="killed by a signal", exitstatus=None)
        log.add("evict", "c", for_model="b", priority=10, for_priority=50)
        log.add("exit", "c", cause="stopped", exitstatus=0)
        log.add("restore", "c", reason="hot worker evicted earlier fits again")
        log.add("start", "c", pid=13)
        log.add("unload", "d")
        log.add("start", "d", pid=14)
        log.add("exit", "d", cause="killed by a signal", exitstatus=None)
        latest = log.latest(log.last_id("up"))
        assert {m: e.kind for m, e in latest.items()} == {"a": "evict", "b": "exit", "c": "restore", "d": "exit"}
        assert said(latest["a"].kind, latest["a"].detail) == "evicted for lease L1 of comfyui (priority 10 < 50)"
        assert said(latest["c"].kind, latest["c"].detail) == "restored: it fits again after its eviction"
    finally:
        log.close()


def test_where_a_damaged_log_went_is_read_from_the_reset_that_began_the_new_one(tmp_path: Path) -> None:
    """The writer that moved a damaged log aside begins the new one with a reset naming where it went; another
    writer that opened the new log (the restarted enforcer) reads it there. A reset that only says a writer reopened
    the log names no move; one before the run's latest `up` belongs to an earlier run."""
    from umemc.runtime.event_log import EventLog

    log = EventLog(tmp_path / "events.db")
    try:
        assert log.moved_before() is None
        log.add("event_log_reset", None, moved_to="/run/state/events.db.corrupt-1", reason="the event log was corrupt")
        log.add("event_log_reset", None, reason="/run/state/events.db was deleted or replaced while in use")
        assert log.moved_before() == "/run/state/events.db.corrupt-1"
        log.add("up", None)
        assert log.moved_before(log.last_id("up")) is None
        log.add("event_log_reset", None, moved_to="/run/state/events.db.corrupt-2", reason="integrity check: x")
        assert log.moved_before(log.last_id("up")) == "/run/state/events.db.corrupt-2"
    finally:
        log.close()
