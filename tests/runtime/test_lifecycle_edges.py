"""The lifecycle tables held to what the in-process tests really do: every transition the gateway's table allows
(gateway/lifecycle.py) is made by some test of the scheduler against its fake supervisord, and every transition of
the enforcer's worker table (enforcer/worker_state.py) by some test of its loop against fakes — so a table can
neither keep an edge nothing takes (dead, untested) nor lose one the code takes (each `to` refuses a move the table
does not list). Each module's tests are run here again, in milliseconds, with every move recorded."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from tests.runtime import test_enforcer_loop, test_scheduler
from umemc.runtime.enforcer import worker_state
from umemc.runtime.gateway import lifecycle


def _moves(monkeypatch: pytest.MonkeyPatch, cls: type) -> set[tuple[str, str]]:
    """Every change of phase made through `cls.to` from now on, as (from, to)."""
    seen: set[tuple[str, str]] = set()
    made: Callable[..., None] = cls.to  # type: ignore[attr-defined]

    def to(self: Any, phase: Any, *args: Any, **kwargs: Any) -> None:
        was = self.phase
        made(self, phase, *args, **kwargs)
        if phase is not was:
            seen.add((was.value, phase.value))

    monkeypatch.setattr(cls, "to", to)
    return seen


def _run_tests(module: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> int:
    """Every test function of `module`, each parametrized case once, on fresh temporary directories."""
    ran = 0
    for name, fn in inspect.getmembers(module, inspect.isfunction):
        if not name.startswith("test_") or fn.__module__ != module.__name__:
            continue
        cases: list[dict[str, Any]] = [{}]
        for mark in getattr(fn, "pytestmark", []):
            if mark.name == "parametrize":
                argname, values = mark.args[0], mark.args[1]
                cases = [case | {argname: value} for case in cases for value in values]
        for case in cases:
            with pytest.MonkeyPatch.context() as mp:
                given = {"tmp_path": tmp_path_factory.mktemp(name[:40]), "monkeypatch": mp}
                fn(**{p: case.get(p, given.get(p)) for p in inspect.signature(fn).parameters})
            ran += 1
    return ran


def _edges(table: dict[Any, frozenset[Any]]) -> set[tuple[str, str]]:
    return {(a.value, b.value) for a, targets in table.items() for b in targets}


@pytest.mark.parametrize(
    "machine,table,tests,at_least",
    [
        (lifecycle.Lifecycle, lifecycle.TRANSITIONS, test_scheduler, 20),
        (worker_state.Worker, worker_state.TRANSITIONS, test_enforcer_loop, 8),
    ],
    ids=["the gateway's model by the scheduler's tests", "the enforcer's worker by its loop's tests"],
)
def test_every_transition_of_the_table_is_taken_by_a_test(
    machine: type,
    table: dict[Any, frozenset[Any]],
    tests: ModuleType,
    at_least: int,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    seen = _moves(monkeypatch, machine)
    assert _run_tests(tests, tmp_path_factory) >= at_least
    allowed = _edges(table)
    assert (sorted(allowed - seen), sorted(seen - allowed)) == ([], [])
