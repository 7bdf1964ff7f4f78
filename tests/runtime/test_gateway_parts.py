"""The gateway's parts are given what they use, never the scheduler (gateway/core.py): each part the scheduler
composes holds no reference to it, the records it hands them (core.Parts, core.SlotCalls) neither, but for the
calls a part makes (a bound method: a `kick`, a refusal); and the admission's figures are a reader, changing
nothing and writing no event. The metrics are the HTTP side's (app.py), which holds the scheduler as every handler
does, and are attached after."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

from tests.runtime.test_scheduler import FakeSupervisor, model, scheduler
from umemc.runtime.gateway.scheduler import Scheduler


def _references(obj: Any) -> list[tuple[str, Any]]:
    """What an object holds by name: its attributes, or a record's fields."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return list(vars(obj).items()) if hasattr(obj, "__dict__") else []


def test_no_part_is_handed_the_scheduler(tmp_path: Path) -> None:
    sched = scheduler(tmp_path, model("a", 50) + model("b", 40, mode="cold"), FakeSupervisor())
    parts = {
        name: value
        for name, value in vars(sched).items()
        if type(value).__module__.startswith("umemc.runtime.gateway.") and not isinstance(value, Scheduler)
    }
    # what the scheduler composes: each a part of its own module
    assert {"slots", "sync", "book", "admission", "parts", "process", "actions", "housekeeping"} <= set(parts)
    calls = []
    for name, part in parts.items():
        for held, value in _references(part):
            assert value is not sched, f"{name}.{held} is the scheduler"
            if inspect.ismethod(value) and value.__self__ is sched:
                calls.append(f"{name}.{held}")
            for inner, deeper in _references(value) if dataclasses.is_dataclass(value) else []:
                assert deeper is not sched, f"{name}.{held}.{inner} is the scheduler"
                if inspect.ismethod(deeper) and deeper.__self__ is sched:
                    calls.append(f"{name}.{held}.{inner}")
    # the only ways back: the calls the slots make, a kick (the record of parts is one, held by three parts), and
    # the page's figures kept by housekeeping
    assert sorted(calls) == [
        "actions.parts.kick",
        "housekeeping.keep_figures",
        "housekeeping.parts.kick",
        "parts.kick",
        "process.parts.kick",
        "slots.calls.choose",
        "slots.calls.idle",
        "slots.calls.kick",
        "slots.calls.refusal_now",
        "slots.calls.timed_out",
        "sync.kick",
    ], sorted(calls)


def test_the_admission_writes_nothing(tmp_path: Path) -> None:
    """Every question the admission answers leaves the event log, the models' phases and the lease book as they
    were (the refusal's event is the scheduler's to write)."""
    sched = scheduler(tmp_path, model("a", 50) + model("b", 40) + model("c", 30, mode="cold"), FakeSupervisor())
    adm = sched.admission
    before = (len(sched.events.since(0)), {n: m.life.phase for n, m in sched.models.items()}, sched.book.live())
    c = sched.models["c"]
    asked = [
        adm.need_for(c),
        adm.decide_model(c),
        adm.committed(),
        adm.choose(["c"]),
        adm.refusal(c),
        adm.timed_out(c),
        adm.idle_limit(c),
        adm.restore_cost(c),
    ]
    assert len(asked) == 8
    after = (len(sched.events.since(0)), {n: m.life.phase for n, m in sched.models.items()}, sched.book.live())
    assert after == before
