"""A client API the gateway speaks by translating a worker's OpenAI answer (Ollama's is the first): the relay's
bookkeeping is this base's, once for every such API: the worker's error read within its bound and said in the API's
shape, a whole answer read within WHOLE_LIMIT, a stream's events piped as they come (each SSE event whole, past
EVENT_LIMIT dropped), its tokens counted, the answer's figures kept, a cut stream ended with the API's own error.
A translation writes only what is its own: `whole` (a whole answer), `piece` (one event of a stream), `last` (the
stream's end), `refuse` (an error in its shape), its stream's content type and its stream's error line."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .model import Model
from .naming import error_message
from .relay import STREAM_ENDS, WHOLE_LIMIT, Call, Seen, answered, pipe, stream_failed, upstream
from .upstream import PayloadError
from .usage import StreamReader, Usage, read_usage

EVENT_LIMIT = 4 << 20  # one event of a worker's stream; a line without an end past it is dropped
ERROR_LIMIT = 1 << 20  # what of a worker's error answer is read (its message is in its first bytes)


class Translation:
    """A worker's OpenAI answer relayed in another API's words (a `Relay` for relay.forward)."""

    stream_type: str  # the content type of the API's streams
    stream_error: Callable[[str], bytes]  # an error inside the API's stream, once it began

    def __init__(self, *, stream: bool) -> None:
        self.stream = stream

    def refuse(self, status: int, message: str) -> web.Response:
        raise NotImplementedError

    def whole(self, asked: str, doc: dict[str, Any], seen: Seen) -> dict[str, Any]:
        raise NotImplementedError

    def piece(self, asked: str, event: bytes, state: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def last(self, asked: str, state: dict[str, Any], seen: Seen) -> bytes:
        raise NotImplementedError

    async def run(self, request: web.Request, m: Model, call: Call, seen: Seen) -> web.StreamResponse:
        headers = {"Content-Type": "application/json"}
        asked_at = time.monotonic()
        async with upstream(request, m, call, headers) as up:
            if up.status >= 400:
                try:
                    said = error_message(await up.read(ERROR_LIMIT))
                except PayloadError as exc:  # an error body without an end (or past ERROR_LIMIT)
                    said = f"worker {m.name} answered {up.status}: {exc}"
                answered(request, m, seen, up.status, asked_at, Usage())
                return self.refuse(up.status, said)
            if not self.stream:
                data = await up.read(WHOLE_LIMIT)  # past it: upstream_too_large, a 502 in the API's shape
                answered(request, m, seen, up.status, asked_at, read_usage(data))
                try:
                    doc = json.loads(data)
                    out = json.dumps(self.whole(call.asked, doc, seen)).encode()
                except (ValueError, AttributeError, TypeError, IndexError, RecursionError):
                    what = data[:200].decode("utf-8", "replace")
                    return self.refuse(502, f"worker {m.name} did not answer as an OpenAI server: {what!r}")
                seen.keep(out)
                return web.Response(body=out, content_type="application/json")
            resp = web.StreamResponse(status=200, headers={"Content-Type": self.stream_type})
            await resp.prepare(request)
            seen.stream = True
            reader, lines = StreamReader(), SseLines()
            state: dict[str, Any] = {}

            def each(chunk: bytes) -> bytes:  # whole events of the worker's stream, each translated
                events = lines.feed(chunk)
                for event in events:
                    reader.feed(event)
                out = b"".join(self.piece(call.asked, event, state) for event in events)
                seen.keep(out)
                return out

            try:
                await pipe(request, resp, up, each)
                answered(request, m, seen, up.status, asked_at, reader.usage())
                last = self.last(call.asked, state, seen)
                seen.keep(last)
                await resp.write(last)
                await resp.write_eof()
            except STREAM_ENDS as exc:
                await stream_failed(request, m, resp, exc, self.stream_error)
                answered(request, m, seen, up.status, asked_at, reader.usage())
            return resp


class SseLines:
    """The `data:` payloads of an event stream fed in pieces, each once its line is whole. The start of a line waits
    as pieces (joined once, at its end: a piece costs its own size, never the line's so far); a line past EVENT_LIMIT
    is no event that can be translated: dropped, and the stream goes on at the next line."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.skipping = False

    def feed(self, chunk: bytes) -> list[bytes]:
        out, start = [], 0
        while (end := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:end]
            if not self.skipping:
                line = b"".join((*self.parts, piece)) if self.parts else piece
                if line.startswith(b"data:"):
                    out.append(line[5:].strip())
            self.parts, self.size, self.skipping = [], 0, False
            start = end + 1
        if start < len(chunk) and not self.skipping:
            self.parts.append(chunk[start:])
            self.size += len(chunk) - start
            if self.size > EVENT_LIMIT:
                self.parts, self.size, self.skipping = [], 0, True
        return out
