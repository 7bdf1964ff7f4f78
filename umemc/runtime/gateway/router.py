"""llama.cpp router mode's model routes, for the clients written against `llama-server --models-dir` (its web UI,
scripts): GET /models lists the models with their status, POST /models/load and POST /models/unload take
{"model": "NAME"}. A load goes through the same admission as a cold start and answers once the model is ready
(llama.cpp's router answers at once and loads behind it); an unload drains the model's requests first. Both need
the gateway's token where one is set, like every route but health.

The shapes are llama.cpp's (tools/server/server-models.cpp: {"success": true}, status values loaded, loading,
unloaded), without what would name a file of this machine."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .app_keys import SCHED
from .bodies import admit_of, json_object
from .model import Model, Refused
from .surfaces import error


def status_value(m: Model) -> str:
    if m.ready:
        return "loaded"
    if m.starting is not None:
        return "loading"
    return "unloaded"


async def models(request: web.Request) -> web.Response:
    sched = request.app[SCHED]
    data = []
    for m in sched.served():
        status: dict[str, Any] = {"value": status_value(m)}
        if m.failure and not m.live:
            status |= {"failed": True, "reason": m.failure}
        data.append(
            {
                "id": m.name,
                "aliases": m.plan.aliases,
                "object": "model",
                "owned_by": "umemc",
                "created": 0,
                "status": status,
            }
        )
    return web.json_response({"object": "list", "data": data})


async def _named(request: web.Request) -> Model:
    name = (await json_object(request)).get("model")
    if not isinstance(name, str) or not name:
        raise Refused('send {"model": "NAME"}: a model of this stack (GET /models)', "model_missing")
    return request.app[SCHED].slots.route(name)


async def load(request: web.Request) -> web.Response:
    m = await _named(request)
    await request.app[SCHED].actions.load(m, admit_of(request))
    return web.json_response({"success": True})


async def unload(request: web.Request) -> web.Response:
    m = await _named(request)
    if not m.live:
        return error(400, f"model {m.name} is not running", "not_running")
    await request.app[SCHED].actions.stop_now(m, drain=True)
    return web.json_response({"success": True})


ROUTES = (
    web.get("/models", models),
    web.post("/models/load", load),
    web.post("/models/unload", unload),
)
