"""The listening-socket probe (umemc.runtime.probes.sockets) against real sockets: what it finds is checked against
each socket's own inode (fstat of its descriptor, in the process that holds it), and the gateway's port check
built on it against psutil's reading of /proc/net on the same processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.runtime.conftest import free_port
from umemc.runtime.gateway.process import _listens_on_psutil, listens_on
from umemc.runtime.probes import sockets

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's socket diagnostics: Linux")

# a child that listens on a free port and says the port and its socket's inode, then waits for its stdin to close
LISTENER = (
    "import os, socket, sys\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], os.fstat(s.fileno()).st_ino, flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture
def listener() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, UMEMC_RUN="run-1", UMEMC_MODEL="x"),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    port, inode = map(int, proc.stdout.readline().split())
    try:
        yield proc, port, inode
    finally:
        proc.stdin.close()
        proc.wait()


def inode(s: socket.socket) -> int:
    return os.fstat(s.fileno()).st_ino


def test_the_listening_sockets_of_a_port_ipv4_and_ipv6_and_nothing_connected() -> None:
    four = socket.socket()
    four.bind(("127.0.0.1", 0))
    four.listen()
    port = four.getsockname()[1]
    six = socket.socket(socket.AF_INET6)
    six.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    six.bind(("::1", port))
    six.listen()
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = four.accept()  # an established socket on the same local port: not a listener
    try:
        assert sockets.listening(port) == {inode(four), inode(six)}
        assert inode(served) not in {inode(four), inode(six)}
        assert sockets.holds(os.getpid(), {inode(six)})
    finally:
        for s in (served, client, six, four):
            s.close()
    assert sockets.listening(port) == set()  # closed: nothing listens there any more


def test_who_holds_a_listening_socket(listener: tuple[subprocess.Popen[str], int, int]) -> None:
    proc, port, child_inode = listener
    assert sockets.listening(port) == {child_inode}
    assert sockets.holds(proc.pid, {child_inode})
    assert not sockets.holds(os.getpid(), {child_inode})
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with pytest.raises(FileNotFoundError):
        sockets.holds(int(gone.stdout), {child_inode})


def test_the_port_check_answers_as_psutil_does(listener: tuple[subprocess.Popen[str], int, int]) -> None:
    """The worker's own process listens: yes. Another process asked about (one that neither listens nor has a
    child listening there): no, unless the listener carries the run's mark for that model (a daemon that left the
    worker's tree). A process gone: cannot be told. A port nothing listens on: no."""
    proc, port, _ = listener
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    cases = [
        ((proc.pid, port, "run-1", "x"), True),
        ((other.pid, port, "run-2", "x"), False),  # another run's model: a stranger
        ((other.pid, port, "run-1", "y"), False),  # this run's mark, another model
        ((other.pid, port, "run-1", "x"), True),  # left the tree, carrying the mark
        ((int(gone.stdout), port, "run-1", "x"), None),
        ((proc.pid, free_port(), "run-1", "x"), False),  # a port nothing listens on
    ]
    try:
        for (pid, on, mark, model), expected in cases:
            assert listens_on(pid, on, mark=mark, model=model) is expected, (pid, mark, model)
            assert _listens_on_psutil(pid, on, mark=mark, model=model) is expected, (pid, mark, model)
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait()
