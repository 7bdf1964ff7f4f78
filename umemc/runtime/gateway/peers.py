"""One endpoint for every model of a stack of several nodes: a request for a model another node runs is sent on to
that node's gateway (its address and gateway port, the stack's token), whatever the route (OpenAI's, Anthropic's,
Ollama's, the router's, the pass-through): the other gateway admits it, starts a cold model on its own node, counts
it and answers; this one hands the answer on as it comes, untouched. A node that does not answer is said so (503,
naming the node). A request another gateway sent on is never sent on again (no loop between two plans that
disagree).

The table of who runs what is the plan's `peers` (written by `umemc build` for each node: every model the other
nodes serve, and their aliases)."""

from __future__ import annotations

from aiohttp import web

from ..wrap import endpoint_parts
from .model import Refused, Remote
from .relay import from_worker, pipe, to_worker
from .upstream import PayloadError, Pool, Unreachable

FORWARDED = "X-Umemc-Forwarded-By"  # the node whose gateway sent a request on (its answer is not sent on again)
PEER_POOLS: web.AppKey[dict[str, Pool]] = web.AppKey("peer_pools", dict)


async def forward(
    request: web.Request, remote: Remote, node: str, token: str | None, timeout: float
) -> web.StreamResponse:
    """The request, as it came (its method, raw target, headers less the hop-by-hop ones and the client's token,
    body), to the gateway of the node that serves the model; its answer as it comes. `node`: this gateway's node."""
    peer = remote.peer
    sender = request.headers.get(FORWARDED)
    if sender == node:  # sent to itself: two nodes' gateways at one address
        raise Refused(
            f"model {remote.name} runs on node {peer.node}, whose gateway is at {peer.url}, where this gateway "
            f"(node {node}) is: give the nodes their addresses (nodes.NAME.address), or, rehearsed on one machine, "
            "each its own gateway_port",
            "node_unreachable",
        )
    if sender is not None:  # sent on once already: the plans disagree, never a loop
        raise Refused(
            f"model {remote.name!r} was sent here by node {sender}'s gateway, but this node ({node}) does not serve "
            "it: rebuild and `umemc up` the nodes from one stack",
            "model_not_found",
        )
    host, port = endpoint_parts(peer.url)
    pools = request.app[PEER_POOLS]
    pool = pools.get(host)
    if pool is None:
        pool = pools[host] = Pool(host)
    # the client's token is not sent on (the other gateway is given the stack's own)
    headers = {k: v for k, v in request.headers.items() if to_worker(k, True)}
    headers[FORWARDED] = node
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = await request.read()  # the handler that found the model remote read it already: aiohttp keeps it
    said = f"model {remote.name} runs on node {peer.node} ({peer.url})"
    try:
        up = await pool.request(request.method, port, request.raw_path, headers, body or None, timeout)
    except (Unreachable, ConnectionError, TimeoutError) as exc:
        raise Refused(f"{said}, whose gateway does not answer: {exc or 'no answer'}", "node_unreachable", 5) from None
    except ValueError as exc:
        raise Refused(f"request not sent to node {peer.node}: {exc}", "bad_request") from None
    resp = web.StreamResponse(status=up.status, headers={k: v for k, v in up.headers.items() if from_worker(k)})
    try:
        await resp.prepare(request)
        await pipe(request, resp, up, _same)
        await resp.write_eof()
        up.release()
    except (ConnectionResetError, PayloadError, TimeoutError):
        up.close()
        if request.transport is not None:
            request.transport.abort()  # an answer cut short is never a whole one
    return resp


def _same(piece: bytes) -> bytes:
    return piece
