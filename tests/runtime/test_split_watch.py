"""The two runtime halves of a split model that need no llama.cpp: the exec wrapper's wait for the RPC servers of
the other nodes (real sockets on loopback), and the enforcer's reading of a llama-server's connections to them
(given as psutil reports them: remote address, port, TCP state). tests/runtime/test_rpc_split.py runs both for
real."""

from __future__ import annotations

import socket

from umemc.runtime.enforcer.helpers import HelperWatch, answering
from umemc.runtime.wrap import wait_helpers


def listening() -> tuple[socket.socket, str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def closed() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # bound, never listened, closed: nothing accepts there
    return f"127.0.0.1:{port}"


def test_the_wrapper_goes_on_once_every_helper_accepts_and_says_which_did_not() -> None:
    up, there = listening()
    try:
        assert wait_helpers([there], 5.0) is None
        gone = closed()
        assert wait_helpers([there, gone], 0.3) == (
            f"the RPC server of its other nodes at {gone} did not answer within 0.3 s: start the stack on those nodes "
            "(umemc up BUNDLE/nodes/NAME)"
        )
        assert answering([there]) and not answering([there, gone])
    finally:
        up.close()


def test_a_helper_is_lost_only_after_the_model_reached_them_all() -> None:
    b, c = "10.0.0.2:50052", "10.0.0.3:50053"
    watch = HelperWatch([b, c], resolve=lambda host: {host})
    est = "ESTABLISHED"
    assert watch.gone(100, []) == []  # its wrapper still waits, or it is loading: no connection yet
    assert watch.gone(100, [("10.0.0.2", 50052, est)]) == []  # one of two: still loading
    assert watch.gone(100, [("10.0.0.2", 50052, est), ("10.0.0.3", 50053, est)]) == []
    assert watch.joined
    # c's RPC server died: the kernel closed its end, llama-server's socket waits in CLOSE_WAIT
    assert watch.gone(100, [("10.0.0.2", 50052, est), ("10.0.0.3", 50053, "CLOSE_WAIT")]) == [c]
    assert watch.gone(100, [("10.0.0.2", 50052, est)]) == [c]
    # another process (the model started again) has not reached them yet: nothing is lost
    assert watch.gone(200, []) == [] and not watch.joined


def test_a_loss_that_happened_before_the_enforcer_looked_is_a_loss() -> None:
    """A standby enforcer takes over while c's server is already gone: llama-server's socket to it is in CLOSE_WAIT
    at the first look, which reached both (the model had loaded): c is lost."""
    b, c = "10.0.0.2:50052", "10.0.0.3:50053"
    watch = HelperWatch([b, c], resolve=lambda host: {host})
    assert watch.gone(100, [("10.0.0.2", 50052, "ESTABLISHED"), ("10.0.0.3", 50053, "CLOSE_WAIT")]) == [c]


def test_a_helper_named_by_host_is_matched_by_its_addresses() -> None:
    watch = HelperWatch(["halo-b.lan:50052"], resolve=lambda host: {"192.168.1.7", "fd00::7"})
    assert watch.gone(1, [("fd00::7", 50052, "ESTABLISHED")]) == [] and watch.joined
    assert watch.gone(1, [("192.168.1.8", 50052, "ESTABLISHED")]) == ["halo-b.lan:50052"]
