"""Branch coverage per package, held to a floor that only rises (as the complexity ceiling in pyproject.toml only
falls): `python3 dev.py coverage` runs the fast lane under coverage.py (branches measured) and then this script over
its JSON report. A package whose branch coverage fell below its floor fails the run, naming it; `--ratchet` raises
each floor to what was measured (never lowers one), to be committed with the tests that raised it.

The packages are umemc's subpackages, the runtime's own subpackages apart (the runtime is a third of the code), and
umemc's top-level modules together. What the fast lane reaches is measured in this process and its xdist workers;
code that runs only in processes a test starts (the gateway and the enforcer under supervisord) is not, which is
why those tests are the slow lane's and why the floors are what they are.

    python tests/coverage_floors.py REPORT.json [--ratchet] [--missing SETUPS]

`--missing` (dev.py passes it where a set-up is absent): the figures are printed, no floor is held or raised.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FLOORS = Path(__file__).resolve().parent / "coverage_floors.json"
SPLIT = ("umemc/runtime/",)  # packages whose subpackages count apart
TOLERANCE = 0.5  # percentage points: the few branches taken only at some timings (a busy machine) are no regression


def package_of(path: str) -> str:
    """The package a file counts in: umemc/X, or umemc/runtime/X for the runtime's subpackages."""
    parts = Path(path).as_posix().split("/")
    at = parts.index("umemc")
    parts = parts[at:]
    if len(parts) == 2:
        return "umemc"  # a top-level module
    for split in SPLIT:
        depth = split.count("/")
        if "/".join(parts[:depth]) + "/" == split and len(parts) > depth + 1:
            return "/".join(parts[: depth + 1])
    return "/".join(parts[:2])


def by_package(report: dict[str, object]) -> dict[str, tuple[int, int]]:
    """(covered branches, branches) per package, from coverage.py's JSON report."""
    out: dict[str, tuple[int, int]] = {}
    files = report["files"]
    assert isinstance(files, dict)
    for path, data in files.items():
        summary = data["summary"]
        covered, total = out.get(package_of(path), (0, 0))
        out[package_of(path)] = (covered + summary["covered_branches"], total + summary["num_branches"])
    return out


def percent(covered: int, total: int) -> float:
    return round(100.0 * covered / total, 1) if total else 100.0


def main(argv: list[str]) -> int:
    report = json.loads(Path(argv[0]).read_text())
    measured = {pkg: percent(*ct) for pkg, ct in sorted(by_package(report).items())}
    floors: dict[str, float] = json.loads(FLOORS.read_text()) if FLOORS.exists() else {}
    fell = [
        f"{pkg}: {value:.1f}% of its branches, below its floor {floors[pkg]:.1f}%"
        for pkg, value in measured.items()
        if pkg in floors and value + TOLERANCE < floors[pkg]
    ]
    width = max(len(p) for p in measured)
    for pkg, value in measured.items():
        floor = floors.get(pkg)
        print(f"{pkg:<{width}}  {value:5.1f}%" + ("" if floor is None else f"  (floor {floor:.1f}%)"))
    if "--ratchet" in argv and "--missing" not in argv:
        raised = {pkg: max(value, floors.get(pkg, 0.0)) for pkg, value in measured.items()}
        FLOORS.write_text(json.dumps(raised, indent=2, sort_keys=True) + "\n")
        print(f"floors written to {FLOORS}")
    missing = argv[argv.index("--missing") + 1] if "--missing" in argv else ""
    if fell and missing:  # the floors hold a run with every lane set up; this one lacked some
        print(f"floors not held: the fast lane ran without {missing} (python3 dev.py test-all sets them up)")
        return 0
    if fell:
        print("branch coverage fell (a package's floor only rises: test what the change added):", *fell, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
