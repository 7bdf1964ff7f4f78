"""umemc's XML-RPC client of supervisord (umemc.runtime.supervisor.Supervisor) against an XML-RPC server on a unix
socket, written here with the standard library's own server: a waited stop is answered only once the program is
down, which supervisord lets take its stopwaitsecs (30 s for the gateway and the workers in umemc's config), so such
a call waits longer than a plain one (a loaded machine's slow stop was a traceback in `up`)."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from xmlrpc.server import SimpleXMLRPCRequestHandler, SimpleXMLRPCServer

import pytest

from umemc.runtime.supervisor import Supervisor


class _UnixXMLRPC(socketserver.ThreadingMixIn, SimpleXMLRPCServer):
    address_family = socket.AF_UNIX
    daemon_threads = True

    def server_bind(self) -> None:
        self.socket.bind(self.server_address)

    def handle_error(self, request, client_address):  # type: ignore[no-untyped-def]
        pass  # a client that stopped waiting (the plain call's timeout) is what this test makes

    def get_request(self):  # type: ignore[no-untyped-def]
        conn, _ = self.socket.accept()
        return conn, ("local", 0)  # the handler wants an address pair


class _Handler(SimpleXMLRPCRequestHandler):
    rpc_paths = ("/RPC2",)
    disable_nagle_algorithm = False  # a unix socket has no TCP options


@pytest.fixture
def slow_supervisord(tmp_path: Path) -> Iterator[tuple[Path, list[tuple[str, bool]]]]:
    """Answers stopProcess and startProcess after 1.5 s (a program that takes that long to go down or up)."""
    path = tmp_path / "sv.sock"
    asked: list[tuple[str, bool]] = []
    server = _UnixXMLRPC(str(path), requestHandler=_Handler, logRequests=False, allow_none=True)

    def slow(method: str):  # type: ignore[no-untyped-def]
        def answer(name: str, wait: bool) -> bool:
            asked.append((method, wait))
            time.sleep(1.5)
            return True

        return answer

    server.register_function(slow("stop"), "supervisor.stopProcess")
    server.register_function(slow("start"), "supervisor.startProcess")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path, asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_waited_stop_or_start_waits_past_the_plain_timeout(
    slow_supervisord: tuple[Path, list[tuple[str, bool]]],
) -> None:
    path, asked = slow_supervisord
    sup = Supervisor(path, timeout=0.5)
    sup.stop("w", wait=True)  # 1.5 s: past the client's 0.5 s, within a waited call's own
    sup.start("w", wait=True)
    with pytest.raises(TimeoutError):
        sup.stop("w", wait=False)  # not waited: the plain timeout holds
    assert sup.try_stop("w", wait=False) == "supervisord did not answer: timed out"
    assert asked[:3] == [("stop", True), ("start", True), ("stop", False)]
