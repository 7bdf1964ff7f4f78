"""The gateway's HTTP side (aiohttp on uvloop where installed): OpenAI-compatible routes by the
request's `model`, `/models/<name>/…` pass-through, the lease API, /metrics and /umemc/status.

Responses with a Content-Length are relayed whole; anything else (SSE, chunked) is relayed chunk
by chunk as it arrives. A client that goes away cancels its handler (handler_cancellation), which
closes the upstream connection, so the worker stops generating."""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import hmac
import ipaddress
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from ...chars import CONTROL
from ...policy import Decision, Need
from ...units import parse_duration, parse_size
from ..eventtext import said
from . import views
from .access import AccessLog
from .core import Admit
from .history import Answered
from .leases import lease_json
from .metrics import Metrics
from .model import Model, Refused
from .naming import StreamRenamer, renamed
from .scheduler import Scheduler
from .traffic import Traffic
from .usage import StreamReader, Usage, read_usage

HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    )
)
DEFAULT_LEASE_TTL_S = 600.0
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    409: "insufficient_memory",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}
MUTATING = frozenset(("POST", "PUT", "PATCH", "DELETE"))
OPEN_PATHS = frozenset(("/umemc/health",))  # liveness only: says nothing about the stack
# the status page's HTML holds no data (it fetches the API with the token from its URL fragment): a browser
# must be able to open it without a header; the Host/Origin rules still apply to it
TOKENLESS_PATHS = OPEN_PATHS | {"/ui"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SCHED: web.AppKey[Scheduler] = web.AppKey("sched", Scheduler)
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
CLIENT: web.AppKey[aiohttp.ClientSession] = web.AppKey("client", aiohttp.ClientSession)
ACCESS: web.AppKey[AccessLog] = web.AppKey("access", AccessLog)


def error(status: int, message: str, code: str, retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "code": code}}
    return web.json_response(body, status=status, headers=headers)


# What each refusal is in HTTP (the scheduler speaks in codes; statuses are this layer's business).
HTTP_STATUS = {
    "invalid_json": 400, "model_missing": 400, "invalid_lease": 400,
    "model_not_found": 404, "no_port": 404,
    "body_timeout": 408,
    "queue_full": 429, "too_many_leases": 429,
    "body_too_large": 413,
    "upstream_unreachable": 502, "upstream_disconnected": 502,
    "shutting_down": 503, "worker_unhealthy": 503, "worker_given_up": 503, "queue_timeout": 503,
    "insufficient_memory": 503, "not_admissible": 503, "start_failed": 503, "start_timeout": 503, "stop_failed": 503,
    "state_unwritable": 503,
    "upstream_timeout": 504,
    "busy": 409,
}  # fmt: skip


def admit_of(request: web.Request) -> Admit:
    """`X-Umemc-Wait: 1` (or true/yes): queue for a model that cannot be admitted now, until memory
    frees or the queue timeout; without it such a request is refused at once with the reason."""
    wait = request.headers.get("X-Umemc-Wait", "").strip().lower() in ("1", "true", "yes")
    return Admit.QUEUE if wait else Admit.REFUSE_NOW


def refused(exc: Refused) -> web.Response:
    return error(HTTP_STATUS[exc.code], exc.message, exc.code, exc.retry_after)


# -- routing ------------------------------------------------------------------------------------
def model_of(content_type: str, body: bytes) -> str:
    """The `model` field of a JSON body, or of a multipart form (audio transcriptions)."""
    if content_type.startswith("multipart/form-data"):
        return _multipart_model(content_type, body)
    try:
        doc = strict_json(body) if body else None
    except ValueError as exc:
        raise Refused(str(exc) if isinstance(exc, TooDeep) else "request body is not JSON", "invalid_json") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), str) or not doc["model"]:
        raise Refused('request has no "model" field: name a model of this stack (GET /v1/models)', "model_missing")
    return str(doc["model"])


def _multipart_model(content_type: str, body: bytes) -> str:
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    for part in msg.iter_parts():
        if part.get_param("name", header="content-disposition") == "model":
            value = part.get_payload(decode=True)
            if isinstance(value, bytes) and value.strip():
                return value.decode(errors="replace").strip()
    raise Refused('form has no "model" field: name a model of this stack (GET /v1/models)', "model_missing")


async def read_body(request: web.Request) -> bytes:
    """The whole body within gateway.body_timeout (a client trickling bytes cannot hold a handler),
    at most gateway.max_body bytes (aiohttp answers 413 beyond; a larger declared Content-Length is
    answered 413 at once, before a byte of it is waited for)."""
    limit = request.app[SCHED].gw.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise Refused(
            f"request body of {request.content_length} bytes is larger than {limit} bytes (gateway.max_body)",
            "body_too_large",
        )
    try:
        async with asyncio.timeout(request.app[SCHED].gw.body_timeout_s):
            return await request.read()
    except TimeoutError:
        raise Refused(
            f"request body not received within {request.app[SCHED].gw.body_timeout_s:g} s", "body_timeout"
        ) from None


MAX_JSON_DEPTH = 64  # no request of this API nests deeper than a few levels
TOO_DEEP = f"request body nests more than {MAX_JSON_DEPTH} levels of arrays or objects"


def strict_json(raw: bytes) -> Any:
    """json.loads without NaN/Infinity (Python accepts them; JSON does not) and without nesting past
    MAX_JSON_DEPTH (3000 levels made the parser recurse until Python gave up: a 500 with a traceback)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        doc = json.loads(raw, parse_constant=refuse)
    except RecursionError:  # deeper than Python's recursion limit (about 1000 levels)
        raise TooDeep(TOO_DEEP) from None
    # no more opening brackets than the limit (strings' included) bound the depth: most bodies end here
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and depth(doc) > MAX_JSON_DEPTH:
        raise TooDeep(TOO_DEEP)
    return doc


class TooDeep(ValueError):
    pass


def depth(doc: Any) -> int:
    """How deep a parsed document nests arrays and objects, counted up to one level past MAX_JSON_DEPTH; level by
    level over the containers only (a 1 MiB prompt is one string: nothing to walk). Scanning the body's bytes
    for brackets outside strings instead took 17 ms a MiB in Python, 8 ms with a regular expression on a prompt
    of code; the parser is C and 1 ms."""
    level = [doc] if type(doc) in (dict, list) else []
    deepest = 0
    while level and deepest <= MAX_JSON_DEPTH:
        deepest += 1
        level = [v for c in level for v in (c.values() if type(c) is dict else c) if type(v) in (dict, list)]
    return deepest


async def openai(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    asked = model_of(request.headers.get("Content-Type", ""), body)
    return await forward(request, request.app[SCHED].slots.route(asked), request.path_qs, body, asked)


async def passthrough(request: web.Request) -> web.StreamResponse:
    asked = request.match_info["name"]
    m = request.app[SCHED].slots.route(asked)
    path = "/" + request.match_info["tail"] + (f"?{request.query_string}" if request.query_string else "")
    return await forward(request, m, path, await read_body(request), asked)


@dataclass
class Seen:
    """What one request went through, for the access log and the token counts."""

    queue_wait_s: float = 0.0
    generation_wait_s: float = 0.0
    upstream_s: float = 0.0
    stream: bool = False
    usage: Usage = field(default_factory=Usage)
    speed: float | None = None  # tokens out per second of a 2xx answer that said its tokens
    refusal: str | None = None


async def forward(request: web.Request, m: Model, path: str, body: bytes, asked: str) -> web.StreamResponse:
    """Relay one request to the model's worker, through its slot and the generation budget; the answer names the
    model as the client `asked` for it."""
    app, t0 = request.app, time.monotonic()
    code = 499  # the client went away before an answer
    seen = Seen()
    try:
        if m.port is None:
            raise Refused(f"model {m.name} has no port: the gateway cannot route to it", "no_port")
        sched = app[SCHED]
        for attempt in (1, 2):
            try:
                async with sched.slots.slot(m, admit_of(request)) as queued:
                    seen.queue_wait_s += queued
                    # the stack's generation budget (policy.max_generating): highest priority first, then FIFO
                    async with sched.generation.hold(m.plan.generation_weight, m.plan.priority) as waited:
                        app[METRICS].generation_wait(m.name, waited)
                        seen.generation_wait_s += waited
                        resp = await _relay(request, m, path, body, seen, asked)
                break
            except Refused as exc:
                # no answer began from a worker that stopped answering or died under the request (a crash
                # supervisord is restarting): wait for it like any request for a starting worker, once
                if exc.code not in ("upstream_unreachable", "upstream_disconnected") or attempt == 2:
                    raise
        code = resp.status
        return resp
    except Refused as exc:
        code, seen.refusal = HTTP_STATUS[exc.code], exc.code
        return refused(exc)
    finally:
        _account(app, request, m, code, time.monotonic() - t0, seen)


def _account(app: web.Application, request: web.Request, m: Model, code: int, latency: float, seen: Seen) -> None:
    """The request's figures into /metrics, the page's history and one access log line."""
    usage = seen.usage
    speed = seen.speed if 200 <= code < 300 else None
    app[METRICS].request(m.name, code, latency, usage)
    app[SCHED].answered.add(
        Answered(
            time.time(),
            m.name,
            code,
            latency,
            seen.queue_wait_s,
            usage.tokens_in,
            usage.tokens_out,
            speed,
            usage.prompt_speed,
        )  # fmt: skip
    )
    entry: dict[str, Any] = {
        "model": m.name,
        "method": request.method,
        "path": request.path,
        "status": code,
        "queue_wait_s": round(seen.queue_wait_s, 4),
        "latency_s": round(latency, 4),
        "tokens_in": usage.tokens_in,
        "tokens_out": usage.tokens_out,
        "tokens_per_s": None if speed is None else round(speed, 2),
        "tokens_from": usage.source,
        "stream": seen.stream,
    }
    if seen.generation_wait_s:
        entry["generation_wait_s"] = round(seen.generation_wait_s, 4)
    if seen.refusal is not None:
        entry["error"] = seen.refusal
    app[ACCESS].write(entry)


def _answered(traffic: Traffic, seen: Seen, status: int, seconds: float, usage: Usage) -> None:
    """The worker's answer is through: its tokens onto the model's traffic (before its slot is let go, so the state
    the release publishes has them)."""
    seen.upstream_s, seen.usage = seconds, usage
    seen.speed = traffic.answered(usage, status, seconds)


def _names_model(content_type: str) -> bool:
    """An answer whose model field the gateway rewrites: JSON, an event stream, NDJSON (never audio or images)."""
    return "json" in content_type or "event-stream" in content_type


async def _relay(request: web.Request, m: Model, path: str, body: bytes, seen: Seen, asked: str) -> web.StreamResponse:
    token = request.app.get("token")
    headers = {
        k: v
        for k, v in request.headers.items()
        if k.lower() not in HOP_BY_HOP and not (token and k.lower() == "authorization")
    }
    url = f"http://127.0.0.1:{m.port}{path}"
    sched = request.app[SCHED]
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=sched.gw.upstream_timeout_s)
    began = time.monotonic()
    try:
        async with request.app[CLIENT].request(
            request.method, url, data=body or None, headers=headers, timeout=timeout
        ) as up:
            out = {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}
            ctype = up.headers.get("Content-Type", "")
            if up.content_length is not None and not ctype.startswith("text/event-stream"):
                data = await up.read()
                _answered(sched.traffic[m.name], seen, up.status, time.monotonic() - began, read_usage(data))
                data = renamed(data, asked) if _names_model(ctype) else data
                return web.Response(body=data, status=up.status, headers=out)
            resp = web.StreamResponse(status=up.status, headers=out)
            await resp.prepare(request)
            seen.stream = True
            reader = StreamReader()
            names = StreamRenamer(asked) if _names_model(ctype) else None
            try:
                async for chunk in up.content.iter_any():
                    reader.feed(chunk)
                    if names is None:
                        await resp.write(chunk)
                    elif piece := names.feed(chunk):
                        await resp.write(piece)
                if names is not None and (tail := names.rest()):
                    await resp.write(tail)
                await resp.write_eof()
            except (ConnectionResetError, aiohttp.ClientPayloadError):
                pass  # one side went away mid-stream; leaving the block closes the upstream connection
            except TimeoutError:  # the worker stopped sending mid-stream: end the stream, mark it
                sched.sync.mark_unhealthy(m, f"no byte for {sched.gw.upstream_timeout_s:g} s while streaming")
            _answered(sched.traffic[m.name], seen, up.status, time.monotonic() - began, reader.usage())
            return resp
    except aiohttp.ClientConnectorError as exc:
        sched.sync.worker_lost(m, "not answering on its port")  # the next request waits for it
        raise Refused(
            f"worker {m.name} is not answering on port {m.port}: {exc.strerror or exc}", "upstream_unreachable"
        ) from None
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        # before any byte of an answer: the worker died under the request (a kill, a crash); supervisord
        # restarts it, and forward() sends the request again once it is back
        sched.sync.worker_lost(m, "closed the connection")
        raise Refused(f"worker {m.name} closed the connection: {exc}", "upstream_disconnected") from None
    except TimeoutError:
        waited = sched.gw.upstream_timeout_s
        sched.sync.mark_unhealthy(m, f"no answer within {waited:g} s")
        raise Refused(
            f"worker {m.name} did not answer within {waited:g} s (gateway.upstream_timeout); it is "
            "marked unhealthy until its health URL answers again",
            "upstream_timeout",
            10,
        ) from None


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
            "reason": None if decision.fits else decision.reason(need),
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
    await _json_object(request)
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
    doc = await _json_object(request)
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


async def _json_object(request: web.Request) -> dict[str, Any]:
    raw = await read_body(request)
    try:
        doc = strict_json(raw) if raw else {}
    except ValueError as exc:
        raise Refused(str(exc) if isinstance(exc, TooDeep) else "request body is not JSON", "invalid_json") from None
    if not isinstance(doc, dict):
        raise Refused("request body must be a JSON object", "invalid_json")
    return doc


async def pressure(request: web.Request) -> web.Response:
    """The enforcer's request (umemc-internal): pressure is above evict_above; the gateway decides
    whom to stop, as it does for every eviction while it runs."""
    doc = await _json_object(request)
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
    doc = await _json_object(request)
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


def browser_guard(hosts: frozenset[str] | None) -> Any:
    """What a hostile web page can make a browser send to loopback, refused before anything else:
    a foreign Host (DNS rebinding), a cross-origin request (Origin, Sec-Fetch-Site), and a body of
    a type a page may send without a CORS preflight (text/plain, forms) to a JSON endpoint (CSRF)."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        host = request.headers.get("Host", "").lower()
        if hosts is not None and host not in hosts:
            return error(
                403, f"Host {host!r} is not this gateway's address (use 127.0.0.1 or localhost)", "forbidden_host"
            )
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
        return await handler(request)

    return guard


def _multipart_allowed(path: str) -> bool:
    return path.startswith(("/v1/", "/models/"))  # audio uploads; never the umemc API


def _accepted_type(request: web.Request) -> bool:
    """JSON (multipart for uploads to workers). No Content-Type at all only on the OpenAI routes and the
    passthrough (clients that post JSON without saying so; a browser sends a typeless body only with an Origin,
    refused): umemc's own API, which grants memory and evicts, takes JSON that says it is JSON."""
    if "Content-Type" not in request.headers:
        return _multipart_allowed(request.path)
    ctype = request.content_type.lower()
    if ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json")):
        return True
    return ctype == "multipart/form-data" and _multipart_allowed(request.path)


def bearer(token: str) -> Any:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in TOKENLESS_PATHS:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                resp = error(401, "this gateway needs Authorization: Bearer <token>", "unauthorized")
                resp.headers["WWW-Authenticate"] = "Bearer"
                return resp
        return await handler(request)

    return check


@web.middleware
async def refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A handler raises Refused; it is answered here (OpenAI-shaped, with Retry-After)."""
    try:
        return await handler(request)
    except Refused as exc:
        return refused(exc)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SCHED].gw.max_body_bytes
        return error(413, f"request body larger than {limit} bytes (gateway.max_body)", "body_too_large")


def make_app(sched: Scheduler, token: str | None) -> web.Application:
    gw = sched.gw
    guards = [browser_guard(allowed_hosts(gw.host, gw.port)), *([bearer(token)] if token else [])]
    app = web.Application(client_max_size=gw.max_body_bytes, middlewares=[*guards, refusals])
    app[SCHED] = sched
    app[METRICS] = sched.metrics = Metrics(sched)
    app[ACCESS] = AccessLog(sched.run.access_log)
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
    app.router.add_post("/umemc/models/{name}/{action}", model_action)
    app.router.add_post("/umemc/pressure", pressure)
    app.router.add_get("/metrics", metrics)
    app.cleanup_ctx.append(_lifetime)
    return app


async def _lifetime(app: web.Application) -> Any:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
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
