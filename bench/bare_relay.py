"""The floor under the gateway's cost: a bare HTTP relay on the gateway's own parts (aiohttp's server and client on
uvloop) that forwards every request to one worker and its answer back (streamed when the worker streams), with
nothing of the gateway's work: no routing by the body's model, no token, no admission or slots, no accounting,
no access log. bench/gateway.py (part `floor`) and bench/serving.py measure it beside the gateway and the worker
alone. Like the gateway, it asks once more, at once, where the worker closed a kept-alive connection as it was
taken from the pool (llama-server closes some after a stream).

    python bench/bare_relay.py LISTEN_PORT WORKER_PORT
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import uvloop
from aiohttp import web

HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


async def serve(listen: int, worker: int) -> None:
    # idle connections kept 2 s, as the gateway keeps them (under the workers' own keep-alive timeouts)
    client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100, keepalive_timeout=2))

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = f"http://127.0.0.1:{worker}{request.path_qs}"
        try:
            up = await client.request(request.method, url, data=body, headers=headers)
        except aiohttp.ServerDisconnectedError:  # a kept-alive connection the worker closed as it was taken
            up = await client.request(request.method, url, data=body, headers=headers)
        async with up:
            out = {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}
            if up.content_length is not None:
                return web.Response(body=await up.read(), status=up.status, headers=out)
            resp = web.StreamResponse(status=up.status, headers=out)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", relay)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", listen).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
