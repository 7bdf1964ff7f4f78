"""The coverage ratchet (tests/coverage_floors.py) on reports written here: each file counts in its package (the
runtime's subpackages apart), a package below its floor fails naming it, and --ratchet raises floors, never lowers
one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import coverage_floors


def report(files: dict[str, tuple[int, int]]) -> dict[str, object]:
    """coverage.py's JSON report's shape (its `files.*.summary` counts), for these files' (covered, all) branches."""
    return {
        "files": {
            path: {"summary": {"covered_branches": covered, "num_branches": total}}
            for path, (covered, total) in files.items()
        }
    }


def test_each_file_counts_in_its_package() -> None:
    got = coverage_floors.by_package(
        report(
            {
                "umemc/cli.py": (3, 4),
                "umemc/errors.py": (1, 2),
                "umemc/budget/plan.py": (9, 10),
                "umemc/runtime/gateway/slots.py": (5, 10),
                "umemc/runtime/event_log.py": (2, 2),
                "/abs/checkout/umemc/stack/resolve.py": (7, 7),
            }
        )
    )
    assert got == {
        "umemc": (4, 6),
        "umemc/budget": (9, 10),
        "umemc/runtime/gateway": (5, 10),
        "umemc/runtime": (2, 2),
        "umemc/stack": (7, 7),
    }


def test_a_package_below_its_floor_fails_and_the_ratchet_only_rises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    floors = tmp_path / "floors.json"
    floors.write_text(json.dumps({"umemc/budget": 80.0, "umemc/stack": 50.0}))
    monkeypatch.setattr(coverage_floors, "FLOORS", floors)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report({"umemc/budget/plan.py": (7, 10), "umemc/stack/load.py": (9, 10)})))
    assert coverage_floors.main([str(path)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "  umemc/budget: 70.0% of its branches, below its floor 80.0%"
    assert coverage_floors.main([str(path), "--ratchet"]) == 1  # still a failure: the floor is not lowered
    assert json.loads(floors.read_text()) == {"umemc/budget": 80.0, "umemc/stack": 90.0}
    path.write_text(json.dumps(report({"umemc/budget/plan.py": (8, 10), "umemc/stack/load.py": (9, 10)})))
    assert coverage_floors.main([str(path)]) == 0


def test_a_run_without_every_lane_set_up_holds_no_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tests skip where a set-up is missing (the engines, the real models): what such a run reaches is no regression,
    and it raises no floor."""
    floors = tmp_path / "floors.json"
    floors.write_text(json.dumps({"umemc/budget": 80.0}))
    monkeypatch.setattr(coverage_floors, "FLOORS", floors)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report({"umemc/budget/plan.py": (5, 10), "umemc/stack/load.py": (9, 10)})))
    assert coverage_floors.main([str(path), "--ratchet", "--missing", "setup-vllm,setup-mlx"]) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert (
        said == "floors not held: the fast lane ran without setup-vllm,setup-mlx (python3 dev.py test-all sets them up)"
    )
    assert json.loads(floors.read_text()) == {"umemc/budget": 80.0}
