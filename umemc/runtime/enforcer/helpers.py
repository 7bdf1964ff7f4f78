"""A model split across nodes (llama.cpp's RPC backend): its llama-server holds one TCP connection to the RPC server
of each other node for as long as it runs. When one of them goes (the node or its RPC server died), the model
cannot answer: its next request would abort llama-server halfway. The enforcer of its main node watches those
connections, stops the model cleanly when one is lost (saying which), and starts it again once every RPC server
accepts connections again (their own supervisord restarts a crashed one; its part is empty then, and the model's
load fills it again)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from ..wrap import endpoint_parts, silent

if TYPE_CHECKING:
    from .sampler import OffLoop

ESTABLISHED = psutil.CONN_ESTABLISHED


class HelperWatch:
    """One split model's RPC servers (HOST:PORT, in --rpc order), as its llama-server process sees them."""

    def __init__(self, endpoints: list[str], resolve: Callable[[str], set[str]] | None = None):
        self.endpoints = list(endpoints)
        self.resolve = resolve or _addresses
        self.pid: int | None = None
        self.joined = False  # every connection was seen established by this process (its load reached them all)
        self.lost: list[str] = []  # the endpoints it lost (the model is stopped until they answer again)
        self.back: OffLoop[bool] | None = None  # while lost: whether they all answer again, asked off the loop
        self._ips: dict[str, tuple[set[str], int]] = {}

    def gone(self, pid: int, connections: list[tuple[str, int, str]] | None = None) -> list[str]:
        """The endpoints this process reached and has no established connection to now; [] while it has them all,
        or has not yet reached them all (loading). `connections`: (remote ip, remote port, status), this process's
        own TCP connections unless given."""
        if pid != self.pid:
            self.pid, self.joined = pid, False
        conns = _connections(pid) if connections is None else connections
        live = {(ip, port) for ip, port, status in conns if status == ESTABLISHED}
        # reached once, in any state: a process already running when this enforcer took over (a restart, the
        # standby) may hold a connection its helper closed since: that is a loss too
        seen = {(ip, port) for ip, port, _ in conns}
        self.joined = self.joined or all(self._reached(e, seen) for e in self.endpoints)
        if not self.joined:
            return []
        return [e for e in self.endpoints if not self._reached(e, live)]

    def _reached(self, endpoint: str, live: set[tuple[str, int]]) -> bool:
        if endpoint not in self._ips:
            host, port = endpoint_parts(endpoint)
            self._ips[endpoint] = (self.resolve(host), port)
        ips, port = self._ips[endpoint]
        return any((ip, port) in live for ip in ips)


def _addresses(host: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return {host}


def _connections(pid: int) -> list[tuple[str, int, str]]:
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []
    return [(c.raddr.ip, c.raddr.port, c.status) for c in conns if c.raddr]


def answering(endpoints: list[str], timeout: float = 0.2) -> bool:
    """Whether every RPC server accepts a connection now."""
    return not silent(endpoints, timeout)
