"""What umemc's own processes load beside a running stack (`umemc up`, a real supervisord): the runtime builds no
pydantic model (its documents are msgspec structs), the processes that never speak TLS (supervisord, the enforcer,
its standby) never load OpenSSL. Read from each process's memory map, /proc/PID/maps: a shared library
is there once it is loaded."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.runtime.conftest import free_port, own_pids, worker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/maps: Linux"),
]


def loaded(pid: int) -> set[str]:
    """The file names of the shared objects mapped into the process (e.g. `_ssl.cpython-311-x86_64-linux-gnu.so`)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[-1].rsplit("/", 1)[-1] for line in lines if ".so" in line.split()[-1]}


def kinds(names: set[str]) -> set[str]:
    """Which of the libraries that matter here a process has loaded."""
    wanted = {"_ssl.": "ssl", "pydantic_core": "pydantic", "_core.cpython": "msgspec", "_psutil_linux": "psutil"}
    return {kind for name in names for part, kind in wanted.items() if part in name}


def test_the_runtime_loads_no_pydantic_and_its_local_processes_no_openssl(stack) -> None:
    """A stack with a gateway runs no standby program: the standby is a thread of the gateway's process, waiting
    with the enforcer's imports done (the gateway's own imports are most of them): its takeover is the lock's
    release, not an import, and it loads nothing the gateway had not."""
    r = stack(
        'version = 1\nname = "own"\n[platform]\nkind = "cpu"\nmemory = "4GiB"\nos_reserve = "1GiB"\n'
        + worker("w", "steady.py", port := free_port(), 16, memory="64MiB", port=port)
    )
    pids = own_pids(r.run_dir)
    r.wait_for(lambda: r.events("enforcer_start"), what="the enforcer's start")
    found = {name: kinds(loaded(pid)) for name, pid in pids.items()}
    assert found == {
        "umemc-supervisord": set(),
        "umemc-enforcer": {"msgspec", "psutil"},
        "umemc-gateway": {"msgspec", "psutil", "ssl"},  # uvloop and asyncio import ssl themselves
    }
    before = loaded(pids["umemc-gateway"])
    os.kill(pids["umemc-enforcer"], signal.SIGKILL)
    took = r.wait_for(lambda: r.events("enforcer_start")[1:], what="the standby to take over")
    assert [e["detail"]["pid"] for e in took] == [pids["umemc-gateway"]]
    assert loaded(pids["umemc-gateway"]) == before
