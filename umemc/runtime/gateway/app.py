"""The gateway's HTTP side (aiohttp on uvloop where installed): OpenAI-compatible routes by the request's `model`,
`/models/<name>/…` pass-through, the lease API, /metrics and /umemc/status, the guards in front of them all, and the
application that puts them together. Relaying to a worker is relay.py's; Ollama's API is ollama.py's."""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from ...budget.policy import Decision, Need
from ...chars import CONTROL
from ...units import parse_duration, parse_size
from ..eventtext import said
from . import ollama, router, views
from .access import AccessLog
from .capture import Captures
from .leases import lease_json
from .metrics import Metrics
from .model import Model, Refused
from .progress import STREAMS, Progress
from .relay import (
    ACCESS,
    CAPTURES,
    CLIENT,
    HTTP_STATUS,
    METRICS,
    SCHED,
    Call,
    error,
    forward,
    json_object,
    model_of,
    read_body,
    refused,
    strict_json,
)
from .scheduler import Scheduler

DEFAULT_LEASE_TTL_S = 600.0
MUTATING = frozenset(("POST", "PUT", "PATCH", "DELETE"))
OPEN_PATHS = frozenset(("/umemc/health",))  # liveness only: says nothing about the stack
# the status page's HTML holds no data (it fetches the API with the token from its URL fragment): a browser
# must be able to open it without a header; the Host/Origin rules still apply to it
TOKENLESS_PATHS = OPEN_PATHS | {"/ui"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def openai(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    asked = model_of(request.headers.get("Content-Type", ""), body)
    m = request.app[SCHED].slots.route(asked)
    if b'"keep_alive"' in body and not request.content_type.startswith(
        "multipart/"
    ):  # Ollama's per-request keep_alive, on these routes too (parsed only when there)
        doc = strict_json(body)
        request.app[SCHED].keep_alive(m, ollama.keep_alive_of(doc.get("keep_alive") if isinstance(doc, dict) else None))
    call = Call(request.method, request.path_qs, body, asked)
    return await forward(request, m, call, progress=_progress(request, m, asked, body))


def _progress(request: web.Request, m: Model, asked: str, body: bytes) -> Progress | None:
    """A streamed chat or completion for a model that is not ready is told what it waits for (progress.py)."""
    sched = request.app[SCHED]
    style = sched.gw.loading_progress
    if style == "off" or m.ready or not request.path.endswith("/completions") or not STREAMS.search(body):
        return None
    return Progress(request, sched, m, asked, style, chat=request.path.endswith("/chat/completions"))


async def passthrough(request: web.Request) -> web.StreamResponse:
    asked = request.match_info["name"]
    m = request.app[SCHED].slots.route(asked)
    path = "/" + request.match_info["tail"] + (f"?{request.query_string}" if request.query_string else "")
    return await forward(request, m, Call(request.method, path, await read_body(request), asked))


async def list_models(request: web.Request) -> web.Response:
    sched = request.app[SCHED]
    data = []
    for m in sched.models.values():
        info = {
            "kind": m.kind,
            "status": m.status_word,
            "state": m.state,
            "ready": m.ready,
            "mode": m.plan.mode,
            "aliases": m.plan.aliases,
            "tokens_per_s": sched.traffic[m.name].tokens_per_s,
        }
        data.append({"id": m.name, "object": "model", "created": 0, "owned_by": "umemc", "umemc": info})
        data += [
            {"id": a, "object": "model", "created": 0, "owned_by": "umemc", "root": m.name, "umemc": {"kind": m.kind}}
            for a in m.plan.aliases
        ]
    for shared, now in views.groups(sched).items():
        kind = sched.models[now["models"][0]].kind
        info = {"kind": kind, "serves": now["models"], "answers_now": now["answers_now"]}
        data.append({"id": shared, "object": "model", "created": 0, "owned_by": "umemc", "umemc": info})
    return web.json_response({"object": "list", "data": data})


# -- umemc API ----------------------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def status(request: web.Request) -> web.Response:
    return web.json_response(views.status(request.app[SCHED]))


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[METRICS].render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


async def can_load(request: web.Request) -> web.Response:
    sched = request.app[SCHED]
    m = sched.slots.route(request.match_info["model"])
    async with sched.lock:
        decision = sched.decide_model(m)
    need = sched.need_for(m)
    return web.json_response(
        {
            "model": m.name,
            "loaded": m.live,
            "state": m.state,
            "fits_now": decision.fits,
            "would_evict": decision.evict,
            "would_drain": decision.drain,
            "blocked_by": decision.blocked_by if not decision.fits else [],
            "need_bytes": need.ram,
            "free_bytes": decision.free_ram,
            "reason": (
                f"loaded: it holds its {need.ram} bytes already"
                if m.live
                else None
                if decision.fits
                else decision.reason(need)
            ),
        }
    )


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
        said_ = await sched.start_now(m)
    else:
        said_ = await sched.stop_now(m, drain=action == "stop")
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


async def leases_list(request: web.Request) -> web.Response:
    return web.json_response({"leases": [lease_json(x) for x in request.app[SCHED].book.leases.values()]})


LEASE_KEYS = frozenset({"holder", "bytes", "model", "priority", "ttl", "worker"})
MAX_LEASE_TTL_S = 7 * 24 * 3600.0
MAX_LEASE_BYTES = 2**60


async def lease_create(request: web.Request) -> web.Response:
    sched = request.app[SCHED]
    doc = await json_object(request)
    unknown = sorted(set(doc) - LEASE_KEYS)
    if unknown:
        raise Refused(
            f"unknown lease field(s): {', '.join(unknown)} (known: {', '.join(sorted(LEASE_KEYS))})",
            "invalid_lease",
        )
    holder = doc.get("holder")
    if not isinstance(holder, str) or not holder.strip() or len(holder) > 128 or CONTROL.search(holder):
        raise Refused('"holder" is required: who asks (e.g. "comfyui"), 1-128 printable characters', "invalid_lease")
    ttl = _seconds(doc.get("ttl", DEFAULT_LEASE_TTL_S))
    ram, gpu, priority, model = _lease_size(sched, doc)
    worker = _lease_worker(sched, doc)
    lease, decision, need = await sched.grant_lease(holder, ram, gpu, priority, ttl, model, worker)
    if lease is None:
        return _lease_refused(decision, need, sched.grant_at(need))
    return web.json_response({"granted": True, "lease": lease_json(lease), "evicted": decision.evict}, status=201)


def _lease_worker(sched: Scheduler, doc: dict[str, Any]) -> str | None:
    """`worker`: the worker of this stack whose allowance the lease raises (its enforcer limit and its kernel
    limit grow by the lease while it lives). A worker that is not running holds nothing: its lease is then
    memory of its own, like any other."""
    name = doc.get("worker")
    if name is None:
        return None
    m = sched.models.get(name) if isinstance(name, str) else None
    if m is None:
        raise Refused(f'"worker" must name a model of this stack (got {name!r})', "invalid_lease")
    return m.name if m.live else None


def _lease_refused(decision: Decision, need: Need, higher: tuple[int, Decision] | None) -> web.Response:
    reason = decision.reason(need)
    if higher is None:
        reason += f"; no priority would be granted now (this lease asked {need.priority})"
    else:
        at, would = higher
        evicting = f", evicting {', '.join(would.victims)}" if would.victims else ""
        reason += f"; at priority {at} it would be granted{evicting} (this lease asked {need.priority})"
    return web.json_response(
        {
            "granted": False,
            "reason": reason,
            "grant_at_priority": None if higher is None else higher[0],
            "blocked_by": decision.blocked_by,
            "free_bytes": decision.free_ram,
            "error": {"message": reason, "type": "insufficient_memory", "code": "lease_refused"},
        },
        status=409,
    )


def _lease_size(sched: Scheduler, doc: dict[str, Any]) -> tuple[int, int, int, str | None]:
    if ("bytes" in doc) == ("model" in doc):
        raise Refused('give exactly one of "bytes" (e.g. "8GiB") or "model" (a model of this stack)', "invalid_lease")
    if "model" in doc:
        if not isinstance(doc["model"], str):
            raise Refused(f'"model" must be a model name (got {doc["model"]!r})', "invalid_lease")
        m = sched.slots.route(doc["model"])
        p = m.plan
        return p.quota_hard_bytes, p.gpu_quota_hard_bytes, _priority(doc, p.priority), m.name
    raw = doc["bytes"]
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise ValueError(f"not a size: {raw!r}")
        ram = raw if isinstance(raw, int) else parse_size(raw)
    except ValueError as exc:
        raise Refused(f'"bytes": {exc}', "invalid_lease") from None
    if not 0 < ram <= MAX_LEASE_BYTES:
        raise Refused(f'"bytes" must be > 0 and at most {MAX_LEASE_BYTES} (got {ram})', "invalid_lease")
    return ram, ram if sched.budget.gpu is not None else 0, _priority(doc, 50), None


def _priority(doc: dict[str, Any], default: int) -> int:
    priority = doc.get("priority", default)
    if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 100:
        raise Refused(f'"priority" must be an integer 0-100 (got {priority!r})', "invalid_lease")
    return priority


def _seconds(raw: Any) -> float:
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError(f"not a duration: {raw!r}")
        value = float(raw) if isinstance(raw, (int, float)) else parse_duration(raw)
    except ValueError as exc:
        raise Refused(f'"ttl": {exc}', "invalid_lease") from None
    if not math.isfinite(value) or not 0 < value <= MAX_LEASE_TTL_S:
        raise Refused(
            f'"ttl" must be more than 0 s and at most {MAX_LEASE_TTL_S:g} s (7 days) (got {raw!r})',
            "invalid_lease",
        )
    return value


async def pressure(request: web.Request) -> web.Response:
    """The enforcer's request (umemc-internal): pressure is above evict_above; the gateway decides
    whom to stop, as it does for every eviction while it runs."""
    doc = await json_object(request)
    value = doc.get("pressure")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise Refused(f'"pressure" must be a number 0-100 (got {value!r})', "invalid_json")
    return web.json_response(await request.app[SCHED].relieve_pressure(float(value)))


async def lease_delete(request: web.Request) -> web.Response:
    lease = request.app[SCHED].release_lease(request.match_info["id"])
    if lease is None:
        return error(404, f"no lease {request.match_info['id']!r}", "lease_not_found")
    return web.json_response({"released": lease_json(lease)})


async def lease_extend(request: web.Request) -> web.Response:
    doc = await json_object(request)
    if set(doc) - {"ttl"}:
        raise Refused(f"unknown field(s): {', '.join(sorted(set(doc) - {'ttl'}))} (known: ttl)", "invalid_lease")
    ttl = _seconds(doc.get("ttl", DEFAULT_LEASE_TTL_S))
    lease = request.app[SCHED].extend_lease(request.match_info["id"], ttl)
    if lease is None:
        return error(404, f"no lease {request.match_info['id']!r} (released or expired)", "lease_not_found")
    return web.json_response({"lease": lease_json(lease)})


# -- the application ----------------------------------------------------------------------------
def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """Host header values a loopback gateway answers to: a page on another name that resolves to
    127.0.0.1 (DNS rebinding) is refused. None off loopback, where every request needs the token."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        return None
    names = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}
    return frozenset(n for name in names for n in (name, f"{name}:{port}"))


def front_door(hosts: frozenset[str] | None, token: str | None) -> Any:
    """Every request's one middleware (each layer of them costs every request a coroutine): what a hostile web page
    can make a browser send to loopback is refused before anything else (a foreign Host: DNS rebinding; a
    cross-origin request: Origin, Sec-Fetch-Site; a body of a type a page may send without a CORS preflight,
    text/plain or a form, to a JSON endpoint: CSRF), then a request without the token; a handler's Refused is
    answered here (OpenAI-shaped with Retry-After, Ollama-shaped on its routes)."""
    expected = None if token is None else f"Bearer {token}".encode()

    @web.middleware
    async def door(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in OPEN_PATHS:
            return await handler(request)
        refusal = _browser_refusal(request, hosts)
        if refusal is not None:
            return refusal
        if expected is not None and path not in TOKENLESS_PATHS:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                resp = error(401, "this gateway needs Authorization: Bearer <token>", "unauthorized")
                resp.headers["WWW-Authenticate"] = "Bearer"
                return resp
        try:
            return await handler(request)
        except Refused as exc:
            if path.startswith("/api/"):  # Ollama's clients read {"error": "..."}
                return ollama.ollama_error(HTTP_STATUS[exc.code], exc.message)
            return refused(exc)
        except web.HTTPRequestEntityTooLarge:
            limit = request.app[SCHED].gw.max_body_bytes
            return error(413, f"request body larger than {limit} bytes (gateway.max_body)", "body_too_large")

    return door


def _browser_refusal(request: web.Request, hosts: frozenset[str] | None) -> web.Response | None:
    host = request.headers.get("Host", "").lower()
    if hosts is not None and host not in hosts:
        return error(403, f"Host {host!r} is not this gateway's address (use 127.0.0.1 or localhost)", "forbidden_host")
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc.lower() != host:
        return error(403, f"cross-origin request from {origin!r} refused", "cross_origin")
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return error(403, f"cross-site request refused (Sec-Fetch-Site: {site})", "cross_origin")
    if request.method in MUTATING and request.body_exists and not _accepted_type(request):
        return error(
            415,
            f"Content-Type {request.content_type!r} is not accepted here: send application/json"
            + (" or multipart/form-data" if _multipart_allowed(request.path) else ""),
            "unsupported_media_type",
        )
    return None


def _multipart_allowed(path: str) -> bool:
    return path.startswith(("/v1/", "/models/"))  # audio uploads; never the umemc API


def _typeless_allowed(path: str) -> bool:
    return _multipart_allowed(path) or path.startswith("/api/")  # clients of these APIs post JSON unlabelled


def _accepted_type(request: web.Request) -> bool:
    """JSON (multipart for uploads to workers). No Content-Type at all only on the OpenAI routes and the
    passthrough (clients that post JSON without saying so; a browser sends a typeless body only with an Origin,
    refused): umemc's own API, which grants memory and evicts, takes JSON that says it is JSON."""
    if "Content-Type" not in request.headers:
        return _typeless_allowed(request.path)
    ctype = request.content_type.lower()
    if ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json")):
        return True
    return ctype == "multipart/form-data" and _multipart_allowed(request.path)


def make_app(sched: Scheduler, token: str | None) -> web.Application:
    gw = sched.gw
    door = front_door(allowed_hosts(gw.host, gw.port), token)
    app = web.Application(client_max_size=gw.max_body_bytes, middlewares=[door])
    app[SCHED] = sched
    app[METRICS] = sched.metrics = Metrics(sched)
    app[ACCESS] = AccessLog(sched.run.access_log)
    app[CAPTURES] = Captures(gw.capture, gw.capture_bytes)
    if token:
        app["token"] = token
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/{tail:.+}", openai)
    app.router.add_route("*", "/models/{name}/{tail:.*}", passthrough)
    app.router.add_get("/umemc/health", health)
    app.router.add_get("/ui", ui_page)
    app.router.add_get("/umemc/events", events_list)
    app.router.add_get("/umemc/logs/{model}", log_tail)
    app.router.add_get("/umemc/status", status)
    app.router.add_get("/umemc/leases", leases_list)
    app.router.add_post("/umemc/leases", lease_create)
    app.router.add_delete("/umemc/leases/{id}", lease_delete)
    app.router.add_post("/umemc/leases/{id}/extend", lease_extend)
    app.router.add_get("/umemc/can-load/{model}", can_load)
    app.router.add_get("/umemc/history", history)
    app.router.add_get("/umemc/captures", captures)
    app.router.add_post("/umemc/models/{name}/{action}", model_action)
    app.router.add_post("/umemc/pressure", pressure)
    app.router.add_get("/metrics", metrics)
    ollama.add_routes(app)
    router.add_routes(app)
    app.cleanup_ctx.append(_lifetime)
    return app


KEEP_ALIVE_S = 2.0


async def _lifetime(app: web.Application) -> Any:
    # idle connections to workers close before the servers' own keep-alive timeouts do (cpp-httplib's, under
    # llama-server, and uvicorn's: 5 s), so that the gateway rarely takes one the worker is closing
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEP_ALIVE_S)
    client = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
    )
    app[CLIENT] = client
    sched = app[SCHED]

    async def probe(m: Model) -> bool:
        if m.port is None:
            return True
        path = m.plan.health or "/"
        try:
            async with client.get(f"http://127.0.0.1:{m.port}{path}", timeout=aiohttp.ClientTimeout(total=2)) as r:
                return r.status == 200 if m.plan.health else True
        except (aiohttp.ClientError, TimeoutError):
            return False

    sched.sync.probe = probe
    await sched.start()
    yield
    await sched.close()
    await client.close()
    app[ACCESS].close()
