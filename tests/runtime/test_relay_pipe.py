"""A streamed answer relayed to the client (umemc.runtime.gateway.relay.pipe) on real sockets: a worker written with
asyncio's streams, the gateway's aiohttp server and its client for the workers, a client that reads nothing for a
while. Each piece goes to the client from the worker connection's own callback, so the relay keeps TCP's flow
control whole by itself: a client slower than the worker must hold the worker back, not fill the gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine

import pytest
import uvloop
from aiohttp import web

from tests.runtime.test_upstream import Worker
from umemc.runtime.gateway import relay, upstream
from umemc.runtime.gateway.upstream import Answer, Pool

PIECE = 1 << 20
PIECES = 64  # far more than loopback's socket buffers take (a few MiB each way)


def pattern(i: int) -> bytes:
    return bytes([i % 256]) * PIECE


async def flood(w: Worker, sent: asyncio.Event, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await w.request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    for i in range(PIECES):
        writer.write(b"%x\r\n%b\r\n" % (PIECE, pattern(i)))
        await writer.drain()  # blocks once the gateway stops reading and the socket buffers fill
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    sent.set()
    await reader.read()


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while size := int((await reader.readline()).strip(), 16):
        body += await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"
    assert await reader.readexactly(2) == b"\r\n"
    return bytes(body)


@pytest.mark.parametrize("version", ["1.1", "1.0"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_client_slower_than_the_worker_holds_the_worker_back_and_gets_every_byte(version: str, loop: str) -> None:
    async def main() -> None:
        sent = asyncio.Event()
        answers: list[Answer] = []

        async def handler(request: web.Request) -> web.StreamResponse:
            up = await pool.request("GET", w.port, "/", {}, None, 60)
            answers.append(up)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await relay.pipe(request, resp, up, lambda piece: piece)
            await resp.write_eof()
            up.release()
            return resp

        async with Worker(lambda r, wr: flood(w, sent, r, wr)) as w:
            pool = Pool()
            app = web.Application()
            app.router.add_get("/", handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"GET / HTTP/{version}\r\nHost: 127.0.0.1\r\n\r\n".encode())
                while not answers or not answers[0]._conn.paused:  # the client reads nothing: the relay backs up
                    await asyncio.sleep(0.01)
                assert upstream.HIGH_WATER < answers[0]._held < upstream.HIGH_WATER + 2 * PIECE  # bounded
                assert not sent.is_set()  # the worker waits on the paused socket
                head = await reader.readuntil(b"\r\n\r\n")
                chunked = b"transfer-encoding: chunked" in head.lower()
                assert chunked == (version == "1.1")  # HTTP/1.0 has no chunks: the body ends with the connection
                body = await read_chunked(reader) if chunked else await reader.read()
                assert len(body) == PIECES * PIECE
                assert all(body[i * PIECE : (i + 1) * PIECE] == pattern(i) for i in range(PIECES))
                await sent.wait()
                writer.close()
            finally:
                pool.close()
                await runner.cleanup()

    go: Callable[[Coroutine[object, object, None]], None] = asyncio.run if loop == "asyncio" else uvloop.run
    go(asyncio.wait_for(main(), 120))
