"""The gateway's client for its workers (umemc.runtime.gateway.upstream) against real sockets: a worker written
here with asyncio's streams, byte for byte, so every way an answer can go (kept alive, chunked, cut, silent, too
fast for its reader, a connection the worker closes while it idles) is made on purpose. What aiohttp's client did
for the gateway before, this must do too."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine

import pytest

from umemc.runtime.gateway import upstream
from umemc.runtime.gateway.upstream import Disconnected, PayloadError, Pool, Unreachable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Worker:
    """A loopback server that runs `handler` per connection and keeps what it saw."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.connections = 0
        self.closed = 0
        self.requests: list[bytes] = []
        self.gone = asyncio.Event()  # a connection ended (from either side)

    async def __aenter__(self) -> Worker:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.closed += 1
            self.gone.set()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """One whole request (head and Content-Length body), kept."""
        whole = await read_request(reader)
        self.requests.append(whole)
        return whole


LIMIT = 1 << 20  # what these tests read whole at most


def answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        extra,
        len(body),
        body,
    )


def keeps_answering(body: bytes, kept: list[bytes] | None = None) -> Handler:
    """A worker that answers every request on its connection with `body`, keeping it open (and the requests)."""

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(reader)
            if kept is not None:
                kept.append(request)
            writer.write(answer(body))

    return keep


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    fields = [x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")]
    length = int(fields[0].split(b":", 1)[1]) if fields else 0
    return head + await reader.readexactly(length)


def run(coro: Coroutine[object, object, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


async def nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    pass


async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A worker that streams a byte every 10 ms until its client goes away."""
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    while True:
        writer.write(b"1\r\nx\r\n")
        await writer.drain()
        await asyncio.sleep(0.01)


def test_answers_on_one_kept_alive_connection_and_the_request_as_sent() -> None:
    async def main() -> None:
        kept: list[bytes] = []
        async with Worker(keeps_answering(b'{"ok": true}', kept)) as w:
            pool = Pool()
            for _ in range(3):
                a = await pool.request("POST", w.port, "/v1/chat?x=1", {"Content-Type": "application/json"}, b"{}", 5)
                assert (a.status, a.content_length, a.headers["content-type"]) == (200, 12, "application/json")
                assert await a.read(LIMIT) == b'{"ok": true}'
                a.release()
            assert w.connections == 1
            assert (
                kept
                == [  # the same each time (its header line checked once, then kept)
                    b"POST /v1/chat?x=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 2\r\n\r\n{}" % w.port
                ]
                * 3
            )
            pool.close()
            await w.gone.wait()
            assert w.closed == 1

    run(main())


def collecting() -> tuple[list[bytes], asyncio.Event, Callable[[bytes], bool]]:
    """A sink that keeps every piece it is given and sets an event at each; what it kept, the event, the sink."""
    got: list[bytes] = []
    came = asyncio.Event()

    def sink(piece: bytes) -> bool:
        got.append(piece)
        came.set()
        return True

    return got, came, sink


def test_a_chunked_stream_comes_as_it_is_sent_read_or_piped_and_its_connection_is_reused() -> None:
    async def main() -> None:
        go_on = asyncio.Event()

        async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await w.request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
                writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
                writer.write(b"7\r\ndata: 1\r\n")
                await go_on.wait()  # the first event is read before the second is sent
                writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")

        got, came, sink = collecting()

        async with Worker(stream) as w:
            pool = Pool()
            for _ in range(2):
                go_on.clear()
                a = await pool.request("GET", w.port, "/s", {}, None, 5)
                assert a.content_length is None
                assert await a.chunk() == b"data: 1"
                go_on.set()
                assert await a.read(LIMIT) == b"data: 2"
                a.release()
            for _ in range(2):  # piped: each piece to the sink from the connection's callback
                go_on.clear()
                came.clear()
                got.clear()
                a = await pool.request("GET", w.port, "/s", {}, None, 5)
                piping = asyncio.ensure_future(a.pipe(sink))
                await came.wait()
                assert got == [b"data: 1"]
                go_on.set()
                assert await piping is False  # the end
                assert got == [b"data: 1", b"data: 2"]
                a.release()
            assert w.connections == 1
            pool.close()

    run(main())


def test_the_chunks_one_read_brings_reach_the_sink_as_one_piece() -> None:
    """A worker that writes fast sends several chunks in one segment: while piped, they reach the sink together (one
    write to the client, not one per chunk); a chunk sent on its own is a piece of its own."""

    async def main() -> None:
        more, last = asyncio.Event(), asyncio.Event()

        async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\ndata: 0\n\r\n")
            await more.wait()
            writer.write(b"".join(b"8\r\ndata: %d\n\r\n" % i for i in (1, 2, 3)))  # one write: one segment
            await last.wait()
            writer.write(b"8\r\ndata: 4\n\r\n0\r\n\r\n")
            await reader.read()

        got, came, sink = collecting()

        async with Worker(stream) as w:
            a = await Pool().request("GET", w.port, "/", {}, None, 5)
            piping = asyncio.ensure_future(a.pipe(sink))
            for step in (more, last):
                await came.wait()
                came.clear()
                step.set()
            assert await piping is False
            assert got == [b"data: 0\n", b"data: 1\ndata: 2\ndata: 3\n", b"data: 4\n"]

    run(main())


def test_a_closed_port_is_unreachable() -> None:
    async def main() -> None:
        async with Worker(nothing) as w:
            port = w.port
        with pytest.raises(Unreachable, match="^Connection refused$"):
            await Pool().request("GET", port, "/", {}, None, 5)

    run(main())


def test_a_connection_closed_before_the_answer_is_disconnected_and_a_cut_body_a_payload_error() -> None:
    async def main() -> None:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)

        async with Worker(hang_up) as w:
            with pytest.raises(Disconnected, match="^closed before an answer"):
                await Pool().request("GET", w.port, "/", {}, None, 5)

        async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            await writer.drain()

        async with Worker(cut) as w:
            a = await Pool().request("GET", w.port, "/", {}, None, 5)
            with pytest.raises(PayloadError, match="^the worker closed the connection in the middle of an answer$"):
                await a.read(LIMIT)
            b = await Pool().request("GET", w.port, "/", {}, None, 5)  # the same, piped
            with pytest.raises(PayloadError, match="^the worker closed the connection in the middle of an answer$"):
                await b.pipe(lambda piece: True)

    run(main())


def test_a_pooled_connection_the_worker_closed_is_not_taken_again() -> None:
    async def main() -> None:
        async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)
            writer.write(answer(b"{}"))  # kept alive as far as HTTP goes, then closed by the worker
            await writer.drain()

        async with Worker(once) as w:
            pool = Pool()
            a = await pool.request("GET", w.port, "/", {}, None, 5)
            await a.read(LIMIT)
            a.release()
            await w.gone.wait()
            await asyncio.sleep(0)  # the close reaches the client's protocol in the same loop turn or the next
            while pool.idle.get(w.port):
                await asyncio.sleep(0.01)
            b = await pool.request("GET", w.port, "/", {}, None, 5)
            assert await b.read(LIMIT) == b"{}"
            assert w.connections == 2

    run(main())


def test_idle_connections_close_after_the_keep_alive() -> None:
    async def main() -> None:
        async with Worker(keeps_answering(b"{}")) as w:
            pool = Pool(keep_alive_s=0.2)
            a = await pool.request("GET", w.port, "/", {}, None, 5)
            await a.read(LIMIT)
            a.release()
            assert len(pool.idle[w.port]) == 1
            await w.gone.wait()  # the sweep closed it: the worker saw its end
            assert pool.idle == {}

    run(main())


def test_a_silent_worker_times_out_at_the_head_and_in_the_body_but_unread_bytes_are_no_silence() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request = await w.request(reader)
            if b"/body" in request:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n0123456789")
            elif b"/unread" in request:
                writer.write(answer(b"x" * 10))
            await release.wait()

        async with Worker(silent) as w:
            pool = Pool()
            with pytest.raises(TimeoutError):
                await pool.request("GET", w.port, "/head", {}, None, 0.2)
            a = await pool.request("GET", w.port, "/body", {}, None, 0.2)
            with pytest.raises(TimeoutError, match=r"^no byte of the answer for 0.2 s$"):
                await a.read(LIMIT)
            piped: list[bytes] = []
            c = await pool.request("GET", w.port, "/body", {}, None, 0.2)
            with pytest.raises(TimeoutError, match=r"^no byte of the answer for 0.2 s$"):
                await c.pipe(lambda piece: piped.append(piece) or True)
            assert piped == [b"0123456789"]
            b = await pool.request("GET", w.port, "/unread", {}, None, 0.2)
            await asyncio.sleep(0.6)  # three limits with every byte there and unread: the client is the slow side
            assert await b.read(LIMIT) == b"x" * 10
            release.set()

    run(main())


def test_an_answer_read_slower_than_it_comes_pauses_the_worker() -> None:
    async def main() -> None:
        piece = 1 << 20
        total = 64 * piece  # far more than loopback's socket buffers take (a few MiB)
        sent = asyncio.Event()

        async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
            for i in range(total // piece):
                writer.write(bytes([i % 256]) * piece)
                await writer.drain()  # blocks once the client stops reading and the socket buffers fill
            sent.set()

        async with Worker(flood) as w:
            a = await Pool().request("GET", w.port, "/", {}, None, 30)
            while not a._conn.paused:
                await asyncio.sleep(0.01)
            assert upstream.HIGH_WATER < a._held < upstream.HIGH_WATER + piece  # held: bounded, not 64 MiB
            assert not sent.is_set()  # the worker waits on the paused socket
            got = await a.read(total)
            assert len(got) == total and got[:piece] == b"\0" * piece and got[-1] == (total // piece - 1) % 256
            await sent.wait()

    run(main())


def test_leaving_an_answer_closes_its_connection() -> None:
    async def main() -> None:
        async with Worker(endless) as w:
            pool = Pool()
            a = await pool.request("GET", w.port, "/", {}, None, 5)
            assert await a.chunk()
            a.close()
            await w.gone.wait()  # the worker's write failed: it stops generating
            assert pool.idle == {}

    run(main())


def test_a_head_answer_has_no_body_and_its_connection_is_not_reused() -> None:
    async def main() -> None:
        async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
            await reader.read()  # until the gateway closes it

        async with Worker(head) as w:
            pool = Pool()
            a = await pool.request("HEAD", w.port, "/", {}, None, 5)
            assert (a.status, a.content_length, await a.read(LIMIT)) == (200, 50, b"")
            a.release()
            await w.gone.wait()
            assert pool.idle == {}

    run(main())


@pytest.mark.parametrize(
    ("target", "headers", "said"),
    [
        ("/a b", {}, "request target has a space or a control character: '/a b'"),
        ("/a\r\nX: 1", {}, "request target has a space or a control character: '/a\\r\\nX: 1'"),
        ("a", {}, "request target has a space or a control character: 'a'"),
        ("/", {"X-A": "1\r\nX-B: 2"}, "header 'X-A' has a character HTTP does not allow there"),
        ("/", {"X A": "1"}, "header 'X A' has a character HTTP does not allow there"),
    ],
)
def test_a_target_or_header_that_would_split_the_request_is_refused_before_a_byte(
    target: str, headers: dict[str, str], said: str
) -> None:
    async def main() -> None:
        async with Worker(nothing) as w:
            for _ in range(2):  # refused every time (a header line that passed once is kept: never one that did not)
                with pytest.raises(ValueError) as caught:
                    await Pool().request("GET", w.port, target, headers, None, 5)
                assert str(caught.value) == said
            assert w.connections == 0

    run(main())


def test_an_interim_answer_is_skipped() -> None:
    """A worker asked with Expect: 100-continue answers 100 Continue first; the answer is the one after it."""

    async def main() -> None:
        async def continues(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b'{"ok": 1}'))
            await reader.read()

        async with Worker(continues) as w:
            a = await Pool().request("POST", w.port, "/", {"Expect": "100-continue"}, b"{}", 5)
            assert (a.status, await a.read(LIMIT)) == (200, b'{"ok": 1}')

    run(main())


def test_a_head_without_end_is_cut_at_its_limit() -> None:
    """A worker that sends header fields without end is no answer: refused past HEAD_LIMIT, its connection closed."""

    async def main() -> None:
        async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\n")
            for i in range(10000):
                writer.write(b"X-Field-%d: %s\r\n" % (i, b"v" * 100))
                await writer.drain()

        async with Worker(endless) as w:
            with pytest.raises(PayloadError) as caught:
                await Pool().request("GET", w.port, "/", {}, None, 5)
            assert (
                str(caught.value) == f"the worker's answer has more than {upstream.HEAD_LIMIT} bytes of header fields"
            )
            await w.gone.wait()

    run(main())


def test_an_answer_that_is_not_http_is_a_payload_error() -> None:
    async def main() -> None:
        async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)
            writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
            await reader.read()

        async with Worker(garbage) as w:
            with pytest.raises(PayloadError, match="^the worker's answer is not HTTP: "):
                await Pool().request("GET", w.port, "/", {}, None, 5)
            await w.gone.wait()  # its connection closed

    run(main())


def test_a_sink_whose_client_is_full_stops_the_pipe_and_what_comes_meanwhile_waits_for_the_next() -> None:
    async def main() -> None:
        go_on, sent = asyncio.Event(), asyncio.Event()

        async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await w.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
            await go_on.wait()
            writer.write(b"1\r\nb\r\n")
            await writer.drain()
            writer.write(b"1\r\nc\r\n0\r\n\r\n")
            await writer.drain()
            sent.set()
            await reader.read()

        async with Worker(stream) as w:
            got: list[bytes] = []
            a = await Pool().request("GET", w.port, "/", {}, None, 5)
            assert await a.pipe(lambda piece: got.append(piece) or False) is True  # full after "a"
            go_on.set()
            await sent.wait()
            assert await a.pipe(lambda piece: got.append(piece) or True) is False
            assert got[0] == b"a" and b"".join(got[1:]) == b"bc"  # held while nothing piped, or piped as they came

    run(main())


def test_what_a_sink_raises_ends_the_pipe_and_closes_the_connection() -> None:
    async def main() -> None:
        def gone(piece: bytes) -> bool:
            raise ConnectionResetError("the client went away")

        async with Worker(endless) as w:
            pool = Pool()
            a = await pool.request("GET", w.port, "/", {}, None, 5)
            with pytest.raises(ConnectionResetError, match=r"^the client went away$"):
                await a.pipe(gone)
            a.release()  # a failed answer's connection is closed, never pooled
            await w.gone.wait()  # the worker's write failed: it stops generating
            assert pool.idle == {}

    run(main())
