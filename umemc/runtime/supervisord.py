"""supervisord, as umemc runs it: the real supervisord (supervisor.supervisord.main), with one change made
before it starts. supervisor's log handlers report a failed write by printing a traceback to stderr; when
the state directory is full, that print fails too, the exception escapes into supervisord's main loop and
supervisord dies, taking every worker with it (their parent-death signal). Here a log line that cannot be
written is dropped, and supervising goes on: the logs degrade, the stack does not.

    python -m umemc.runtime.supervisord -n -c supervisord.conf   (what `umemc up` starts through the wrapper)
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class _Tolerant:
    """A stream whose failed writes are dropped (ENOSPC, EIO): a diagnostic is never worth the stack."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


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


def main() -> None:
    tolerate_log_failures()
    from supervisor.supervisord import main as supervisord

    supervisord()


if __name__ == "__main__":
    main()
