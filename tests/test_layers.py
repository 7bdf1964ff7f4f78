"""The package's layers, read from the source's import statements (ast): the bottom modules import
nothing of umemc above them, the stack language does not import the estimator, the runtime reads
plan.json and never imports the compile-time pipeline; and one registry lists each runtime."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "umemc"


def umemc_imports(path: Path) -> set[str]:
    """The umemc modules a file imports, as dotted names (umemc.x.y), lazy imports included; `from . import
    m` names the module m when there is one."""
    package = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
    if path.name == "__init__.py":
        package = ".".join(path.relative_to(PKG.parent).parts[:-1])
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
                out.update(f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in MODULES)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("umemc"))
    return {n for n in out if n in MODULES}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def reachable(path: Path) -> dict[str, str]:
    """Every umemc module importing `path` brings in, directly or through others (a package's __init__
    included), each with the chain that reaches it."""
    seen: dict[str, str] = {}
    todo = [(_module_name(path), _module_name(path))]
    while todo:
        name, chain = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing umemc.a.b runs umemc/__init__ and umemc/a/__init__
            parent = ".".join(parts[:i])
            if parent not in seen and parent in MODULES:
                seen[parent] = f"{chain} -> {parent}"
                todo.append((parent, seen[parent]))
        for dep in umemc_imports(MODULES[name]):
            if dep not in seen:
                seen[dep] = f"{chain} -> {dep}"
                todo.append((dep, seen[dep]))
    return seen


def files(sub: str) -> list[Path]:
    target = PKG / sub
    return [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))


# the stage packages' own __init__ modules hold a docstring and import nothing: reaching one reaches nothing
ALLOWED_BELOW = {
    "umemc",
    "umemc.errors",
    "umemc.records",
    "umemc.chars",
    "umemc.units",
    "umemc.platforms",
    "umemc.budget",
    "umemc.compile",
}
# the compile-time pipeline, in its order; the one eviction policy (umemc.budget.policy) is shared with the runtime
COMPILE_SIDE = (
    "umemc.stack",
    "umemc.estimate",
    "umemc.budget.plan",
    "umemc.budget.advice",
    "umemc.budget.placement",
    "umemc.compile",
)
LAYERS = {
    # module or package -> prefixes it must not reach, directly or through what it imports
    "catalog": (*COMPILE_SIDE, "umemc.runtime"),
    "budget/policy.py": ("umemc.",),
    "records.py": ("umemc.",),
    "names.py": ("umemc.",),
    "document.py": ("umemc.contract", "umemc.lockfile", "umemc.budget.policy", *COMPILE_SIDE, "umemc.runtime"),
    "chars.py": ("umemc.",),
    "platforms.py": (*COMPILE_SIDE, "umemc.runtime", "umemc.catalog", "umemc.commands"),
    "contract.py": (*COMPILE_SIDE, "umemc.runtime", "umemc.lockfile", "umemc.catalog"),
    "lockfile": (*COMPILE_SIDE, "umemc.runtime", "umemc.catalog"),
    # llama.cpp's dry run: the estimator checks a recorded answer with it, the commands run it
    "estimate/dryrun.py": ("umemc.stack", "umemc.estimate.", "umemc.budget.", "umemc.compile", "umemc.runtime",
                           "umemc.catalog", "umemc.commands"),
    "stack": (*COMPILE_SIDE[1:], "umemc.runtime"),
    # advice is a stage above the budget (it re-estimates only a stack that does not fit)
    "budget/plan.py": ("umemc.budget.advice", "umemc.compile", "umemc.targets", "umemc.runtime", "umemc.commands"),
    "budget/placement.py": ("umemc.budget.plan", "umemc.budget.advice", "umemc.estimate", "umemc.stack",
                            "umemc.compile", "umemc.targets", "umemc.runtime", "umemc.commands"),
    "estimate": ("umemc.budget.", "umemc.compile", "umemc.targets", "umemc.runtime"),
    "compile": ("umemc.budget.advice", "umemc.targets", "umemc.commands"),
    "runtime": (*COMPILE_SIDE, "umemc.targets", "umemc.catalog"),
    # the Hub: the loader reads its spellings (ref.py, pure); the commands hand the loader its header reader, and the
    # Hub's reader of bytes is handed what parses them (it parses none itself)
    "hub/ref.py": ("umemc.hub.", "umemc.stack", "umemc.estimate", "umemc.catalog", "umemc.lockfile", "umemc.runtime"),
    "hub": ("umemc.budget.", "umemc.compile", "umemc.targets", "umemc.runtime", "umemc.commands", "umemc.stack",
            "umemc.estimate"),
}  # fmt: skip


@pytest.mark.parametrize("sub", LAYERS)
def test_imports_point_down(sub: str) -> None:
    forbidden = LAYERS[sub]
    bad = {
        chain
        for path in files(sub)
        for name, chain in reachable(path).items()
        if name not in ALLOWED_BELOW and any(name.startswith(f) for f in forbidden)
    }
    assert not bad, sorted(bad)
    assert files(sub) and all(path.exists() for path in files(sub))  # the layer is there to be read


def test_the_package_reads_as_its_pipeline() -> None:
    """`ls umemc/` shows the stages as packages (stack -> estimate -> budget -> compile -> targets -> runtime, with
    the commands, the catalog and the Hub beside them); the modules at the root are the small ones every stage
    shares, and the lock file (its functions, with its documents' types in a module of their own that a stack
    without one never imports). A stage's module belongs in its stage's package."""
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert {"stack", "estimate", "budget", "compile", "targets", "runtime", "lockfile"} <= packages
    loose = {p.stem for p in PKG.glob("*.py")}
    assert loose == {
        "__init__", "__main__", "cache", "chars", "cli", "contract", "document", "errors", "helptext", "names",
        "platforms", "records", "units", "worker", "write",
    }  # fmt: skip
    for stage in ("budget", "compile"):
        init = PKG / stage / "__init__.py"
        assert not umemc_imports(init), f"{init} imports: reaching the package must reach nothing"


def test_a_module_name_says_its_place() -> None:
    """No two modules of the package share a name (a stack trace, a grep, an import line says which one), but a
    command's module, named after the command it runs (`umemc events` is umemc/commands/events.py), and the packages'
    own __init__/__main__."""
    seen: dict[str, list[str]] = {}
    for path in PKG.rglob("*.py"):
        if path.stem not in ("__init__", "__main__") and path.parent.name != "commands":
            seen.setdefault(path.stem, []).append(str(path.relative_to(PKG)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
    assert len(seen) > 150  # the rule reads the whole package


def test_the_layer_check_sees_through_imports() -> None:
    """The check follows imports: the stack loader reaches the lock file and the document base below it, and not
    the runtime's contract."""
    chains = reachable(PKG / "stack" / "resolve.py")
    assert chains["umemc.document"] == "umemc.stack.resolve -> umemc.lockfile -> umemc.document"
    assert "umemc.contract" not in chains


def test_every_runtime_has_one_launcher() -> None:
    from umemc.catalog.runtimes import RUNTIMES
    from umemc.compile.launchers import RUNTIMES as LAUNCHERS

    assert list(LAUNCHERS) == list(RUNTIMES)


RUN_DIR_NAMES = frozenset({
    "plan.json", "supervisord.conf", "enforcer.json", "gateway.json", "events.db", "supervisor.sock",
    "supervisord.pid", "supervisord.log", "pids", "cgroups", "secrets", "gateway-token", "logs", "workers",
    "state", "bundle", "slots", "access.log",
})  # fmt: skip


def _path_parts(node: ast.AST) -> list[tuple[int, str]]:
    """The strings a piece of code builds a path of: either side of `/` (pathlib) and the arguments of
    joinpath/os.path.join/Path(...)/with_name (each split at '/'). Prose and URLs are not paths."""
    found: list[tuple[int, str]] = []
    for n in ast.walk(node):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            for side in (n.left, n.right):
                if isinstance(side, ast.Constant) and isinstance(side.value, str):
                    found += [(side.lineno, p) for p in side.value.split("/")]
        elif isinstance(n, ast.Call):
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if name in ("joinpath", "join", "Path", "PurePosixPath", "with_name"):
                found += [
                    (a.lineno, p)
                    for a in n.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)
                    for p in a.value.split("/")
                ]
    return found


def test_one_owner_of_run_dir_paths() -> None:
    """Every process gets its run-dir and bundle paths from runtime.rundir.RunDir (the file names in a bundle and
    the compiler's supervisord spellings live in names.py): a path made of one of those names anywhere else
    is a second owner that drifts. Read from the code's syntax tree, not its lines."""
    owners = {PKG / "runtime" / "rundir.py", PKG / "names.py"}
    spelled = sorted(
        f"{path.relative_to(PKG)}:{line}: {part!r}"
        for path in PKG.rglob("*.py")
        if path not in owners
        for line, part in _path_parts(ast.parse(path.read_text()))
        if part in RUN_DIR_NAMES or part.endswith((".err.log", ".out.log"))
    )
    assert spelled == []
    # the reading finds those names where they are spelled: in the owners
    assert {"gateway.json", "supervisord.pid"} <= {
        p for owner in owners for _, p in _path_parts(ast.parse(owner.read_text()))
    }


def test_the_runtime_is_composed_of_parts_that_own_their_state() -> None:
    """The gateway scheduler and the enforcer are made of objects (no mixins over a base of stubs), and a
    name for a set of states is defined once."""
    from umemc.runtime.enforcer.loop import Enforcer
    from umemc.runtime.enforcer.pressure import PressureGuard
    from umemc.runtime.enforcer.sampler import Sampler
    from umemc.runtime.enforcer.status_file import StatusWriter
    from umemc.runtime.gateway.lease_book import LeaseBook
    from umemc.runtime.gateway.scheduler import Scheduler
    from umemc.runtime.gateway.slots import Slots
    from umemc.runtime.gateway.sync import StateSync

    for cls in (Scheduler, Slots, LeaseBook, StateSync, Enforcer, Sampler, PressureGuard, StatusWriter):
        assert cls.__bases__ == (object,), cls
    defined = sorted(
        f"{path.relative_to(PKG)}: {m.group(1)}"
        for path in sorted(PKG.rglob("*.py"))
        for line in path.read_text().splitlines()
        if (m := re.match(r"^(SERVING|LIVE|ANSWERING)\s*=", line))
    )
    assert defined == [
        "runtime/gateway/lifecycle.py: SERVING",
        "runtime/supervisor.py: ANSWERING",
        "runtime/supervisor.py: LIVE",
    ]


# The gateway's state and its one writer each (umemc/runtime/gateway/model.py says which field is whose).
GATEWAY_OWNERS = {
    "slots.py": {"in_flight", "waiters", "last_used", "drain_since", "drained", "latency_ewma"},
    "sync.py": {"state", "usage", "given_up", "restarts", "health_failures"},
    "process.py": {
        "starting",
        "evicted",
        "failure",
        "draining_for",
        "saved_slots",
        "cold_starts",
        "last_cold_start_s",
        "keep_alive_s",
        "victims",
        "log_mark",
    },
    "traffic.py": {"tokens_in", "tokens_out", "prompt_speed", "speed"},
}
HOLDERS = {"m", "model", "victim", "q", "queue", "traffic"}  # how the gateway's code names a model, a queue


def test_each_piece_of_gateway_state_has_one_writer() -> None:
    """Read from the syntax tree: every assignment to `m.FIELD` (a model, a queue, its traffic) of a field in
    GATEWAY_OWNERS is in that field's owner module (the lifecycle, `life`, is shared: its table guards it)."""
    owner_of = {field: module for module, fields in GATEWAY_OWNERS.items() for field in fields}
    wrong, owned = [], set()
    for path in sorted((PKG / "runtime" / "gateway").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                continue
            for target in targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                for t in elements:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id in HOLDERS
                        and t.attr in owner_of
                        and owner_of[t.attr] != path.name
                    ):
                        wrong.append(f"{path.name}:{node.lineno}: {t.value.id}.{t.attr} (owned by {owner_of[t.attr]})")
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in HOLDERS:
                        owned.add(t.attr)
    assert wrong == []
    assert len(owned & owner_of.keys()) >= len(owner_of) // 2, sorted(owned)  # it finds the owners' own writes


def test_the_exec_wrapper_loads_no_third_party_module() -> None:
    """The wrapper runs before every worker (a cold start waits for it): what it imports is the standard library
    and umemc's bottom modules, not pydantic (60 ms of a cold start when the run dir's names came from
    contract.py), nor `dataclasses` (with `inspect` under it, a third of the wrapper's start), nor `argparse`
    (with its help formatter, a fifth of the rest: a bundle's argv is read without it). On Linux, what it does
    before the exec needs no `typing`, `pathlib`, `re`, `enum` or `hashlib` either: those were two thirds of its
    imports (its records, cgroup files and run mark are on path strings: umemc.records, umemc.runtime.kernel)."""
    heavy = "print(sorted(m for m in ('typing', 'pathlib', 're', 'enum', 'hashlib') if m in sys.modules))\n"
    state = tempfile.mkdtemp()
    code = (
        "import os, sys\nsys.path.insert(0, sys.argv[1])\nbefore = set(sys.modules)\n"
        "import umemc.runtime.wrap as w\n"
        # the whole way to the exec, as a bundle's worker goes (a gate to pass included), then the modules it loaded
        f"os.execvp = lambda *a: {heavy.strip()}\n"
        f"os.makedirs({state!r} + '/gates')\n"
        f"open({state!r} + '/gates/m', 'w').write('until 1\\n0 1 gone\\n')\n"
        "w.main(['--stack', 's', '--model', 'm', '--hard', '0', '--soft', '0', '--cgroup', 'off', '--state', "
        f"{state!r}, '--', 'true'])\n"
        "import umemc.runtime.cgroups, umemc.runtime.reaper\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'umemc'}))\n"
        "print(sorted(m for m in ('dataclasses', 'inspect', 'argparse') if m in sys.modules))"
    )
    root = str(Path(__file__).resolve().parents[1])  # as the wrapper runs: -I -S, umemc found from its own path
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", code, root], capture_output=True, text=True, check=True)
    finally:
        shutil.rmtree(state)
    assert out.stdout.splitlines() == ["[]", "[]", "[]"], out.stderr


def test_the_exec_wrapper_starts_without_the_site_step() -> None:
    """Every program's command is `python -I -S umemc/runtime/wrap_entry.py ...`: the entry finds umemc from its own
    path (no site-packages, no editable install's hook on sys.path), and where psutil is wanted (macOS's process
    table) the site step runs first."""
    from umemc.names import WRAP_ENTRY

    done = subprocess.run([sys.executable, "-I", "-S", WRAP_ENTRY, "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: umemc-wrap [-h] --stack STACK --model MODEL --hard HARD --soft SOFT\n")
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "try:\n    import psutil\nexcept ImportError:\n    print('no psutil without site')\n"
        "from umemc.runtime.probes.host import site_packages\nsite_packages()\nimport psutil\nprint('psutil after it')"
    )
    repo = str(Path(WRAP_ENTRY).parents[2])
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, repo], capture_output=True, text=True)
    assert done.stdout.splitlines() == ["no psutil without site", "psutil after it"], done.stderr


def wrapper_lines() -> list[list[str]]:
    """The wrapper's argv in every golden supervisord.conf (what bundles really write), after wrap_entry.py."""
    out = []
    for conf in sorted((Path(__file__).parent / "golden").glob("*/supervisord.conf")):
        for line in conf.read_text().splitlines():
            if line.startswith("command=") and "wrap_entry.py" in line:
                out.append(shlex.split(line.partition("wrap_entry.py")[2]))
    return out


def test_the_wrappers_quick_reading_agrees_with_argparse() -> None:
    """The wrapper reads a bundle's argv without argparse (a fifth of its start); argparse, which it still uses
    for --help and errors, is the reference: same options for every argv the golden bundles write and for the
    flags they do not, and anything unusual is left to argparse (None)."""
    from umemc.runtime.wrap import parse as by_argparse
    from umemc.runtime.wrap import quick_parse

    lines = wrapper_lines()
    assert len(lines) >= 20
    extra = ["--daemon", "--reaper", "--outlive-parent", "--unset", "A", "--unset", "B", "--cgroup", "off"]
    for argv in [*lines, *[extra + a for a in lines[:3]], ["--hard", "-1", *lines[0]]]:
        assert quick_parse(argv) == by_argparse(argv), argv
    base = ["--stack", "s", "--model", "m", "--hard", "1", "--soft", "1", "--state", "d"]
    odd = [
        ["--help"],
        ["--stack=s", *base[2:], "--", "true"],  # --opt=value
        ["--mod", "m", *base[:2], *base[4:], "--", "true"],  # an abbreviation
        [*base, "true"],  # no --
        [*base, "--"],  # no command
        [*base[:-2], "--", "true"],  # --state missing
        [*base[:5], "x", *base[6:], "--", "true"],  # --hard x
        [*base, "--cgroup", "maybe", "--", "true"],
        [*base[:-1], "-d", "--", "true"],  # a value that looks like an option
        [*base, "--model"],
    ]
    for argv in odd:
        assert quick_parse(argv) is None, argv


def test_no_record_mixes_namedtuple_and_dataclass_spellings() -> None:
    """The check path's immutable records are NamedTuples (a class builds in a quarter of a frozen dataclass's
    time). A `field(...)` left in one when a dataclass is turned into a NamedTuple is not a default there but a
    dataclasses.Field object stored as the value, and `dataclasses.replace`/`asdict` on one fails at run time
    (mypy finds those; this finds the first)."""
    mixed = sorted(
        f"{path.relative_to(PKG)}:{st.lineno}: {node.name}.{st.target.id}"
        for path in PKG.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "NamedTuple" for b in node.bases)
        for st in node.body
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
        and isinstance(st.value, ast.Call) and getattr(st.value.func, "id", None) == "field"
    )  # fmt: skip
    assert mixed == []
    named = [
        node.name
        for path in PKG.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "NamedTuple" for b in node.bases)
    ]
    assert "PidRecord" in named and len(named) > 10  # the records the rule reads are found
