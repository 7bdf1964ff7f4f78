"""umemc.runtime.kernel: what the exec wrapper asks of the kernel, against the real cgroup filesystem (skipped where
this process may make no memory cgroup). Membership is read back from /proc/PID/task/TID/cgroup (proc(5))."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from umemc.runtime import kernel

FOUND = kernel.detect(f"umemc-kerneltest-{os.getpid()}")
pytestmark = pytest.mark.skipif(isinstance(FOUND, str), reason=f"no memory cgroup here: {FOUND}")

CHILD = """
import os, sys, threading
sys.path.insert(0, sys.argv[1])
from umemc.runtime import kernel
version, base, threads = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
group = kernel.create(version, base, "w", 64 << 20, 32 << 20)
stop = threading.Event()
for _ in range(threads - 1):
    threading.Thread(target=stop.wait, daemon=True).start()
kernel.enter_self(version, group)
tids = os.listdir("/proc/self/task")
each = {open(f"/proc/self/task/{t}/cgroup").read() for t in tids}
print(len(tids), sorted(each) == [open("/proc/self/cgroup").read()])
print(open("/proc/self/cgroup").read())
stop.set()
"""


@pytest.mark.parametrize("threads", [1, 3])
def test_a_process_enters_its_group_with_all_its_threads(tmp_path: Path, threads: int) -> None:
    """One thread: it moves itself (v1: 0 into `tasks`, without the cgroup-wide lock); more: the whole process
    through `cgroup.procs`. Either way every thread ends in the group, and the limits are the ones asked."""
    assert not isinstance(FOUND, str)
    version, base = FOUND
    root = str(Path(__file__).resolve().parents[2])
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", CHILD, root, str(version), base, str(threads)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        first, *cgroup = done.stdout.splitlines()
        assert first == f"{threads} True"  # that many threads, each in the process's cgroups
        inside = base.split("/sys/fs/cgroup/" + ("memory/" if version == 1 else ""), 1)[1] + "/w"
        wanted = f"memory:/{inside}" if version == 1 else f"0::/{inside}"
        assert any(line.endswith(wanted) for line in cgroup), cgroup
        limit = "memory.limit_in_bytes" if version == 1 else "memory.max"
        assert Path(base, "w", limit).read_text() == f"{64 << 20}\n"
    finally:
        for path in (Path(base, "w"), Path(base)):
            if path.exists():
                path.rmdir()
