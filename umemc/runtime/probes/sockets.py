"""Linux: which sockets listen on a TCP port, and which process holds them, asked of the kernel the cheap way.

/proc/net/tcp (what psutil reads) makes the kernel walk every table of TCP sockets, its connection table included,
however empty: ~1.2 ms a file here, and a process's connections read tcp, tcp6, udp and udp6. The kernel's socket
diagnostics (NETLINK_SOCK_DIAG, linux/inet_diag.h: what `ss` asks) take a state mask, and a dump of the listening
state walks the listening table alone. A socket's inode names it; a process holds it where one of its descriptors
links to `socket:[INODE]`. A cold start asks this once, on its path (docs/ESTIMATES.md, "Measuring memory on
Linux", has the figures)."""

from __future__ import annotations

import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
# inet_diag_req_v2: family, protocol, extensions, pad, state mask, then inet_diag_sockid (48 bytes, zeros: a dump)
_REQUEST = struct.Struct("=BBBBI48x")
# inet_diag_msg: family, state, timer, retransmits, then inet_diag_sockid (source port big-endian first),
# expires, read queue, write queue, uid, inode
_ANSWER = struct.Struct("=BBBB2s46xIIIII")


def listening(port: int) -> set[int] | None:
    """The inodes of the TCP sockets (IPv4 and IPv6) listening on `port`; None where the kernel cannot be asked
    this way (not Linux, or a kernel or sandbox without socket diagnostics)."""
    if not hasattr(socket, "AF_NETLINK"):
        return None
    found: set[int] = set()
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(2.0)
            for family in (socket.AF_INET, socket.AF_INET6):
                found |= _dump(nl, family, port)
    except OSError:
        return None
    return found


def _dump(nl: socket.socket, family: int, port: int) -> set[int]:
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
    nl.send(_HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
    found: set[int] = set()
    while True:
        data = nl.recv(65536)
        at = 0
        while at + _HEADER.size <= len(data):
            length, kind, _, _, _ = _HEADER.unpack_from(data, at)
            if kind == NLMSG_DONE:
                return found
            if kind == NLMSG_ERROR:
                (errno,) = struct.unpack_from("=i", data, at + _HEADER.size)
                raise OSError(-errno, os.strerror(-errno))
            if length < _HEADER.size:
                raise OSError("a malformed netlink answer")
            _, state, _, _, sport, _, _, _, _, inode = _ANSWER.unpack_from(data, at + _HEADER.size)
            if state == TCP_LISTEN and int.from_bytes(sport, "big") == port:
                found.add(inode)
            at += (length + 3) & ~3  # NLMSG_ALIGN


def holds(pid: int, inodes: set[int], proc: str = "/proc") -> bool:
    """Whether process `pid` has a descriptor on one of these sockets. Raises OSError where its descriptors cannot
    be read (gone, or not ours)."""
    names = {f"socket:[{inode}]" for inode in inodes}
    fds = f"{proc}/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            if os.readlink(f"{fds}/{fd}") in names:
                return True
        except OSError:  # closed meanwhile
            continue
    return False
