"""What the exec wrapper asks of the kernel before it execs a worker, on path strings and with nothing imported but
os and sys (a cold start waits for the wrapper; `typing` or `pathlib` alone would double its imports): the
parent-death signal, the memory cgroup files (where a run's groups go, a program's group with its limits, moving a
process in), a process's exit. umemc.runtime.cgroups builds the typed groups, the sweep and the readings on these
(its docstring says what each cgroup file means on v1 and v2); the reaper waits for supervisord with wait_exit.

Where the interfaces come from: prctl(2) (PR_SET_PDEATHSIG); the kernel's cgroup v2 interface
(Documentation/admin-guide/cgroup-v2.rst: cgroup.procs, cgroup.controllers, cgroup.subtree_control,
memory.max/high/oom.group/swap.max) and cgroup v1's memory controller (Documentation/admin-guide/cgroup-v1/memory.rst:
memory.limit_in_bytes, memory.soft_limit_in_bytes, memory.memsw.limit_in_bytes); /proc/self/cgroup and
/proc/self/mountinfo as proc(5) describes them; pidfd_open(2), and kqueue(2)'s EVFILT_PROC NOTE_EXIT on macOS."""

from __future__ import annotations

import os
import sys

from ..names import run_mark

CGROUP_ROOT = "/sys/fs/cgroup"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
SIGKILL = 9  # the signal module would import enum: a fifth of the wrapper's imports
POLL_S = 0.01  # waiting for a process's exit where neither kqueue nor pidfd exists
PARENT_DEATH_ENV = "UMEMC_PARENT_DEATH"  # "reaper": no parent-death signal even on Linux (tests of the macOS path)
RUN_PREFIX = "umemc-"  # a run's groups: umemc-<stack>-<run id>/<program>


def group_name(stack: str, state: str | os.PathLike[str]) -> str:
    """A run's base group: umemc-<stack>-<run id>."""
    return f"{RUN_PREFIX}{stack}-{run_mark(state)}"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _run_group(part: str) -> bool:
    """umemc-<stack>-<run id> (8 hex digits): a run's base group."""
    tail = part[-9:]
    return part.startswith(RUN_PREFIX) and tail[:1] == "-" and all(c in "0123456789abcdef" for c in tail[1:])


def own_cgroup(version: int, proc_self: str = "/proc/self/cgroup") -> str | None:
    """The cgroup this process runs in; a process already inside a umemc run's group (a worker
    spawned by supervisord, which sits in the run's `umemc-supervisord` group) gets the cgroup that
    run was created in, so every group of a run is a sibling below one base, never nested."""
    for line in _read(proc_self).splitlines():
        hid, controllers, path = line.split(":", 2)
        if (version == 2 and hid == "0" and controllers == "") or (version == 1 and "memory" in controllers.split(",")):
            parts = path.split("/")
            inside = [i for i, part in enumerate(parts) if _run_group(part)]
            return "/".join(parts[: inside[0]]) or "/" if inside else path
    return None


def v2_mount(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    for line in _read(mountinfo).splitlines():
        parts = line.split(" - ")
        if len(parts) == 2 and parts[1].split()[0] == "cgroup2":
            return parts[0].split()[4]
    return None


def detect(name: str) -> tuple[int, str] | str:
    """(cgroup version, the base group NAME below the cgroup this process runs in) where this process may make
    memory groups there; else why not."""
    if not sys.platform.startswith("linux"):
        return f"{'macOS' if sys.platform == 'darwin' else sys.platform} has no memory cgroups"
    v2_reason = "cgroup v2 is not mounted"
    mount = v2_mount()
    if mount is not None:
        parent = os.path.join(mount, (own_cgroup(2) or "/").lstrip("/")).rstrip("/")
        try:
            controllers = _read(os.path.join(parent, "cgroup.controllers")).split()
        except FileNotFoundError:
            controllers = []
        if "memory" not in controllers:
            v2_reason = f"cgroup v2 at {parent} has no memory controller"
        elif not os.access(parent, os.W_OK):
            v2_reason = f"cgroup v2 at {parent} is not writable (not delegated)"
        else:
            subtree = os.path.join(parent, "cgroup.subtree_control")
            try:
                if "memory" not in _read(subtree).split():
                    _write(subtree, "+memory")
                return 2, os.path.join(parent, name)
            except OSError as exc:
                v2_reason = f"cgroup v2 at {parent}: cannot enable the memory controller for children ({exc.strerror})"
    v1_root = os.path.join(CGROUP_ROOT, "memory")
    if os.path.exists(os.path.join(v1_root, "memory.limit_in_bytes")) or os.path.exists(
        os.path.join(v1_root, "cgroup.procs")
    ):
        parent = os.path.join(v1_root, (own_cgroup(1) or "/").lstrip("/")).rstrip("/")
        if os.access(parent, os.W_OK):
            return 1, os.path.join(parent, name)
        return f"{v2_reason}; cgroup v1 memory controller at {parent} is not writable"
    return v2_reason


def create(version: int, base: str, program: str, hard: int, soft: int) -> str:
    """The program's group below the run's base (both made where missing), its limits set; its path."""
    try:
        os.mkdir(base)
    except FileExistsError:
        pass
    if version == 2:
        try:
            _write(os.path.join(base, "cgroup.subtree_control"), "+memory")
        except OSError:
            pass
    path = os.path.join(base, program)
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    if hard:  # 0: no limit (supervisord and the enforcer: grouped to be found, never to be killed)
        set_limits(version, path, hard, soft)
    return path


def _try_write(path: str, text: str) -> None:
    """A file some kernels or setups lack (no swap accounting, an old kernel): set where it exists."""
    try:
        _write(path, text)
    except OSError:
        pass


def set_limits(version: int, path: str, hard: int, soft: int) -> None:
    if version == 2:
        _write(os.path.join(path, "memory.max"), str(hard))
        _write(os.path.join(path, "memory.high"), str(max(soft, 1)))
        _try_write(os.path.join(path, "memory.oom.group"), "1")
        _try_write(os.path.join(path, "memory.swap.max"), "0")
        return
    # v1 wants memsw >= limit at every step: raising, memsw goes first; lowering, the limit does
    memsw = os.path.join(path, "memory.memsw.limit_in_bytes")  # only with swap accounting: no swap for the worker
    limit = os.path.join(path, "memory.limit_in_bytes")
    raising = os.path.exists(memsw) and hard > int(_read(limit) or 0)
    if raising:
        _write(memsw, str(hard))
    _write(limit, str(hard))
    _try_write(os.path.join(path, "memory.soft_limit_in_bytes"), str(soft))
    if not raising:
        _try_write(memsw, str(hard))


def enter_self(version: int, path: str) -> None:
    """Move this process into the group (its later allocations are charged there). Writing a process to
    `cgroup.procs` takes the kernel's cgroup-wide threadgroup lock, whose write side waits for an RCU grace period
    once a while: 13 ms median for a process entering once, measured on cgroup v1 here, the largest part of the
    wrapper's start. On v1, writing 0 to `tasks` moves the calling thread without that lock (kernel/cgroup/
    cgroup.c, cgroup_procs_write_start: a single thread moving itself): 0.1 ms. That is the whole process only
    while it has one thread (the wrapper starts none); otherwise, and on v2 (where threads move alone only in
    threaded subtrees), `cgroup.procs`."""
    if version == 1 and len(os.listdir("/proc/self/task")) == 1:
        _write(os.path.join(path, "tasks"), "0")
    else:
        _write(os.path.join(path, "cgroup.procs"), str(os.getpid()))


# -- the parent-death signal ----------------------------------------------------------------------------------------
def parent_death_signal() -> bool:
    """Whether this host stops a run's processes with the kernel's parent-death signal (Linux), rather than with
    the reaper supervisord's wrapper forks (macOS; or Linux with UMEMC_PARENT_DEATH=reaper)."""
    return sys.platform.startswith("linux") and os.environ.get(PARENT_DEATH_ENV) != "reaper"


def kill_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL) for this process (it survives exec); nothing where libc has no prctl."""
    import ctypes  # only here, and only on Linux

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        pass


# -- a process's exit -----------------------------------------------------------------------------------------------
def wait_exit(pid: int, timeout: float | None = None) -> bool:
    """Block until process `pid` (not a child of ours) has exited (a zombie has: its memory is freed), or until
    `timeout` seconds have passed (None: no limit). True when it has exited."""
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    if sys.platform == "darwin":  # pragma: no cover - macOS
        import select

        kq = select.kqueue()
        event = select.kevent(
            pid, filter=select.KQ_FILTER_PROC, flags=select.KQ_EV_ADD | select.KQ_EV_ONESHOT, fflags=select.KQ_NOTE_EXIT
        )
        try:
            return bool(kq.control([event], 1, timeout))
        except ProcessLookupError:
            return True  # already gone
        finally:
            kq.close()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (OSError, AttributeError):  # pragma: no cover - a kernel before 5.3, or no pidfd at all
        return _polled_exit(pid, deadline)
    try:
        return _readable(fd, deadline)
    finally:
        os.close(fd)


def _readable(fd: int, deadline: float | None) -> bool:
    """poll(2) a pidfd until it is readable (its process exited) or the monotonic deadline passes."""
    import select
    import time

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        if poller.poll(None if left is None else left * 1000):
            return True


def _polled_exit(pid: int, deadline: float | None) -> bool:  # pragma: no cover - neither kqueue nor pidfd
    import time

    while deadline is None or time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        time.sleep(POLL_S)
    return False
