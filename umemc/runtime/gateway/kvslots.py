"""KV slots kept across an eviction (llama-server): before the gateway stops an idle llama-server worker, each
of its slots' KV cache is saved to RUN/state/slots/<model>/ (llama-server's POST /slots/ID?action=save, into
its --slot-save-path); after the worker's next start each saved slot is restored (action=restore), so a chat
that returns does not re-read its whole history. Both are events (`slot_save`, `slot_restore`) with the
tokens, bytes and milliseconds llama-server reports. The files are bounded by the model's KV cache (what
preflight checks the disk for)."""

from __future__ import annotations

import asyncio
import http.client
import json
from typing import Any

from ..event_log import EventLog

SLOT_TIMEOUT_S = 120.0  # a 32K-token slot of a 70B model is several GiB on disk


def slot_file(model: str, slot: int) -> str:
    return f"{model}-slot{slot}.bin"


def slot_detail(doc: dict[str, Any], action: str) -> dict[str, Any]:
    """llama-server's answer to a slot save or restore as an event's detail: tokens, bytes, milliseconds."""
    tokens, moved = ("n_saved", "n_written") if action == "save" else ("n_restored", "n_read")
    return {"tokens": doc.get(tokens), "bytes": doc.get(moved), "ms": doc.get("timings", {}).get(f"{action}_ms")}


def slot_action(port: int, slot: int, action: str, filename: str, timeout: float = SLOT_TIMEOUT_S) -> dict[str, Any]:
    """One call of llama-server's slot API; raises OSError or ValueError (its error) on failure."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = json.dumps({"filename": filename}).encode()
        conn.request("POST", f"/slots/{slot}?action={action}", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        doc = json.loads(resp.read() or b"{}")
    finally:
        conn.close()
    if resp.status != 200:
        error = doc.get("error", {})
        raise ValueError(str(error.get("message", error) if isinstance(error, dict) else error) or resp.status)
    return dict(doc)


async def save(port: int, model: str, slots: int, events: EventLog) -> list[int]:
    """Save each slot's KV cache (before an eviction); returns the slots saved (an empty slot is not)."""
    saved = []
    for slot in range(slots):
        name = slot_file(model, slot)
        try:
            doc = await asyncio.to_thread(slot_action, port, slot, "save", name)
        except (OSError, ValueError) as exc:
            events.add("slot_save_failed", model, slot=slot, reason=str(exc))
            continue
        if int(doc.get("n_saved", 0)) == 0:
            continue  # an empty slot: nothing to bring back
        saved.append(slot)
        events.add("slot_save", model, slot=slot, **slot_detail(doc, "save"), file=name)
    return saved


async def restore(port: int, model: str, slots: list[int], events: EventLog, prompt_speed: float | None) -> None:
    """Restore the saved slots (after the next start); with the model's last prompt speed, the event says about how
    long reading those tokens again would have taken."""
    for slot in slots:
        name = slot_file(model, slot)
        try:
            doc = await asyncio.to_thread(slot_action, port, slot, "restore", name)
        except (OSError, ValueError) as exc:
            events.add("slot_restore_failed", model, slot=slot, reason=str(exc))
            continue
        detail = slot_detail(doc, "restore")
        if prompt_speed and isinstance(detail["tokens"], int) and isinstance(detail["ms"], (int, float)):
            # what reading those tokens again would have taken at its last prompt speed, less the restore
            detail["saved_s"] = round(max(0.0, detail["tokens"] / prompt_speed - detail["ms"] / 1000), 3)
        events.add("slot_restore", model, slot=slot, **detail, file=name)
