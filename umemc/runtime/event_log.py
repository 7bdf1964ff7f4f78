"""The event log: SQLite (WAL) in the run dir's state, bounded by rows and age; never an in-memory
list that grows (a manager that keeps its history in memory leaks it).

The log must never stop what it records: a corrupt database is moved aside (events.db.corrupt-TIME)
and a new one started; a log that cannot be written (full disk, read-only state, locked) degrades to
lines on stderr, says why in `error`, and tries the database again later. Readers get an empty
history rather than an exception."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Every kind of event the runtime records (`umemc events --kind` takes these; a test checks the code writes
# no other): the enforcer's, the gateway's and the commands'.
KINDS: tuple[str, ...] = (
    "up", "down", "reconcile", "enforcer_start", "start", "exit", "soft_limit", "hard_limit_kill",
    "leak_suspected", "give_up", "estimate_drift", "evict", "evict_deferred", "evict_failed", "cold_start",
    "cold_start_failed", "drain_timeout", "ttl_unload", "ttl_unload_failed", "refused", "unhealthy", "recovered",
    "restore",
    "lease_grant", "lease_release", "lease_expire", "event_log_reset", "slot_save", "slot_restore",
    "slot_save_failed", "slot_restore_failed", "allowance", "action", "unload", "unload_failed",
    "swapping", "gpu_limit", "reaped", "plan_adopted", "page_cache_released",
    "throttle", "defragment", "defragment_failed", "helper_lost", "helpers_back", "state",
)  # fmt: skip
MAX_ROWS = 100_000
MAX_AGE_S = 30 * 24 * 3600
PRUNE_EVERY = 500
RETRY_S = 10.0  # a degraded log tries its database again this often
# A writer's own connection can go on appending to its WAL over a file damaged under it (its page cache never
# re-reads the header), while every reader fails: a writer looks at the file afresh this often.
VERIFY_S = 15.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    ts     REAL NOT NULL,
    model  TEXT,
    kind   TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);
"""


@dataclass(frozen=True)
class Event:
    id: int
    ts: float
    model: str | None
    kind: str
    detail: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        time_iso = datetime.fromtimestamp(self.ts, UTC).isoformat(timespec="milliseconds")
        return {"time": time_iso, "model": self.model, "kind": self.kind, "detail": self.detail}


class EventLog:
    def __init__(
        self,
        path: Path,
        max_rows: int = MAX_ROWS,
        max_age_s: float = MAX_AGE_S,
        *,
        recover: bool = True,
        lazy: bool = False,
    ):
        """recover: move a corrupt database aside and start a new one (the runtime's writers); a reader
        (`umemc events`) passes False and only reports what it found. lazy: the file is opened (created) at the
        log's first use, not here (an enforcer waiting for its lock touches no log: one deleted meanwhile stays
        deleted, for `umemc status` to say so)."""
        self.path, self.max_rows, self.max_age_s, self.recover = path, max_rows, max_age_s, recover
        self.db: sqlite3.Connection | None = None
        self.error: str | None = None  # why the log is degraded; None when it works
        self.moved_to: Path | None = None  # where a corrupt database was moved
        self._since_prune = 0
        self._next_try = 0.0
        self._next_verify = time.monotonic() + VERIFY_S
        self._inode: int | None = None
        if not lazy:  # else opened at its first use (_usable: _next_try is now)
            self._open()

    # -- opening, recovering ----------------------------------------------------------------------
    def _open(self) -> None:
        self._next_try = time.monotonic() + RETRY_S
        try:
            self.db = self._connect()
        except sqlite3.DatabaseError as exc:
            if not self.recover or not _corrupt(exc):
                self._degrade(exc)
                return
            self._move_aside(exc)
        except OSError as exc:
            self._degrade(exc)
            return
        else:
            self.error = None
            return
        try:
            self.db = self._connect()
            self.error = None
        except (sqlite3.Error, OSError) as exc:
            self._degrade(exc)
            return
        self.add("event_log_reset", None, moved_to=str(self.moved_to), reason="the event log was corrupt")

    def _damaged(self, exc: sqlite3.Error) -> bool:
        """A write that failed on damage: moved aside and started anew at once (a writer), True; else False."""
        if not (self.recover and isinstance(exc, sqlite3.DatabaseError) and _corrupt(exc)):
            return False
        self._start_over(exc)
        return self.db is not None

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self.path), timeout=5, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            db.execute("SELECT COUNT(*) FROM events").fetchone()
            self._inode = _inode(self.path)
        except sqlite3.Error:
            db.close()
            raise
        return db

    def _replaced(self) -> bool:
        """The file this connection writes is no longer at its path (deleted, or replaced): an open
        SQLite connection would go on writing into the unlinked file, and every event would be lost."""
        return self.db is not None and _inode(self.path) != self._inode

    def _reopen_if_replaced(self) -> None:
        if not (self.recover and self._replaced()):
            return
        self.close()
        self._open()
        if self.db is not None:
            self.add("event_log_reset", None, reason=f"{self.path} was deleted or replaced while in use")

    def _move_aside(self, exc: BaseException) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.moved_to = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                try:
                    src.rename(Path(f"{self.moved_to}{suffix}"))
                except OSError:
                    src.unlink(missing_ok=True)
        _say(f"event log {self.path} was unreadable ({exc}): moved to {self.moved_to}, a new one started")

    def _degrade(self, exc: BaseException) -> None:
        self.close()
        reason = f"{type(exc).__name__}: {exc}"
        if reason != self.error and self.recover:  # a reader reports it its own way
            _say(f"event log {self.path} is unusable ({reason}); events go to stderr until it works again")
        self.error = reason

    def _usable(self) -> bool:
        if self.db is None and time.monotonic() >= self._next_try:
            self._open()
        return self.db is not None

    # -- writing --------------------------------------------------------------------------------
    def verify_due(self) -> None:
        """verify() when VERIFY_S has passed (the enforcer calls this every second: an idle stack adds no event)."""
        if time.monotonic() >= self._next_verify:
            self.verify()

    def verify(self) -> None:
        """A writer's check of the file as a new reader sees it (a fresh connection: its own would not notice);
        damaged, it is moved aside and a new log started at once, so `umemc events` works again."""
        self._next_verify = time.monotonic() + VERIFY_S
        if not self.recover or self.db is None:
            return
        try:
            probe = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5)
            try:
                found = probe.execute("PRAGMA quick_check(1)").fetchone()
                probe.execute("SELECT COUNT(*) FROM events").fetchone()
            finally:
                probe.close()
        except sqlite3.DatabaseError as exc:
            if not _corrupt(exc):
                return  # locked, busy: not damage
            damage: BaseException = exc
        else:
            if found is not None and found[0] == "ok":
                return
            damage = sqlite3.DatabaseError(f"integrity check: {found[0] if found else 'no answer'}")
        self._start_over(damage)

    def _start_over(self, damage: BaseException) -> None:
        """The damaged file moved aside, a new log opened, and the reset recorded in it."""
        self.close()
        self._move_aside(damage)
        self._open()
        if self.db is not None:
            self.add(
                "event_log_reset", None, moved_to=str(self.moved_to), reason=f"the event log was corrupt: {damage}"
            )

    def add(self, kind: str, model: str | None = None, **detail: Any) -> None:
        ts = time.time()
        text = json.dumps(detail, sort_keys=True, default=str)
        if kind != "event_log_reset":
            self._reopen_if_replaced()
            if time.monotonic() >= self._next_verify:
                self.verify()
        if self._usable():
            assert self.db is not None
            try:
                self.db.execute(
                    "INSERT INTO events(ts, model, kind, detail) VALUES (?, ?, ?, ?)", (ts, model, kind, text)
                )
            except sqlite3.Error as exc:
                if self._damaged(exc):
                    self.add(kind, model, **detail)
                    return
                self._degrade(exc)
            else:
                self._since_prune += 1
                if self._since_prune >= PRUNE_EVERY:
                    self.prune()
                return
        _say(json.dumps({"time": ts, "model": model, "kind": kind, "detail": detail}, default=str))

    def prune(self) -> None:
        self._since_prune = 0
        try:
            if self.db is not None:
                self.db.execute("DELETE FROM events WHERE ts < ?", (time.time() - self.max_age_s,))
                self.db.execute("DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?", (self.max_rows,))
        except sqlite3.Error as exc:
            self._degrade(exc)

    # -- reading (an unusable log reads as empty) -----------------------------------------------
    def _rows(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        if not self._usable():
            return []
        assert self.db is not None
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            self._degrade(exc)
            return []

    def since(self, after_id: int = 0, limit: int | None = None) -> list[Event]:
        sql = "SELECT id, ts, model, kind, detail FROM events WHERE id > ? ORDER BY id"
        rows = self._rows(sql + (f" LIMIT {int(limit)}" if limit else ""), (after_id,))
        return [_event(r) for r in rows]

    def tallies(self, after_id: int = 0) -> list[tuple[str, str | None, str, int]]:
        """(kind, model, cause, count) of the events after after_id that metrics count: hard-limit kills by
        whom, evictions by cause, give-ups, failed cold starts, estimate drift."""
        sql = """
            SELECT kind, model,
                   COALESCE(json_extract(detail, '$.by'), '') || '/' ||
                   COALESCE(json_extract(detail, '$.reason'),
                            CASE WHEN json_extract(detail, '$.for_lease') IS NOT NULL THEN 'lease'
                                 WHEN json_extract(detail, '$.for_model') IS NOT NULL THEN 'cold start'
                                 ELSE '' END),
                   COUNT(*)
            FROM events
            WHERE id > ? AND kind IN ('hard_limit_kill', 'evict', 'ttl_unload', 'give_up', 'cold_start_failed',
                                      'estimate_drift', 'leak_suspected')
            GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"""
        return [(str(k), m, str(c), int(n)) for k, m, c, n in self._rows(sql, (after_id,))]

    def moved_before(self, after_id: int = 0) -> str | None:
        """Where a damaged log was moved, as the reset that began this one says (after after_id): what a writer
        that opened the new log (a restarted enforcer, the standby handing back) says of the move it did not make."""
        rows = self._rows(
            "SELECT json_extract(detail, '$.moved_to') FROM events WHERE kind = 'event_log_reset' AND id > ? "
            "AND json_extract(detail, '$.moved_to') IS NOT NULL ORDER BY id DESC LIMIT 1",
            (after_id,),
        )
        return str(rows[0][0]) if rows else None

    def last_id(self, kind: str) -> int:
        rows = self._rows("SELECT MAX(id) FROM events WHERE kind = ?", (kind,))
        return int(rows[0][0] or 0) if rows else 0

    def count(self, kind: str, model: str, after_id: int = 0) -> int:
        rows = self._rows(
            "SELECT COUNT(*) FROM events WHERE kind = ? AND model = ? AND id > ?", (kind, model, after_id)
        )
        return int(rows[0][0]) if rows else 0

    def restarts(self, model: str, after_id: int = 0) -> int:
        """Exits of the model's worker that supervisord answers with a restart: every exit but a stop (a stop is
        someone's decision, logged as its own event: an eviction, an idle unload, `umemc down`)."""
        rows = self._rows(
            "SELECT COUNT(*) FROM events WHERE kind = 'exit' AND model = ? AND id > ? "
            "AND COALESCE(json_extract(detail, '$.cause'), '') != 'stopped'",
            (model, after_id),
        )
        return int(rows[0][0]) if rows else 0

    def latest(self, after_id: int = 0, kind: str | None = None) -> dict[str, Event]:
        """Each model's latest event after after_id (of `kind`, else of any kind but a change of phase, which the
        decision that made it says, and a stop's exit: the stop's own event says why)."""
        which = (
            "kind = ?"
            if kind is not None
            else (
                "kind != 'state' AND NOT (kind = 'exit' AND COALESCE(json_extract(detail, '$.cause'), '') = 'stopped')"
            )
        )
        rows = self._rows(
            "SELECT id, ts, model, kind, detail FROM events WHERE id IN (SELECT MAX(id) FROM events WHERE id > ? "
            f"AND model IS NOT NULL AND {which} GROUP BY model)",
            (after_id,) if kind is None else (after_id, kind),
        )
        out = {str(e.model): e for e in map(_event, rows)}
        if kind is None:
            for name, e in out.items():
                if e.kind in EXPLAINED_BY:
                    out[name] = self._explained(e, after_id) or e
        return out

    def _explained(self, event: Event, after_id: int) -> Event | None:
        """The decision a process's start or exit carries out, which says more: the enforcer notes a new process
        (or a gone one) when it samples it, after the gateway said it started the model on demand or restored it
        (a start), or evicted or unloaded it (an exit, by whatever signal the stop took). With nothing of the other
        side between them (an exit, a start), the process event is that decision's."""
        kinds = EXPLAINED_BY[event.kind]
        barrier = "exit" if event.kind == "start" else "start"
        marks = ", ".join("?" * (len(kinds) + 1))
        rows = self._rows(
            "SELECT id, ts, model, kind, detail FROM events WHERE model = ? AND id > ? AND id < ? "
            f"AND kind IN ({marks}) ORDER BY id DESC LIMIT 1",
            (event.model, after_id, event.id, *kinds, barrier),
        )
        found = _event(rows[0]) if rows else None
        return found if found is not None and found.kind in kinds else None

    def last(self, kind: str, model: str, after_id: int = 0) -> Event | None:
        rows = self._rows(
            "SELECT id, ts, model, kind, detail FROM events WHERE kind = ? AND model = ? AND id > ? "
            "ORDER BY id DESC LIMIT 1",
            (kind, model, after_id),
        )
        return _event(rows[0]) if rows else None

    def close(self) -> None:
        if self.db is not None:
            try:
                self.db.close()
            except sqlite3.Error:
                pass
            self.db = None


STOPS = (
    "evict",
    "unload",
    "ttl_unload",
    "defragment",
    "helper_lost",
)  # a stop someone decided (the gateway, a guard, a person)
# the decisions whose process events (the enforcer's `start` and `exit`) read as them in `status`
EXPLAINED_BY = {"start": ("cold_start", "restore", "helpers_back"), "exit": STOPS}


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _event(row: Any) -> Event:
    try:
        detail = json.loads(row[4])
    except (TypeError, ValueError):
        detail = {"unreadable": str(row[4])[:200]}
    return Event(row[0], row[1], row[2], row[3], detail if isinstance(detail, dict) else {"value": detail})


def _corrupt(exc: sqlite3.DatabaseError) -> bool:
    """Damage to the file itself (worth moving aside), as opposed to a full disk or a lock."""
    text = str(exc).lower()
    return (
        isinstance(exc, sqlite3.DatabaseError)
        and not isinstance(exc, sqlite3.OperationalError)
        or any(s in text for s in ("not a database", "malformed", "corrupt", "no such table"))
    )


def _say(line: str) -> None:
    try:
        print(f"umemc events: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed: nothing left to tell
        pass
