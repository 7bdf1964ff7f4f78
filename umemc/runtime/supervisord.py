"""supervisord, as umemc runs it: the real supervisord (supervisor.supervisord.main), with three changes made
before it starts.

- supervisor's log handlers report a failed write by printing a traceback to stderr; when the state directory
  is full, that print fails too, the exception escapes into supervisord's main loop and supervisord dies, taking
  every worker with it (their parent-death signal). Here a log line that cannot be written is dropped, and
  supervising goes on: the logs degrade, the stack does not.
- supervisord's own stdout/stderr (`up` points stderr at state/supervisord.stderr.log; in the foreground mode
  supervisord echoes its log there) are a text stream that also takes the bytes supervisor writes to a stream it
  does not recognise as text (supervisor.compat.is_text_stream), and that file is rotated at ROTATE_BYTES.
- A worker's log file that cannot be opened (a read-only or vanished state directory) no longer fails the
  worker's start: its output goes nowhere, with one line in supervisord's log saying so (supervisor opens a
  program's log files at every spawn; a failure there left the program FATAL).
- A program whose command is this umemc's exec wrapper (every program of a bundle) runs the wrapper in the child
  supervisord forks for it, where supervisor would exec the wrapper's interpreter: the wrapper's work (the
  parent-death signal, the cgroup, the records, the gate) is done in that child, which then execs the worker. A
  cold start no longer waits for a second interpreter's start (13-18 ms on a 2-core machine). The command stays the
  wrapper's argv, so a stock supervisord runs the same bundle the slower way.

    python -m umemc.runtime.supervisord -n -c supervisord.conf   (what `umemc up` starts through the wrapper)
"""

from __future__ import annotations

import io
import os
import stat
import sys
from typing import Any, BinaryIO, TextIO

ROTATE_BYTES = 10 * 1024 * 1024  # supervisord's own stderr file: one backup (.1) of this size
_CHECK_EVERY = 64  # writes between size checks


class _Tolerant(io.TextIOBase):
    """supervisord's stdout/stderr: text or bytes in, failed writes (ENOSPC, EIO) dropped, the file behind it (when
    it is one) rotated to NAME.1 once it holds ROTATE_BYTES. A TextIOBase, so supervisor writes str to it."""

    def __init__(self, stream: TextIO, rotate_bytes: int = ROTATE_BYTES):
        super().__init__()
        self._stream, self._rotate, self._writes = stream, rotate_bytes, 0

    def writable(self) -> bool:
        return True

    def write(self, text: Any) -> int:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "replace")
        try:
            self._stream.write(text)
            self._writes += 1
            if self._writes % _CHECK_EVERY == 0:
                self._stream.flush()
                rotate(self._stream, self._rotate)
        except (OSError, ValueError):
            pass
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False


def rotate(stream: TextIO | BinaryIO, limit: int) -> bool:
    """When the regular file behind `stream` holds `limit` bytes or more, keep them as NAME.1 and start it empty
    (the descriptor stays: supervisord holds it for its lifetime, opened for appending). True when it rotated."""
    try:
        fd = stream.fileno()
        st = os.fstat(fd)
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size < limit:
        return False
    path = fd_path(fd)
    if path is None or not os.path.isfile(path):
        return False
    with open(path, "rb") as src, open(path + ".1", "wb") as backup:
        while chunk := src.read(1 << 20):
            backup.write(chunk)
    os.ftruncate(fd, 0)
    return True


F_GETPATH = 50  # macOS <sys/fcntl.h>: the path of an open descriptor


def fd_path(fd: int) -> str | None:
    """The path of an open file: /proc/self/fd on Linux, fcntl(F_GETPATH) on macOS; None where neither answers."""
    if os.path.exists(f"/proc/self/fd/{fd}"):
        return os.readlink(f"/proc/self/fd/{fd}")
    if sys.platform != "darwin":
        return None
    import fcntl  # pragma: no cover - macOS only

    try:  # pragma: no cover
        return fcntl.fcntl(fd, F_GETPATH, bytes(1024)).split(b"\0", 1)[0].decode()
    except OSError:  # pragma: no cover
        return None


def tolerate_log_failures() -> None:
    from supervisor import loggers

    report = loggers.Handler.handleError

    def handle_error(self: Any) -> None:
        try:
            report(self)
        except Exception:  # noqa: BLE001 - reporting the failure failed too (a full disk): drop the line
            pass

    loggers.Handler.handleError = handle_error
    sys.stderr = _Tolerant(sys.stderr)
    sys.stdout = _Tolerant(sys.stdout)


def tolerate_unopenable_logs() -> None:
    """A program whose log file cannot be opened starts anyway, its output dropped (supervisor's dispatchers
    open the files at each spawn through loggers.handle_file)."""
    from supervisor import loggers

    open_file = loggers.handle_file

    def handle_file(logger: Any, filename: str, fmt: str, rotating: bool = False, **kw: Any) -> None:
        try:
            open_file(logger, filename, fmt, rotating, **kw)
        except OSError as exc:  # the logger keeps no handler: what the program writes is read and dropped
            print(f"umemc: cannot open {filename} ({exc.strerror}): this program's output is dropped", file=sys.stderr)

    loggers.handle_file = handle_file


def wrapper_words(argv: list[str]) -> list[str] | None:
    """The wrapper's own options and command, where `argv` runs this umemc's exec wrapper as a bundle writes it
    (`PYTHON -I -S WRAP_ENTRY ARGS`); None for any other command."""
    from ..names import WRAP_ENTRY

    if len(argv) < 4 or argv[1:3] != ["-I", "-S"] or argv[3] != WRAP_ENTRY:
        return None
    return list(argv[4:])


_KEPT: list[object] = []  # supervisord's own streams, never collected (and so never flushed) in a forked child


def run_wrapper_in_child() -> None:
    """supervisor's child calls options.execve once its descriptors, directory and umask are set: for the exec
    wrapper's argv, the wrapper runs there instead (umemc.runtime.wrap.main, which execs the worker or exits)."""
    import signal

    from supervisor.options import ServerOptions

    from . import wrap

    if sys.platform.startswith("linux"):  # what the wrapper imports as it runs, imported once here, not in each child
        import ctypes  # the parent-death signal
        import select  # the gate's wait

        from .probes import proc  # a start time

        del ctypes, select, proc
    execve = ServerOptions.execve

    def execve_here(self: Any, filename: str, argv: list[str], env: dict[str, str]) -> None:
        words = wrapper_words(argv)
        if words is None:
            execve(self, filename, argv, env)
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)  # supervisord's handlers only note a signal: the child must obey it
        _KEPT.extend((sys.stdout, sys.stderr))  # their buffers hold supervisord's output, not this child's
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # the child's, line by line
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(env)
        try:
            code = wrap.main(words)
        except SystemExit as exc:  # argparse's refusal of an argv no bundle writes
            code = exc.code if isinstance(exc.code, int) else 2
        sys.stderr.flush()
        os._exit(code)

    ServerOptions.execve = execve_here


def main() -> None:
    from . import without_openssl

    without_openssl()
    tolerate_log_failures()
    tolerate_unopenable_logs()
    run_wrapper_in_child()
    from supervisor.supervisord import main as supervisord

    supervisord()


if __name__ == "__main__":
    main()
