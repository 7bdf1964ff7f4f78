"""The package's layers, read from the source's import statements (ast): the bottom modules import
nothing of umemc above them, the stack language does not import the estimator, the runtime reads
plan.json and never imports the compile-time pipeline; and one registry lists each runtime."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "umemc"


def umemc_imports(path: Path) -> set[str]:
    """The umemc modules a file imports, as dotted names (umemc.x.y), lazy imports included."""
    package = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("umemc"):
                out.add(name)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("umemc"))
    return out


def files(sub: str) -> list[Path]:
    target = PKG / sub
    return [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))


ALLOWED_BELOW = {"umemc.errors", "umemc.records", "umemc.chars", "umemc.units"}
LAYERS = {
    # module or package -> prefixes it must not import
    "catalog": ("umemc.stack", "umemc.estimate", "umemc.budget", "umemc.compile", "umemc.runtime", "umemc.launchers"),
    "policy.py": ("umemc.",),
    "contract.py": ("umemc.stack", "umemc.estimate", "umemc.budget", "umemc.compile", "umemc.runtime"),
    "records.py": ("umemc.",),
    "chars.py": ("umemc.",),
    "stack": ("umemc.estimate", "umemc.budget", "umemc.compile", "umemc.runtime", "umemc.launchers"),
    "runtime": ("umemc.stack", "umemc.estimate", "umemc.budget", "umemc.compile", "umemc.launchers", "umemc.targets"),
}


@pytest.mark.parametrize("sub", LAYERS)
def test_imports_point_down(sub: str) -> None:
    forbidden = LAYERS[sub]
    bad = {
        f"{path.relative_to(PKG)} imports {name}"
        for path in files(sub)
        for name in umemc_imports(path)
        if name not in ALLOWED_BELOW and any(name.startswith(f) for f in forbidden)
    }
    assert not bad, sorted(bad)


def test_every_runtime_has_one_launcher() -> None:
    from umemc.catalog.runtimes import RUNTIMES
    from umemc.launchers import RUNTIMES as LAUNCHERS

    assert list(LAUNCHERS) == list(RUNTIMES)


RUN_DIR_NAMES = re.compile(
    r"""["'](enforcer\.json|gateway\.json|events\.db|supervisor\.sock|supervisord\.pid|pids|cgroups|secrets|"""
    r"""gateway-token|logs|workers|socket|state|\.\./state|[^"']*\.(?:err|out)\.log)["']"""
)


def test_one_owner_of_run_dir_paths() -> None:
    """Every process gets its run-dir paths from runtime.rundir.RunDir (the compiler's two supervisord
    spellings live in contract.py): a path spelled out anywhere else is a second owner that drifts."""
    owners = {PKG / "runtime" / "rundir.py", PKG / "contract.py"}
    spelled = [
        f"{path.relative_to(PKG)}:{n}: {line.strip()}"
        for path in sorted(PKG.rglob("*.py"))
        if path not in owners
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if RUN_DIR_NAMES.search(line) and "/" in line.split("#")[0]
    ]
    assert spelled == []
