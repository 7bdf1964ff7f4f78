"""The gateway's access log: one JSON object per line for every request it answered, in RUN/state/logs/access.log
(`umemc logs access`). What was asked of which model, what came of it and how long each part took; never a
body, a header or a query string (they may hold prompts and keys).

Bounded: past MAX_BYTES the file moves to access.log.1 (the one before is dropped). A log that cannot be written
(full disk, read-only state) never fails a request: it is said once on stderr and tried again at the next
rotation check."""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import msgspec

from .batch import Batch

_ENCODE = msgspec.json.Encoder().encode  # compact JSON, UTF-8: a line per request, several times json.dumps's speed

MAX_BYTES = 16 * 1024 * 1024
RETRY_S = 10.0
FLUSH_S = 0.1
MAX_PENDING = 4096  # lines kept for the next flush at most: past it they are written at once


class AccessLog:
    def __init__(self, path: Path, max_bytes: int = MAX_BYTES):
        self.path, self.max_bytes = path, max_bytes
        self.file: IO[bytes] | None = None
        self.size = 0
        self.failed: str | None = None
        self.next_try = 0.0
        self.lines: Batch[tuple[float, dict[str, Any]]] = Batch(FLUSH_S, self._write, MAX_PENDING)

    def write(self, entry: dict[str, Any], at: float | None = None) -> None:
        """One request's line (`at`: when it was answered, else now), on disk within FLUSH_S: the lines of the moment
        are formatted and written together (batch.py)."""
        self.lines.add((time.time() if at is None else at, entry))

    def flush(self) -> None:
        """The lines kept so far, written now."""
        self.lines.run()

    def _write(self, pending: list[tuple[float, dict[str, Any]]]) -> None:
        now = time.time()
        second, stamp = -1, b""
        lines: list[bytes] = []
        try:
            f = self._open(now)
            for t, entry in pending:
                if f is None:
                    return
                if int(t) != second:  # the lines of a flush share their second: formatted once
                    second = int(t)
                    stamp = datetime.fromtimestamp(second, UTC).strftime('{"time":"%Y-%m-%dT%H:%M:%S').encode()
                # the time first, as datetime's isoformat(timespec="milliseconds") writes it (2026-12-05T09:30:01.123
                # +00:00), then the entry's fields: its encoding's opening brace replaced
                body = _ENCODE(entry)
                line = b'%b.%03d+00:00"%b%b\n' % (
                    stamp,
                    int((t - second) * 1000),
                    b"," if len(body) > 2 else b"",
                    body[1:],
                )
                lines.append(line)
                self.size += len(line)
                if self.size >= self.max_bytes:  # full: what it holds is written, and the next line opens another
                    f.write(b"".join(lines))
                    lines.clear()
                    f = self._open(now)
            if f is not None and lines:
                f.write(b"".join(lines))
                f.flush()
        except OSError as exc:
            self._failed(exc, now)

    def _open(self, now: float) -> IO[bytes] | None:
        if self.file is not None and self.size < self.max_bytes:
            return self.file
        if self.file is None and self.failed is not None and now < self.next_try:
            return None
        if self.file is not None:  # full: rotate
            self.file.close()
            self.file = None
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "ab")  # held open for the gateway's life
        os.chmod(self.path, 0o600)
        self.size = self.file.tell()
        self.failed = None
        return self.file

    def _failed(self, exc: OSError, now: float) -> None:
        if str(exc) != self.failed:
            print(f"umemc-gateway: access log {self.path}: {exc} (requests are served; not logged)", file=sys.stderr)
        self.failed, self.next_try = str(exc), now + RETRY_S
        self._drop()

    def close(self) -> None:
        """The lines still kept written, then the file closed (the gateway's end)."""
        self.flush()
        self._drop()

    def _drop(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
            self.file = None
