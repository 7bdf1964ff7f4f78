"""Relaying a request to a model's worker: the body read within its bounds, the model it names, its slot and the
generation budget, the call to the worker with every way it can fail said as a refusal, the answer renamed to what
the client asked for, and the figures (metrics, the page's history, the access log). Every client API (OpenAI's
routes, the passthrough, Ollama's) goes through `forward`; each gives its own `Relay` for what it does with the
worker's answer.

Responses with a Content-Length are relayed whole; anything else (SSE, chunked) is relayed chunk by chunk as it
arrives. A client that goes away cancels its handler (handler_cancellation), which closes the upstream connection,
so the worker stops generating."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from aiohttp import web

from .app_keys import CAPTURES, POOL, SCHED, TOKEN
from .bodies import TooDeep, admit_of, strict_json
from .ledger import Entry
from .model import Model, Refused
from .naming import StreamRenamer, renamed
from .progress import Progress
from .scheduler import Scheduler
from .surfaces import HTTP_STATUS, SURFACES, surface_of
from .upstream import Answer, PayloadError, Pool, TooLarge, Unreachable
from .usage import NO_USAGE, StreamReader, Usage, read_usage

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
        "expect",  # the gateway has the whole body already: nothing to wait for a 100 Continue for
    )
)


@lru_cache(maxsize=1024)  # a worker answers with the same few names: looked up, not lowered, on each answer
def from_worker(name: str) -> bool:
    """A worker's answer header the client may see: not hop-by-hop, and nothing that would speak for the gateway's
    origin (a cookie set for it, CORS that would let any page read the answers: docs/SECURITY.md sends none)."""
    low = name.lower()
    return low not in HOP_BY_HOP and low not in ("set-cookie", "set-cookie2") and not low.startswith("access-control-")


TOKEN_HEADERS = frozenset(("authorization", "x-api-key"))  # where a client may carry it (surfaces.py)


@lru_cache(maxsize=1024)  # a client sends the same few names
def to_worker(name: str, token: bool) -> bool:
    """A request header the worker is sent: not hop-by-hop, and never the gateway's token where one is set."""
    low = name.lower()
    return low not in HOP_BY_HOP and not (token and low in TOKEN_HEADERS)


@dataclass(slots=True)
class Seen:
    """What one request went through, for the access log and the token counts."""

    queue_wait_s: float = 0.0
    granted: bool = False  # it held a slot (its waits are in the queue and generation wait series)
    generation_wait_s: float = 0.0
    upstream_s: float = 0.0
    stream: bool = False
    usage: Usage = NO_USAGE
    speed: float | None = None  # tokens out per second of a 2xx answer that said its tokens
    refusal: str | None = None
    begun: web.StreamResponse | None = None  # the event stream its wait's progress began (the answer goes on in it)
    head: bytes = b""  # the answer's first bytes, for gateway.capture
    head_limit: int = 0
    sent: int = 0  # every byte of the answer the client got, kept or not (a capture says whether it was cut)

    def keep(self, data: bytes) -> None:
        """The answer as the client gets it, its first head_limit bytes (gateway.capture; 0: nothing kept)."""
        self.sent += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]


class Call(NamedTuple):
    """What is asked of the worker: the request's method, path and body, and the model's name as the client asked
    for it (its answers say that name)."""

    method: str
    path: str
    body: bytes
    asked: str


Relay = Callable[[web.Request, Model, Call, "Seen"], Awaitable[web.StreamResponse]]

# What an engine is told the model is, whatever name the client asked by: vLLM answers only to its served name (the
# stack's name; an alias or a shared name would be a 404), and mlx-lm loads whatever a request's "model" names, a
# path or a Hub repository, in the worker's own memory: only its own ("default_model") may reach it, with none of
# its other fields that load something (a draft model, adapters).
ENGINE_MODEL = {"vllm": None, "mlx": "default_model"}
ENGINE_LOADS = ("draft_model", "adapters")


def for_worker(m: Model, body: bytes) -> bytes:
    """The request body as the model's worker is sent it: for vLLM and MLX, a JSON object whose "model" is the
    worker's own name for the model, and mlx-lm's loading fields dropped; anything else as it came. A body an engine
    would read as a JSON object that the gateway cannot read as strict JSON is refused (Python's json module, the
    engines', takes NaN and any depth: such a body must not carry a "model" past the rewrite)."""
    runtime = m.plan.runtime
    if runtime not in ENGINE_MODEL or body.lstrip()[:1] != b"{":  # no JSON object (a multipart upload): as it came
        return body
    try:
        doc = strict_json(body)
    except ValueError as exc:
        raise Refused(str(exc) if isinstance(exc, TooDeep) else "request body is not JSON", "invalid_json") from None
    if not isinstance(doc, dict):
        return body
    doc["model"] = ENGINE_MODEL[runtime] or m.name
    if runtime == "mlx":
        for key in ENGINE_LOADS:
            doc.pop(key, None)
    return json.dumps(doc).encode()


async def forward(
    request: web.Request, m: Model, call: Call, relay: Relay | None = None, progress: Progress | None = None
) -> web.StreamResponse:
    """Send one request to the model's worker, through its slot and the generation budget; `relay` (default: the
    answer as the worker gives it, renamed) makes the client's answer; `progress` says a long wait in the stream."""
    app, t0 = request.app, time.monotonic()
    code = 499  # the client went away before an answer
    captures = app[CAPTURES]
    seen = Seen(head_limit=captures.limit if captures.on else 0)
    try:
        body = for_worker(m, call.body)
        if body is not call.body:  # an engine's own model name in it (most runtimes take the body as it came)
            call = call._replace(body=body)
        if m.port is None:
            raise Refused(f"model {m.name} has no port: the gateway cannot route to it", "no_port")
        sched = app[SCHED]
        for attempt in (1, 2):
            try:
                waiting = None if progress is None else progress.run
                async with sched.slots.slot(m, admit_of(request), waiting) as queued:
                    seen.queue_wait_s += queued
                    seen.granted = True
                    seen.begun = None if progress is None else progress.resp
                    # the stack's generation budget (policy.max_generating): highest priority first, then FIFO
                    async with sched.generation.hold(m.plan.generation_weight, m.plan.priority) as waited:
                        seen.generation_wait_s += waited
                        resp = await (relay or pass_through)(request, m, call, seen)
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
        if progress is not None and progress.resp is not None:  # the stream began while it waited
            return await progress.fail(exc, code)
        return surface_of(app[SURFACES], request.path).answer(exc)
    finally:
        _account(app, request, m, code, time.monotonic() - t0, seen)
        if captures.on:
            captures.add(m.name, call.method, call.path, code, call.body, bytes(seen.head), seen.sent)


def _account(app: web.Application, request: web.Request, m: Model, code: int, latency: float, seen: Seen) -> None:
    """The request's figures, kept for /metrics, the page's history and one access log line (ledger.py)."""
    speed = seen.speed if 200 <= code < 300 else None
    app[SCHED].ledger.add(Entry(time.time(), m.name, request.method, request.path, code, latency, seen.queue_wait_s,
                                seen.generation_wait_s, seen.usage, speed, seen.stream, seen.refusal,
                                seen.granted))  # fmt: skip


async def _go_on(
    request: web.Request, m: Model, call: Call, seen: Seen, up: Answer, began: float
) -> web.StreamResponse:
    """The worker's answer into the event stream the wait's progress began (its status and headers are sent): a
    stream goes on as it comes; anything else (an error) is one data event, as OpenAI streams errors."""
    resp = seen.begun
    assert resp is not None
    seen.stream = True
    if not up.headers.get("Content-Type", "").startswith(SSE):
        try:
            data = await up.read(WHOLE_LIMIT)
        except PayloadError as exc:  # too large, or cut: said as OpenAI streams say an error
            data = json.dumps({"error": {"message": f"worker {m.name}: {exc}", "type": "server_error"}}).encode()
        answered(request, m, seen, up.status, began, read_usage(data))
        event = b"data: " + renamed(data, call.asked).strip() + b"\n\n"
        seen.keep(event)
        await resp.write(event)
        await resp.write_eof()
        return resp
    await _stream_into(request, m, seen, up, resp, StreamRenamer(call.asked), began)
    return resp


async def _stream_into(
    request: web.Request,
    m: Model,
    seen: Seen,
    up: Answer,
    resp: web.StreamResponse,
    names: StreamRenamer | None,
    began: float,
) -> None:
    """The worker's stream into the client's response as it arrives (renamed where `names`), its tokens counted.
    One side going away, or the worker falling silent, ends it: leaving closes the upstream connection."""
    seen.stream = True
    reader = StreamReader()
    keep = seen.head_limit > 0  # gateway.capture

    def each(chunk: bytes) -> bytes:
        piece = chunk if names is None else names.feed(chunk)  # renamed: whole lines
        if piece:
            reader.feed(piece)
            if keep:
                seen.keep(piece)
        return piece

    try:
        await pipe(request, resp, up, each)
        if names is not None and (tail := names.rest()):
            reader.feed(tail)
            seen.keep(tail)
            await resp.write(tail)
        await resp.write_eof()
    except STREAM_ENDS as exc:
        said = surface_of(request.app[SURFACES], request.path).stream_error
        await stream_failed(request, m, resp, exc, said if up.headers.get("Content-Type", "").startswith(SSE) else None)
    answered(request, m, seen, up.status, began, reader.usage())


async def pipe(request: web.Request, resp: web.StreamResponse, up: Answer, each: Callable[[bytes], bytes]) -> None:
    """The worker's answer into the begun response `resp` as it comes, each piece as `each` makes it, from the worker
    connection's own callback (a streamed token wakes no task); a client slower than the worker holds it back (its
    connection drained, the worker's paused: upstream.HIGH_WATER). The answer's end is the caller's to write."""
    write = _client_writer(request, resp)

    def sink(chunk: bytes) -> bool:
        piece = each(chunk)
        return write(piece) if piece else True

    while await up.pipe(sink):  # the client takes no more for now: on once it has drained
        await request.writer.drain()


def _client_writer(request: web.Request, resp: web.StreamResponse) -> Callable[[bytes], bool]:
    """A function that writes a piece of a begun answer straight to the client's connection, in the framing aiohttp
    chose for it (chunked for HTTP/1.1, the bare bytes for HTTP/1.0), from the worker connection's own callback (a
    streamed token wakes no task: aiohttp's `write` is a coroutine); it answers False once the connection holds more
    unsent than its high-water mark (then aiohttp's writer drains it). The answer's end goes through aiohttp."""
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("the client went away")
    high = transport.get_write_buffer_limits()[1]
    chunked = resp.headers.get("Transfer-Encoding") == "chunked"

    def write(piece: bytes) -> bool:
        if transport.is_closing():
            raise ConnectionResetError("the client went away")
        transport.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
        return transport.get_write_buffer_size() <= high

    return write


def _names_model(content_type: str) -> bool:
    """An answer whose model field the gateway rewrites: JSON, an event stream, NDJSON (never audio or images)."""
    return "json" in content_type or "event-stream" in content_type


def upstream(request: web.Request, m: Model, call: Call, headers: dict[str, str]) -> Upstream:
    """The worker's answer to `call`; a worker that cannot be reached, drops the connection before answering or
    stays silent past gateway.upstream_timeout is a refusal (forward() sends the request again, once, where the
    worker went away before any byte of an answer). A silence in the body's middle ends its read with a
    TimeoutError (upstream.Answer.watch)."""
    return Upstream(request, m, call, headers)


class Upstream:
    """upstream()'s context: an object, not a generator (one is made for every request)."""

    __slots__ = ("request", "m", "call", "headers", "up")

    def __init__(self, request: web.Request, m: Model, call: Call, headers: dict[str, str]) -> None:
        self.request, self.m, self.call, self.headers = request, m, call, headers

    async def __aenter__(self) -> Answer:
        sched, m = self.request.app[SCHED], self.m
        assert m.port is not None
        try:
            self.up = await _ask(self.request.app[POOL], self.call, m.port, self.headers, sched.gw.upstream_timeout_s)
        except Unreachable as exc:
            sched.sync.worker_lost(m, "not answering on its port")  # the next request waits for it
            raise Refused(f"worker {m.name} is not answering on port {m.port}: {exc}", "upstream_unreachable") from None
        except ConnectionError as exc:  # Disconnected, or a PayloadError before the whole head
            # before any byte of an answer: the worker died under the request (a kill, a crash); supervisord
            # restarts it, and forward() sends the request again once it is back
            sched.sync.worker_lost(m, "closed the connection")
            raise Refused(f"worker {m.name} closed the connection: {exc}", "upstream_disconnected") from None
        except TimeoutError:
            raise _silent(sched, m) from None
        except ValueError as exc:  # a target or header that would split the request: never sent
            raise Refused(f"request not sent to worker {m.name}: {exc}", "bad_request") from None
        return self.up

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if kind is None:
            self.up.release()  # back to the pool where the answer was read to its end, else closed
            return
        self.up.close()  # the client went away, or a failure: the worker's connection closes (it stops)
        if issubclass(kind, TimeoutError):  # a whole answer's body fell silent (a stream's end is its reader's)
            raise _silent(self.request.app[SCHED], self.m) from None
        if issubclass(kind, TooLarge):
            raise Refused(f"worker {self.m.name}: {exc}", "upstream_too_large") from None
        if issubclass(kind, PayloadError):  # a body read whole that was cut (a stream's is its reader's)
            raise Refused(f"worker {self.m.name} cut its answer: {exc}", "upstream_cut") from None


async def _ask(pool: Pool, call: Call, port: int, headers: dict[str, str], waited: float) -> Answer:
    """The answer's head within `waited` s (its body is then watched for silences as long). A connection closed
    before any byte of it is asked again at once, once: a kept-alive connection the worker closed as the gateway
    took it from the pool (its idle timeout) is no failure of the worker; a worker that is gone refuses the second
    connection."""
    for again in (False, True):
        try:
            return await pool.request(call.method, port, call.path, headers, call.body or None, waited)
        except Unreachable:
            raise
        except ConnectionError:
            if again:
                raise
    raise AssertionError("unreachable")


def _silent(sched: Scheduler, m: Model) -> Refused:
    waited = sched.gw.upstream_timeout_s
    sched.sync.mark_unhealthy(m, f"no answer within {waited:g} s")
    return Refused(
        f"worker {m.name} did not answer within {waited:g} s (gateway.upstream_timeout); it is "
        "marked unhealthy until its health URL answers again",
        "upstream_timeout",
        10,
    )


def answered(request: web.Request, m: Model, seen: Seen, status: int, began: float, usage: Usage) -> None:
    """The worker's answer is through: its tokens onto the model's traffic (before its slot is let go, so the state
    the release publishes has them)."""
    seen.upstream_s, seen.usage = time.monotonic() - began, usage
    seen.speed = request.app[SCHED].traffic[m.name].answered(usage, status, seen.upstream_s)


def stream_ended(request: web.Request, m: Model, exc: BaseException) -> None:
    """A stream cut in the middle: a side that went away ends it quietly; a worker silent past upstream_timeout is
    marked unhealthy."""
    if isinstance(exc, TimeoutError):
        sched = request.app[SCHED]
        sched.sync.mark_unhealthy(m, f"no byte for {sched.gw.upstream_timeout_s:g} s while streaming")


async def stream_failed(
    request: web.Request,
    m: Model,
    resp: web.StreamResponse,
    exc: BaseException,
    event: Callable[[str], bytes] | None,
) -> None:
    """A stream the worker cut (or fell silent in) after its status went out: a 200 must never stand for it. An event
    stream (or NDJSON) ends with an error `event` a client reads as one; any other body is aborted, so the client's
    transfer fails instead of ending cleanly short. A client that went away is told nothing."""
    stream_ended(request, m, exc)
    if isinstance(exc, ConnectionResetError):
        return
    why = f"worker {m.name} cut its answer: {exc}" if isinstance(exc, PayloadError) else f"worker {m.name}: {exc}"
    if event is not None:
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await resp.write(event(why))
            await resp.write_eof()
        return
    if request.transport is not None:
        request.transport.abort()


STREAM_ENDS = (ConnectionResetError, PayloadError, TimeoutError)
SSE = "text/event-stream"
WHOLE_LIMIT = 64 << 20  # an answer read whole to be renamed or translated; a larger one is piped, or refused (502)


async def pass_through(request: web.Request, m: Model, call: Call, seen: Seen) -> web.StreamResponse:
    """The worker's answer as it gives it (its headers less the hop-by-hop ones), its model fields renamed."""
    token: str | None = request.app.get(TOKEN)
    sent = bool(token)
    headers = {k: v for k, v in request.headers.items() if to_worker(k, sent)}
    began = time.monotonic()
    async with upstream(request, m, call, headers) as up:
        out = {k: v for k, v in up.headers.items() if from_worker(k)}
        ctype = up.headers.get("Content-Type", "")
        if seen.begun is not None:
            return await _go_on(request, m, call, seen, up, began)
        if up.content_length is not None and up.content_length <= WHOLE_LIMIT and not ctype.startswith(SSE):
            data = await up.read(WHOLE_LIMIT)
            # a count of a prompt's tokens (Anthropic's count_tokens) is no prompt the model read
            usage = NO_USAGE if call.path.endswith("/count_tokens") else read_usage(data)
            answered(request, m, seen, up.status, began, usage)
            data = renamed(data, call.asked) if _names_model(ctype) else data
            if up.status >= 400 and "json" in ctype:  # said in the API's shape, where it has one of its own
                surface = surface_of(request.app[SURFACES], request.path)
                if surface.worker_error is not None:
                    data = surface.worker_error(data, up.status)
            seen.keep(data)
            return web.Response(body=data, status=up.status, headers=out)
        resp = web.StreamResponse(status=up.status, headers=out)
        await resp.prepare(request)
        # an event stream renamed line by line; any other body (a large JSON answer) as it comes, cut between fields
        names = StreamRenamer(call.asked, lines=ctype.startswith(SSE)) if _names_model(ctype) else None
        await _stream_into(request, m, seen, up, resp, names, began)
        return resp
