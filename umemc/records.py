"""The small text files of a run's state, and how any state file is replaced. Imports nothing but os: the exec
wrapper, which starts before every worker (a cold start waits for it), writes its records with these, and
`typing` or `pathlib` alone would double its imports. The typed records that read these lines are umemc.contract's
PidRecord and CgroupRecord."""

from __future__ import annotations

import os

STATE_LIMIT = 64 << 20  # no state file umemc writes comes near it: a larger one is not one of them


def _open_regular(path: str | os.PathLike[str]) -> int:
    """A state file opened without blocking (a FIFO standing where a file should be would block open(2) for good)
    and without following a link at its name, refused unless it is a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if (os.fstat(fd).st_mode & 0o170000) != 0o100000:  # S_IFMT, S_IFREG
        os.close(fd)
        raise OSError(f"{os.fspath(path)}: not a regular file")
    return fd


def read_tail(path: str | os.PathLike[str], n: int) -> bytes:
    """The last `n` bytes of a state file (a log), opened as read_file opens one."""
    fd = _open_regular(path)
    try:
        os.lseek(fd, max(0, os.lseek(fd, 0, os.SEEK_END) - n), os.SEEK_SET)
        return os.read(fd, n)
    finally:
        os.close(fd)


def read_file(path: str | os.PathLike[str], limit: int = STATE_LIMIT) -> bytes:
    """A state file's bytes, read so that nothing found in a run dir can hang or sink the reader: opened without
    blocking (a FIFO standing where a file should be would block open(2) for good) and without following a link
    at its name, refused unless it is a regular file, and read up to `limit` bytes (OSError past it)."""
    fd = _open_regular(path)
    try:
        chunks, size = [], 0
        while size <= limit:
            piece = os.read(fd, min(1 << 20, limit + 1 - size))
            if not piece:
                break
            chunks.append(piece)
            size += len(piece)
    finally:
        os.close(fd)
    if size > limit:
        raise OSError(f"{os.fspath(path)}: larger than {limit} bytes")
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], limit: int = STATE_LIMIT) -> str:
    return read_file(path, limit).decode("utf-8", "replace")


def write_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o600, *, durable: bool = False) -> None:
    """Replace a small state file in one step (a reader sees the old or the new, never half), with
    its mode set at creation: a secret is never briefly readable by others. durable: on disk before it
    returns (the file and the directory entry fsynced), for what has been promised to a client."""
    folder, name = os.path.split(os.fspath(path))
    tmp = os.path.join(folder, f".{name}.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with open(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temporary left behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        dir_fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def pid_line(pid: int, start: int) -> str:
    """state/pids/<name>: `pid starttime` (field 22 of /proc/PID/stat: with the pid, one process)."""
    return f"{pid} {start}\n"


def cgroup_line(version: int, path: str | os.PathLike[str], pid: int) -> str:
    """state/cgroups/<name>: `version path pid` of the memory cgroup the wrapper put the process in."""
    return f"{version} {os.fspath(path)} {pid}\n"


def gate_text(until: float, processes: list[tuple[int, int, str]]) -> str:
    """state/gates/<model>: `until <unix time>`, then `pid starttime name` for each process the model's start waits
    for (umemc.runtime.wrap.pass_gate reads it)."""
    return f"until {until:.3f}\n" + "".join(f"{pid} {start} {name}\n" for pid, start, name in processes)
