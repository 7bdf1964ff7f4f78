"""The guards in front of every route of the gateway, one door for them all: the browser guard (a page on another
name that resolves to loopback, DNS rebinding; a cross-site form or fetch, CSRF: the Host, Origin and content-type
rules), the bearer token, and the answer to a refusal raised anywhere below."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import web

from . import peers
from .app_keys import SCHED
from .model import Refused, Remote
from .surfaces import Surface, surface_of

MUTATING = frozenset(("POST", "PUT", "PATCH", "DELETE"))


OPEN_PATHS = frozenset(("/umemc/health",))  # liveness only: says nothing about the stack


# the status page's HTML holds no data (it fetches the API with the token from its URL fragment): a browser
# must be able to open it without a header; the Host/Origin rules still apply to it
TOKENLESS_PATHS = OPEN_PATHS | {"/ui"}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


def guarded(
    routes: Iterable[web.RouteDef], hosts: frozenset[str] | None, token: str | None, surfaces: tuple[Surface, ...]
) -> list[web.RouteDef]:
    """`routes`, each handler behind the door. The door is each handler's own first step, not aiohttp middleware
    (a middleware layer, and the second layer aiohttp then adds, cost every request two more coroutines: 4% of an
    instant request's CPU); a path no route matches gets aiohttp's bare 404 or 405, which says nothing of the
    stack. What a hostile web page can make a browser send to loopback is refused before anything else (a foreign
    Host: DNS rebinding; a cross-origin request: Origin, Sec-Fetch-Site; a body of a type a page may send without
    a CORS preflight, text/plain or a form, to a JSON endpoint: CSRF), then a request without the token (in a header
    the path's client API carries it in: `surfaces`); every refusal, the door's or a handler's Refused, is answered
    here in that API's own shape."""

    def behind_door(handler: Handler) -> Handler:
        async def door(request: web.Request) -> web.StreamResponse:
            path = request.path
            if path in OPEN_PATHS:
                return await handler(request)
            surface = surface_of(surfaces, path)
            refusal = _browser_refusal(request, hosts)
            if refusal is not None:
                return surface.refuse(*refusal, None)
            if token is not None and path not in TOKENLESS_PATHS and not surface.token_given(request, token):
                resp = surface.refuse(401, f"this gateway needs {surface.token_help()}", "unauthorized", None)
                resp.headers["WWW-Authenticate"] = "Bearer"
                return resp
            try:
                try:
                    return await handler(request)
                except Remote as remote:  # another node serves the model: its gateway answers
                    sched = request.app[SCHED]
                    timeout = sched.gw.upstream_timeout_s
                    return await peers.forward(request, remote, sched.plan.node or "", token, timeout)
            except Refused as exc:
                return surface.answer(exc)
            except web.HTTPRequestEntityTooLarge:
                limit = request.app[SCHED].gw.max_body_bytes
                said = f"request body larger than {limit} bytes (gateway.max_body)"
                return surface.refuse(413, said, "body_too_large", None)

        return door

    return [web.RouteDef(r.method, r.path, behind_door(r.handler), r.kwargs) for r in routes]


def _browser_refusal(request: web.Request, hosts: frozenset[str] | None) -> tuple[int, str, str] | None:
    """What a page may have made a browser send, as (status, message, code); None for anything else."""
    host = request.headers.get("Host", "").lower()
    if hosts is not None and host not in hosts:
        return 403, f"Host {host!r} is not this gateway's address (use 127.0.0.1 or localhost)", "forbidden_host"
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc.lower() != host:
        return 403, f"cross-origin request from {origin!r} refused", "cross_origin"
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return 403, f"cross-site request refused (Sec-Fetch-Site: {site})", "cross_origin"
    strict = _from_browser(request) or not _typeless_allowed(request.path)  # umemc's own API: JSON that says so
    if request.method in MUTATING and request.body_exists and strict and not _accepted_type(request):
        return (
            415,
            f"Content-Type {request.content_type!r} is not accepted here: send application/json"
            + (" or multipart/form-data" if _multipart_allowed(request.path) else ""),
            "unsupported_media_type",
        )
    return None


BROWSER_HEADERS = ("Origin", "Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest")


def _from_browser(request: web.Request) -> bool:
    """Whether a browser may have sent it: every browser a page runs in sends Origin with a cross-origin POST and
    the Sec-Fetch-* headers with every request. One without any is no page's form (curl -d, llama.cpp's and
    llama-swap's examples post JSON as application/x-www-form-urlencoded): on the routes clients post to (OpenAI's,
    Ollama's, the router's) its body is read as JSON whatever its Content-Type. A browser's request must say JSON:
    a form cannot; umemc's own API (it grants memory and evicts) always wants JSON that says so."""
    headers = request.headers
    return any(h in headers for h in BROWSER_HEADERS)


def _multipart_allowed(path: str) -> bool:
    return path.startswith(("/v1/", "/models/"))  # audio uploads; never the umemc API


def _typeless_allowed(path: str) -> bool:
    return _multipart_allowed(path) or path.startswith("/api/")  # clients of these APIs post JSON unlabelled


def _accepted_type(request: web.Request) -> bool:
    """JSON (multipart for uploads to workers). No Content-Type at all only on the OpenAI routes and the
    passthrough (clients that post JSON without saying so; a browser sends a typeless body only with an Origin,
    refused): umemc's own API, which grants memory and evicts, takes JSON that says it is JSON."""
    raw = request.headers.get("Content-Type")
    if raw is None:
        return _typeless_allowed(request.path)
    if raw == "application/json":  # what nearly every client sends: nothing to parse
        return True
    ctype = request.content_type.lower()
    if ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json")):
        return True
    return ctype == "multipart/form-data" and _multipart_allowed(request.path)
