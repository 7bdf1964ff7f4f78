"""The gateway's client for its workers: HTTP/1.1 over kept-alive loopback connections, the answers parsed by
httptools (llhttp, Node.js's HTTP parser, in C).

Why not aiohttp's client, which the gateway used before: on an instant worker it was a fifth of the gateway's CPU
per request (a request object, URL parsing, a connector, timers re-armed for every read), more than all the
gateway's own work of routing, admission and accounting; a worker on loopback needs none of it. What it did that
this does too:

- connections kept per port, idle ones closed after KEEP_ALIVE_S (under the workers' own keep-alive timeouts:
  cpp-httplib's under llama-server, uvicorn's 5 s), so the gateway rarely takes one the worker is closing;
- a worker's port that refuses is `Unreachable`; a connection closed before the whole head of an answer is
  `Disconnected` (the caller asks again once: a kept-alive connection the worker closed as it was taken); a body
  cut before its end is `PayloadError`;
- no byte of an answer for `timeout` seconds is a TimeoutError: for its head, at the deadline; for its body,
  one timer per answer looks every quarter of the limit whether bytes came (or wait unread: then the client is the
  slow side, not the worker), so a silence is caught after 1 to 1.25 times the limit;
- an answer read slower than it comes pauses the worker's socket past HIGH_WATER bytes held (TCP's own flow
  control then slows the worker), and resumes it once they are read;
- leaving an answer before its end (the client went away) closes its connection, so the worker stops generating;
- an interim answer (`100 Continue`, which a worker sends where the request said `Expect: 100-continue`) is
  skipped: the answer is the one after it.

What goes out is checked, not trusted: a request target or header with a control character or a space is refused
(ValueError) before a byte is written, so no value can split the request."""

from __future__ import annotations

import asyncio
import collections
import os
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

KEEP_ALIVE_S = 2.0
CONNECT_S = 10.0
HIGH_WATER = 256 * 1024
HEAD_LIMIT = 64 * 1024  # an answer's header fields, in all: a worker that sends more is broken
# an answer's head as it arrives (its status line and fields, whole or not): the parser keeps a field until its end,
# so a value without one would grow it unseen until the head's timeout; counted per piece instead
HEAD_BYTES_LIMIT = HEAD_LIMIT + 16 * 1024
_UNSAFE_TARGET = re.compile(r"[\x00-\x20\x7f]")  # a request target has no space or control character
_UNSAFE_FIELD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a header value may hold tabs, never a line break
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110's token)


class Unreachable(ConnectionError):
    """No connection to the worker's port (refused, or not made within CONNECT_S)."""


class Disconnected(ConnectionError):
    """The worker closed the connection before the whole head of an answer."""


class PayloadError(ConnectionError):
    """An answer's body ended before its end: the worker closed the connection, or what came is not HTTP."""


class TooLarge(PayloadError):
    """An answer read whole is larger than the gateway holds in memory for one answer."""


class Answer:
    """A worker's answer: its status and headers at once, its body read whole (`read`), as it comes (`chunk`) or
    handed on as it comes (`pipe`). `release` gives its connection back once the body was read to its end; `close`
    drops it."""

    def __init__(self, conn: _Conn, status: int, headers: CIMultiDictProxy[str], content_length: int | None):
        self.status, self.headers, self.content_length = status, headers, content_length
        self._conn = conn
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0  # bytes that came and wait to be read
        self._received = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._sink: Callable[[bytes], bool] | None = None  # where the body goes as it comes (pipe)
        self._full = False  # the sink said its client takes no more for now
        self._pending: list[bytes] = []  # pieces for the sink from the read being parsed (_flush hands them on)

    # -- fed by the connection
    def _feed(self, data: bytes) -> None:
        self._received += len(data)
        if self._sink is not None:  # piped: handed on once the connection's read is parsed (_flush), all in one
            self._pending.append(data)
            return
        self._chunks.append(data)
        self._held += len(data)
        if self._held > HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _flush(self) -> None:
        """The pieces of the body one read of the connection brought (a chunked stream's chunks, several to a read
        when the worker writes fast), into the sink as one: one write to the client, not one per chunk. From the
        connection's own callback: no task wakes for them."""
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        sink = self._sink
        assert sink is not None  # pieces wait here only for a sink, and only this detaches it within a read
        try:
            if sink(data):
                return
        except Exception as exc:  # noqa: BLE001 - never into the parser: the piping task raises it (a client gone)
            self._sink = None
            self._fail(exc)
            return
        self._sink, self._full = None, True  # the client takes no more for now: the piping task waits for it
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._stop_watching()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if not self._done and self._error is None:
            self._error = exc
            self._stop_watching()
            self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the silence watch
    def watch(self, limit: float) -> None:
        """No byte of the body for `limit` s (while none waits unread) fails the read with a TimeoutError."""
        if self._done or self._error is not None:
            return
        loop = self._conn.loop
        self._limit, self._step = limit, limit / 4
        self._seen, self._quiet_since = self._received, loop.time()
        self._watch = loop.call_later(self._step, self._look)

    def _look(self) -> None:
        now = self._conn.loop.time()
        if self._received != self._seen or self._held:
            self._seen, self._quiet_since = self._received, now
        elif now - self._quiet_since >= self._limit:
            self._watch = None
            self._fail(TimeoutError(f"no byte of the answer for {self._limit:g} s"))
            return
        self._watch = self._conn.loop.call_later(self._step, self._look)

    def _stop_watching(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    # -- read by the gateway
    async def chunk(self) -> bytes:
        """What came of the body since the last read (at least one byte), or b"" at its end."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            self._waiter = self._conn.loop.create_future()
            await self._waiter
        return self._take()

    async def pipe(self, sink: Callable[[bytes], bool]) -> bool:
        """The body into `sink` as it comes, from the connection's own callback (no task wakes for a piece, as one
        does for each `chunk`): until its end (False), or until `sink` answers False, its client taking no more for
        now (True: let the client drain, then pipe again). `sink` takes every piece it is given; what it raises,
        and the answer's own failures, are raised here."""
        while True:
            if self._chunks and not sink(self._take()):  # what came while nothing piped
                return True
            if self._error is not None:
                raise self._error
            if self._done:
                return False
            self._sink, self._full = sink, False
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._sink = None
            if self._full:
                return True

    def _take(self) -> bytes:
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._held = 0
        self._conn.resume()
        return data

    async def read(self, limit: int) -> bytes:
        """The whole body, at most `limit` bytes: TooLarge past it (a Content-Length that says so, at once), the
        connection then closed, never a body held in memory without bound."""
        if self.content_length is not None and self.content_length > limit:
            self.close()
            raise TooLarge(f"the worker's answer is {self.content_length} bytes, more than {limit} read whole")
        parts, size = [], 0
        while data := await self.chunk():
            parts.append(data)
            size += len(data)
            if size > limit:
                self.close()
                raise TooLarge(f"the worker's answer is more than {limit} bytes read whole")
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """The connection back to its pool where the answer was read to its end and the worker keeps it open."""
        self._stop_watching()
        if self._done and self._error is None and not self._chunks:
            self._conn.done()
        else:
            self._conn.close()

    def close(self) -> None:
        self._stop_watching()
        self._fail(PayloadError("the answer was closed before its end"))
        self._conn.close()


class _Conn(asyncio.Protocol):
    """One connection to a worker, one answer at a time."""

    def __init__(self, pool: Pool, port: int):
        self.pool, self.port = pool, port
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[Answer] | None = None
        self.answer: Answer | None = None
        self.fields: list[tuple[str, str]] = []
        self.head_bytes = 0
        self.head_raw = 0  # bytes of the pending answer's head received so far, whole fields or not
        self.lost = False
        self.paused = False
        self.keep = False
        self.head_only = False  # a HEAD request: the answer has no body whatever its Content-Length
        self.idle_since = 0.0

    # -- the transport's
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one without the class

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
            if self.head is not None and not self.head.done():  # the head is not whole yet
                self.head_raw += len(data)
                if self.head_raw > HEAD_BYTES_LIMIT:
                    raise PayloadError(f"the worker's answer has more than {HEAD_BYTES_LIMIT} bytes of head")
        except PayloadError as exc:
            self._broken(exc)
        except httptools.HttpParserError as exc:
            # a callback's own refusal arrives as the context of httptools' HttpParserCallbackError
            cause = exc.__context__
            self._broken(
                cause if isinstance(cause, PayloadError) else PayloadError(f"the worker's answer is not HTTP: {exc}")
            )
        finally:
            if self.answer is not None:  # what this read brought of a piped body, handed on in one piece
                self.answer._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.transport = None
        self.pool.forget(self)
        if self.head is not None and not self.head.done():
            self.head.set_exception(Disconnected(f"closed before an answer{f': {exc}' if exc else ''}"))
        elif self.answer is not None and not self.answer._done:
            answer = self.answer
            if answer.content_length is None and "chunked" not in answer.headers.get("Transfer-Encoding", ""):
                answer._finish()  # a body that ends where the connection does (HTTP/1.0's way)
            else:
                answer._fail(PayloadError("the worker closed the connection in the middle of an answer"))

    # -- the parser's
    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > HEAD_LIMIT:
            raise PayloadError(f"the worker's answer has more than {HEAD_LIMIT} bytes of header fields")
        self.fields.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        fields, self.fields, self.head_bytes = self.fields, [], 0
        if 100 <= status < 200 and status != 101:  # an interim answer (100 Continue): the real one follows
            return
        headers = CIMultiDictProxy(CIMultiDict(fields))
        length = headers.get("Content-Length")
        chunked = "chunked" in headers.get("Transfer-Encoding", "")
        answer = Answer(self, status, headers, int(length) if length is not None and length.isdigit() and not chunked
                        else None)  # fmt: skip
        self.answer = answer
        if self.head is not None and not self.head.done():
            self.head.set_result(answer)
        if self.head_only:
            self.keep = False  # what follows on this connection would be read as a body: it is not reused
            answer._finish()

    def on_body(self, body: bytes) -> None:
        if self.answer is not None and not self.head_only:
            self.answer._feed(body)

    def on_message_complete(self) -> None:
        if self.answer is not None and not self.head_only:
            self.keep = self.parser.should_keep_alive()
            self.answer._finish()

    # -- the pool's and the answer's
    def send(self, head: bytes, body: bytes | None, *, head_only: bool) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self.head, self.answer, self.keep, self.head_only = self.loop.create_future(), None, False, head_only
        self.head_raw = 0
        self.transport.write(head + body if body else head)
        return self.head

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def done(self) -> None:
        if self.keep and not self.lost and not self.paused:
            self.pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.lost = True

    def _broken(self, exc: BaseException) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        elif self.answer is not None:
            self.answer._fail(exc)
        self.close()


class Pool:
    """Kept-alive connections to the workers' ports on loopback."""

    def __init__(self, host: str = "127.0.0.1", keep_alive_s: float = KEEP_ALIVE_S):
        self.host, self.keep_alive_s = host, keep_alive_s
        self.idle: dict[int, list[_Conn]] = {}
        self.sweep: asyncio.TimerHandle | None = None

    async def request(
        self, method: str, port: int, target: str, headers: Mapping[str, str], body: bytes | None, timeout: float
    ) -> Answer:
        """The head of the worker's answer (no later than `timeout` s; its body is then watched for silences of
        as long). A connection taken from the pool that turns out closed is `Disconnected`: the caller asks again."""
        head = _request_head(method, self.host, port, target, headers, body)
        conn = await self._take(port)
        waiting = conn.send(head, body, head_only=method == "HEAD")
        # a timer on the head's future (asyncio.timeout's bookkeeping cost each request more than the rest of this)
        late = conn.loop.call_later(timeout, _too_late, waiting, timeout)
        try:
            answer = await waiting
        except BaseException:  # the head never came whole, or the caller went away: the worker's work stops
            conn.close()
            raise
        finally:
            late.cancel()
        answer.watch(timeout)
        return answer

    async def _take(self, port: int) -> _Conn:
        idle = self.idle.get(port)
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < self.keep_alive_s:
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_S):
                _, protocol = await loop.create_connection(lambda: _Conn(self, port), self.host, port)
        except TimeoutError:
            raise Unreachable(f"no connection within {CONNECT_S:g} s") from None
        except OSError as exc:  # asyncio's message names the address; the error's own words do not change
            raise Unreachable(os.strerror(exc.errno) if exc.errno else str(exc)) from None
        return protocol

    def put(self, conn: _Conn) -> None:
        conn.idle_since = conn.loop.time()
        self.idle.setdefault(conn.port, []).append(conn)
        if self.sweep is None:
            self.sweep = conn.loop.call_later(self.keep_alive_s, self._sweep)

    def forget(self, conn: _Conn) -> None:
        idle = self.idle.get(conn.port)
        if idle and conn in idle:
            idle.remove(conn)

    def _sweep(self) -> None:
        """Idle connections past the keep-alive closed; looked at again while any stays idle."""
        self.sweep = None
        loop, left = asyncio.get_running_loop(), False
        for port, idle in list(self.idle.items()):
            for conn in [c for c in idle if loop.time() - c.idle_since >= self.keep_alive_s]:
                idle.remove(conn)
                conn.close()
            left = left or bool(idle)
            if not idle:
                del self.idle[port]
        if left:
            self.sweep = loop.call_later(self.keep_alive_s / 2, self._sweep)

    def close(self) -> None:
        if self.sweep is not None:
            self.sweep.cancel()
            self.sweep = None
        for idle in self.idle.values():
            for conn in idle:
                conn.close()
        self.idle.clear()


def _too_late(head: asyncio.Future[Answer], timeout: float) -> None:
    if not head.done():
        head.set_exception(TimeoutError(f"no answer within {timeout:g} s"))


# a client sends the same header fields request after request: each is checked once, its line kept (a bounded
# cache; a field that fails raises, and a raise is never kept)
@lru_cache(maxsize=1024)
def _field_line(name: str, value: str) -> str:
    if not _TOKEN.fullmatch(name) or _UNSAFE_FIELD.search(value):
        raise ValueError(f"header {name!r} has a character HTTP does not allow there")
    return f"{name}: {value}\r\n"


def _request_head(
    method: str, host: str, port: int, target: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    if not _TOKEN.fullmatch(method):
        raise ValueError(f"not an HTTP method: {method!r}")
    if not target.startswith("/") or _UNSAFE_TARGET.search(target):
        raise ValueError(f"request target has a space or a control character: {target!r}")
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}:{port}\r\n"]
    for name, value in headers.items():
        lines.append(_field_line(name, value))
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body) if body else 0}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8", "surrogateescape")
