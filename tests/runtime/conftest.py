"""Real stacks under real supervisord: write a stack of command workers, `umemc up` it, and
always `umemc down` it afterwards, checking that no process and no cgroup is left."""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from tests.conftest import patience
from umemc.cli import main
from umemc.runtime.preflight import read_sysctl

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
WORKERS = REPO / "tests" / "workers"
PY = sys.executable
SYSCTL_KEYS = (
    "vm.swappiness",
    "vm.overcommit_memory",
    "vm.vfs_cache_pressure",
    "vm.min_free_kbytes",
    "vm.watermark_scale_factor",
    "vm.max_map_count",
)


def live_sysctl_table(**override: int) -> str:
    """A [sysctl] table equal to this machine's live values, so the preflight passes here."""
    lines = ["[sysctl]"]
    for key in SYSCTL_KEYS:
        value = override.get(key.replace(".", "_"), read_sysctl(key))
        lines.append(f'"{key}" = {value}')
    return "\n".join(lines) + "\n"


def start_of(pid: int) -> int:
    """A process's start time: field 22 of /proc/PID/stat (proc(5)), after the command's parenthesis."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _port_range() -> range:
    """Ports this test process hands out: below the kernel's ephemeral range (where a server binding port 0, another
    test's llama-server or client, gets its port), a share of its own for each xdist worker."""
    low = 20000
    try:
        low = min(low, int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) - 4000)
    except (OSError, ValueError, IndexError):
        pass
    workers, me = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    share = 4000 // max(1, workers)
    start = low + share * int(me.removeprefix("gw") or 0) % 4000
    return range(start, start + share)


_PORTS = itertools.cycle(_port_range())


def free_port() -> int:
    """A port free now, and one this process has not handed out lately: a cold model's port is only bound when it
    starts, seconds later, so a port taken from the kernel's ephemeral range (bind to 0) could meanwhile be given
    to any other test's server."""
    for port in itertools.islice(_PORTS, 4000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


# umemc's own processes beside a stack's workers (the standby enforcer is a program of its own only in a stack
# without a gateway; with one, it is a thread of the gateway's process)
OWN = ("umemc-supervisord", "umemc-enforcer", "umemc-enforcer-standby", "umemc-gateway")


def own_pids(run_dir: Path) -> dict[str, int]:
    """Their pids, from the run's records (supervisord's pidfile, the exec wrapper's state/pids/NAME), for those of
    them the stack runs."""
    state = run_dir / "state"
    pids = {OWN[0]: int((state / "supervisord.pid").read_text().split()[0])}
    recorded = [name for name in OWN[1:] if (state / "pids" / name).exists()]
    pids.update({name: int((state / "pids" / name).read_text().split()[0]) for name in recorded})
    return pids


def worker(
    name: str, script: str, *args: object, memory: str, priority: int = 50, mode: str = "hot", port: int | None = None
) -> str:
    argv = [PY, str(WORKERS / script), *[str(a) for a in args]]
    text = (
        f'\n[models.{name}]\nruntime = "command"\ncommand = {json.dumps(argv)}\nmemory = "{memory}"\n'
        f'priority = {priority}\nmode = "{mode}"\n'
    )
    return text + (f"port = {port}\n" if port else "")


def wait_for(predicate: Callable[[], T], timeout: float = 30, what: str = "condition", every: float = 0.05) -> T:
    """Until predicate() is truthy (its value); `timeout` is an idle machine's bound, scaled by
    tests.conftest.patience."""
    timeout = patience(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Running:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def cli(self, *args: str) -> int:
        return main([*args, "--run-dir", str(self.run_dir)])

    def status(self) -> dict:
        from umemc.commands.status import collect

        return collect(str(self.run_dir))["models"]

    def events(self, kind: str | None = None, model: str | None = None) -> list[dict]:
        from umemc.runtime.event_log import EventLog

        log = EventLog(self.run_dir / "state" / "events.db")
        try:
            out = [e.as_json() for e in log.since(0)]
        finally:
            log.close()
        return [e for e in out if (kind is None or e["kind"] == kind) and (model is None or e["model"] == model)]

    def wait_for(self, predicate: Callable[[], object], timeout: float = 30, what: str = "condition") -> object:
        return wait_for(predicate, timeout, what)

    def log_lines(self, name: str) -> list[str]:
        path = self.run_dir / "state" / "logs" / f"{name}.out.log"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def up(text: str, *flags: str, expect: int = 0) -> Running:
        r = bring_up(tmp_path, text, *flags, expect=expect)
        started.append(r)
        return r

    yield up
    for r in started:
        bring_down(r)


def bring_up(where: Path, text: str, *flags: str, expect: int = 0) -> Running:
    """`umemc up` a stack written to WHERE/stack.toml (run dir WHERE/run). A stack without a
    [gateway] table gets one on a free port (the default 10000 may be taken on this machine)."""
    if "[gateway]" not in text:
        text += f"\n[gateway]\nport = {free_port()}\n"
    path = where / "stack.toml"
    path.write_text(text)
    r = Running(where / "run")
    code = main(["up", str(path), "--run-dir", str(r.run_dir), "--timeout", str(patience(60)), *flags])
    if code != expect:
        bring_down(r)
    assert code == expect
    if code == 0:
        settled(r)
    return r


def settled(r: Running) -> None:
    """Until every hot worker is past supervisord's startsecs (RUNNING): `up` returns once they answer their health,
    maybe still STARTING, and what the tests look at next (restarts, a kill, an eviction) is about running workers."""
    hot = [n for n, m in r.status().items() if m["_mode"] == "hot" and m["state"] == "STARTING"]
    if hot:
        r.wait_for(lambda: all(r.status()[n]["state"] != "STARTING" for n in hot), timeout=30, what=f"{hot} running")


def bring_down(r: Running) -> None:
    """`umemc down`, then check by PID that nothing of the stack, and none of its cgroups, is left."""
    pids = {p.pid for p in psutil.process_iter() if _ours(p, r.run_dir)}
    if (r.run_dir / "bundle" / "plan.json").exists():
        for m in r.status().values():
            if m["pid"]:
                pids.add(m["pid"])
                pids.update(c.pid for c in _children(m["pid"]))
    assert main(["down", "--run-dir", str(r.run_dir)]) == 0
    left = [p for p in pids if _alive(p)] + [p.pid for p in psutil.process_iter() if _ours(p, r.run_dir)]
    assert not left, f"processes left after down: {[(p, _said(p)) for p in sorted(set(left))]}"
    assert not list((r.run_dir / "state").glob("cgroups/*")), "cgroup records left"
    assert not list((r.run_dir / "state").glob("pids/*")), "process records left"
    assert not _cgroups_left(r.run_dir), "cgroups left after down"


def _said(pid: int) -> str:
    """A process as a person finds it: its state and command line."""
    try:
        p = psutil.Process(pid)
        return f"{p.status()}: {' '.join(p.cmdline())}"
    except psutil.Error:
        return "gone"


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ours(p: psutil.Process, run_dir: Path) -> bool:
    try:
        return str(run_dir) in " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _cgroups_left(run_dir: Path) -> list[Path]:
    """Any group named after this run (umemc-*-<run id>) below the cgroup the tests run in."""
    from umemc.runtime.cgroups import detect
    from umemc.runtime.rundir import run_mark

    backend, _ = detect("probe")
    if backend is None:
        return []
    return sorted(backend.base.parent.glob(f"umemc-*-{run_mark(run_dir / 'state')}"))
