"""The status page's routes: /ui (its HTML, which holds no data), and what it reads and asks with the token: the
event log, the figures' history, the captured requests, a model's log, and its actions (start, stop, evict)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from ..eventtext import said
from . import views
from .app_keys import CAPTURES, SCHED
from .bodies import json_object
from .model import Refused
from .scheduler import Scheduler
from .surfaces import error

UI_PAGE = Path(__file__).with_name("ui") / "index.html"
LOG_TAIL_BYTES = 256 * 1024


async def ui_page(request: web.Request) -> web.Response:
    """The live status page: one self-contained HTML file (no external assets), polling the API below. Its first
    paint shows data: a gateway without a token puts the state in the page (what its open API would answer);
    with a token the page holds nothing (the token is in its URL fragment, which never reaches the server) and
    asks at once."""
    initial = ""
    if "token" not in request.app:
        sched = request.app[SCHED]
        events = sched.events.since(max(0, sched.events.last_id("up") - 1), 500)
        doc = {"status": views.status(sched), "history": _history(sched, 60), "events": [_event(e) for e in events]}
        # inside <script>: no "</" may close it early, and nothing else is markup there
        initial = json.dumps(doc).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return web.Response(
        body=UI_PAGE.read_bytes().replace(b"__UMEMC_INITIAL__", initial.encode()),
        content_type="text/html",
        headers={
            "Content-Security-Policy": "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
        },
    )


async def events_list(request: web.Request) -> web.Response:
    """Events after ?after=ID (at most ?limit=, 1000): what the status page streams."""
    try:
        after = int(request.query.get("after", "0"))
        limit = max(1, min(1000, int(request.query.get("limit", "200"))))
    except ValueError:
        raise Refused("after and limit must be integers", "invalid_json") from None
    sched = request.app[SCHED]
    events = sched.events.since(after, limit)
    return web.json_response({"events": [_event(e) for e in events]})


def _event(e: Any) -> dict[str, Any]:
    return dict(e.as_json(), id=e.id, text=said(e.kind, e.detail))


def _history(sched: Scheduler, minutes: float) -> dict[str, Any]:
    sched.ledger.settle()  # the requests that ended before the page asked
    now = time.time()
    return {
        "memory": sched.memory.since(now - minutes * 60),
        "speed": sched.answered.summary(now),
        "budget_bytes": sched.budget.ram,
        "usable_bytes": sched.budget.usable,
    }


async def history(request: web.Request) -> web.Response:
    """?minutes= (default 60, at most 60): each model's memory over time, and its speed over the last minutes."""
    try:
        minutes = max(1.0, min(60.0, float(request.query.get("minutes", "60"))))
    except ValueError:
        raise Refused("minutes must be a number", "invalid_json") from None
    return web.json_response(_history(request.app[SCHED], minutes))


async def captures(request: web.Request) -> web.Response:
    """The latest requests and answers (gateway.capture; empty and `enabled: false` by default)."""
    return web.json_response(request.app[CAPTURES].json())


ACTIONS = ("start", "stop", "evict")


async def model_action(request: web.Request) -> web.Response:
    """POST /umemc/models/NAME/start|stop|evict with a JSON object body (a page elsewhere cannot send one
    without the browser asking first, which this gateway never allows): start a model that is down under the
    same admission as a request; stop one after draining its requests; evict one now (refused while busy)."""
    sched = request.app[SCHED]
    action = request.match_info["action"]
    if action not in ACTIONS:
        return error(404, f"no action {action!r} (one of {', '.join(ACTIONS)})", "no_such_action")
    if request.content_type != "application/json" or not request.body_exists:
        return error(
            415, "send a JSON object body (e.g. {}) with Content-Type: application/json", "unsupported_media_type"
        )
    await json_object(request)
    m = sched.slots.route(request.match_info["name"])
    if action == "start":
        said_ = await sched.actions.start_now(m)
    else:
        said_ = await sched.actions.stop_now(m, drain=action == "stop")
    return web.json_response({"model": m.name, "action": action, "said": said_, "status": m.status_word})


async def log_tail(request: web.Request) -> web.Response:
    """The last ?lines= (default 40, at most 1000) lines of a worker's stderr log, as text."""
    sched = request.app[SCHED]
    m = sched.slots.route(request.match_info["model"])
    try:
        lines = max(1, min(1000, int(request.query.get("lines", "40"))))
    except ValueError:
        raise Refused("lines must be an integer", "invalid_json") from None
    path = sched.run.log(m.name)
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        text = ""
    return web.Response(text="\n".join(text.splitlines()[-lines:]) + "\n", content_type="text/plain")


ROUTES = (
    web.get("/ui", ui_page),
    web.get("/umemc/events", events_list),
    web.get("/umemc/logs/{model}", log_tail),
    web.get("/umemc/history", history),
    web.get("/umemc/captures", captures),
    web.post("/umemc/models/{name}/{action}", model_action),
)
