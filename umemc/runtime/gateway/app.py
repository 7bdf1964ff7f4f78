"""The gateway's HTTP side (aiohttp on uvloop where installed): the OpenAI-compatible routes by the request's
`model`, `/models/<name>/…` pass-through, /umemc/status, can-load, pressure and /metrics, and the application that
puts every surface together, each adding its own routes: the status page's (page.py), the lease API (leasing.py),
Ollama's API (ollama.py), llama.cpp router's model routes (router.py), all behind one guard (door.py). Relaying to
a worker is relay.py's."""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

from aiohttp import web

from . import anthropic, leasing, ollama, page, router, views
from .access import AccessLog
from .app_keys import ACCESS, CAPTURES, METRICS, POOL, SCHED, TOKEN
from .bodies import json_object, model_of, read_body, strict_json
from .door import allowed_hosts, guarded
from .metrics import Metrics
from .model import Model, Refused
from .peers import PEER_POOLS
from .progress import STREAMS, Progress
from .relay import Call, forward
from .request_capture import Captures
from .scheduler import Scheduler
from .surfaces import OPENAI, SURFACES
from .upstream import Pool

PROBE_LIMIT = 64 * 1024

HOT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")  # most requests of most clients


async def openai(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    asked = model_of(request.headers.get("Content-Type", ""), body)
    m = request.app[SCHED].slots.route(asked)
    if b'"keep_alive"' in body and not request.content_type.startswith(
        "multipart/"
    ):  # Ollama's per-request keep_alive, on these routes too (parsed only when there)
        doc = strict_json(body)
        request.app[SCHED].process.keep_alive(
            m, ollama.keep_alive_of(doc.get("keep_alive") if isinstance(doc, dict) else None)
        )
    call = Call(request.method, request.path_qs, body, asked)
    return await forward(request, m, call, progress=_progress(request, m, asked, body))


def _progress(request: web.Request, m: Model, asked: str, body: bytes) -> Progress | None:
    """A streamed chat or completion for a model that is not ready is told what it waits for (progress.py)."""
    sched = request.app[SCHED]
    style = sched.gw.loading_progress
    if style == "off" or m.ready or not request.path.endswith("/completions") or not STREAMS.search(body):
        return None
    return Progress(request, sched.process.stage, m, asked, style, chat=request.path.endswith("/chat/completions"))


PATH_SAFE = "/:@!$&'()*+,;="  # kept as they are (RFC 3986's sub-delims, ':', '@' and '/'); the rest encoded


async def passthrough(request: web.Request) -> web.StreamResponse:
    asked = request.match_info["name"]
    m = request.app[SCHED].slots.route(asked)
    # the target as the client encoded it (match_info and query_string are decoded: a %0A would be a line break)
    query = request.rel_url.raw_query_string
    path = "/" + urllib.parse.quote(request.match_info["tail"], safe=PATH_SAFE) + (f"?{query}" if query else "")
    return await forward(request, m, Call(request.method, path, await read_body(request), asked))


async def list_models(request: web.Request) -> web.Response:
    sched = request.app[SCHED]
    data: list[dict[str, Any]] = []
    for m in sched.served():
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
    here = sched.plan.node
    if here is not None:  # a stack of several nodes: where each runs, and every other node's models
        for entry in data:
            entry["umemc"]["node"] = here
        for name, peer in sched.plan.peers.items():
            info = {"node": peer.node, "remote": True}
            data += [
                {"id": n, "object": "model", "created": 0, "owned_by": "umemc", "umemc": info}
                | ({"root": name} if n != name else {})
                for n in (name, *peer.aliases)
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
        decision = sched.admission.decide_model(m)
    need = sched.admission.need_for(m)
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


async def pressure(request: web.Request) -> web.Response:
    """The enforcer's request (umemc-internal): pressure is above evict_above; the gateway decides
    whom to stop, as it does for every eviction while it runs."""
    doc = await json_object(request)
    value = doc.get("pressure")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise Refused(f'"pressure" must be a number 0-100 (got {value!r})', "invalid_json")
    return web.json_response(await request.app[SCHED].actions.relieve_pressure(float(value)))


ROUTES = (
    web.get("/v1/models", list_models),
    *(web.post(path, openai) for path in HOT_PATHS),  # found by the router's path index, before the pattern below
    web.post("/v1/{tail:.+}", openai),
    web.route("*", "/models/{name}/{tail:.*}", passthrough),
    web.get("/umemc/health", health),
    web.get("/umemc/status", status),
    web.get("/umemc/can-load/{model}", can_load),
    web.post("/umemc/pressure", pressure),
    web.get("/metrics", metrics),
)


def make_app(sched: Scheduler, token: str | None) -> web.Application:
    gw = sched.gw
    app = web.Application(client_max_size=gw.max_body_bytes)
    app[SCHED] = sched
    app[METRICS] = sched.process.metrics = Metrics(sched)  # the process counts cold starts and evictions in them
    app[ACCESS] = AccessLog(sched.run.access_log)
    sched.ledger.attach(app[METRICS], app[ACCESS])
    app[CAPTURES] = Captures(gw.capture, gw.capture_bytes)
    if token:
        app[TOKEN] = token
    app[PEER_POOLS] = {}  # connections to the other nodes' gateways, by host (peers.py)
    # the client APIs, each path's shape for refusals and its token's headers: the first that claims a path is its
    app[SURFACES] = (anthropic.SURFACE, ollama.SURFACE, OPENAI)
    # every route behind the door, each surface's in its table (the one place routes are added)
    app.router.add_routes(guarded(ROUTES + page.ROUTES + leasing.ROUTES + ollama.ROUTES + router.ROUTES,
                                  allowed_hosts(gw.host, gw.port), token, app[SURFACES]))  # fmt: skip
    app.cleanup_ctx.append(_lifetime)
    return app


async def _lifetime(app: web.Application) -> Any:
    pool = Pool()
    app[POOL] = pool
    sched = app[SCHED]

    async def probe(m: Model) -> bool:
        if m.port is None:
            return True
        try:
            answer = await pool.request("GET", m.port, m.plan.health or "/", {}, None, 2.0)
            async with asyncio.timeout(2.0):
                await answer.read(PROBE_LIMIT)  # a health answer is small: one without an end is no health
            answer.release()
            return answer.status == 200 if m.plan.health else True
        except (ConnectionError, TimeoutError, ValueError):
            return False

    sched.sync.probe = probe
    await sched.start()
    yield
    await sched.close()
    pool.close()
    for peer_pool in app[PEER_POOLS].values():
        peer_pool.close()
    app[ACCESS].close()
