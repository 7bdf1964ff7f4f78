"""The event log: SQLite (WAL) in the run dir's state, bounded by rows and age. Never an in-memory
list that grows (FIELD-NOTES.md §11: the manager itself leaked 8 GB of request history)."""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

MAX_ROWS = 100_000
MAX_AGE_S = 30 * 24 * 3600
PRUNE_EVERY = 500

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
        time_iso = datetime.fromtimestamp(self.ts, timezone.utc).isoformat(timespec="milliseconds")
        return {"time": time_iso, "model": self.model, "kind": self.kind, "detail": self.detail}


class EventLog:
    def __init__(self, path: Path, max_rows: int = MAX_ROWS, max_age_s: float = MAX_AGE_S):
        self.path, self.max_rows, self.max_age_s = path, max_rows, max_age_s
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), timeout=5, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        self._since_prune = 0

    def add(self, kind: str, model: str | None = None, **detail: Any) -> None:
        self.db.execute("INSERT INTO events(ts, model, kind, detail) VALUES (?, ?, ?, ?)",
                        (time.time(), model, kind, json.dumps(detail, sort_keys=True)))
        self._since_prune += 1
        if self._since_prune >= PRUNE_EVERY:
            self.prune()

    def prune(self) -> None:
        self._since_prune = 0
        self.db.execute("DELETE FROM events WHERE ts < ?", (time.time() - self.max_age_s,))
        self.db.execute("DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?", (self.max_rows,))

    def since(self, after_id: int = 0, limit: int | None = None) -> list[Event]:
        sql = "SELECT id, ts, model, kind, detail FROM events WHERE id > ? ORDER BY id"
        rows = self.db.execute(sql + (f" LIMIT {int(limit)}" if limit else ""), (after_id,)).fetchall()
        return [Event(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    def last_id(self, kind: str) -> int:
        row = self.db.execute("SELECT MAX(id) FROM events WHERE kind = ?", (kind,)).fetchone()
        return int(row[0] or 0)

    def count(self, kind: str, model: str, after_id: int = 0) -> int:
        row = self.db.execute("SELECT COUNT(*) FROM events WHERE kind = ? AND model = ? AND id > ?",
                              (kind, model, after_id)).fetchone()
        return int(row[0])

    def last(self, kind: str, model: str, after_id: int = 0) -> Event | None:
        row = self.db.execute("SELECT id, ts, model, kind, detail FROM events WHERE kind = ? AND model = ? AND id > ? "
                              "ORDER BY id DESC LIMIT 1", (kind, model, after_id)).fetchone()
        return None if row is None else Event(row[0], row[1], row[2], row[3], json.loads(row[4]))

    def close(self) -> None:
        self.db.close()
