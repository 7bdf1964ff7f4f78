"""The gateway's door (umemc.runtime.gateway.door) stands in front of every route: routes are added in one place,
each handler behind it. Its rules (Host, Origin, content types, the token, refusals) are tested against a real
gateway in tests/security/test_gateway_attacks.py; this checks that no route goes round it."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from tests.runtime.test_scheduler import FakeSupervisor, model, scheduler
from umemc.runtime.gateway.app import make_app
from umemc.runtime.gateway.door import guarded
from umemc.runtime.gateway.surfaces import OPENAI

SURFACES = Path(__file__).resolve().parents[2] / "umemc" / "runtime" / "gateway"


async def _handler(request: web.Request) -> web.StreamResponse:
    return web.Response()


def test_every_route_of_the_gateway_is_behind_the_door(tmp_path: Path) -> None:
    door = guarded([web.get("/x", _handler)], None, "t", (OPENAI,))[
        0
    ].handler.__code__  # the code of a handler behind it
    app = make_app(scheduler(tmp_path, model("a", 10), FakeSupervisor()), "secret")
    routes = list(app.router.routes())
    # the surfaces' routes, counted by hand: app.py 11 (/v1/models, the three hot paths, /v1/{tail}, the pass-through,
    # health, status, can-load, pressure, /metrics), page.py 6, leasing.py 4, ollama.py 8, router.py 3; aiohttp adds
    # HEAD to each GET: 5 + 5 + 1 + 3 + 1
    assert len(routes) == 11 + 6 + 4 + 8 + 3 + 15
    assert [str(r.resource) for r in routes if r.handler.__code__ is not door] == []
    assert list(app.middlewares) == []  # the door is each handler's own first step


def test_routes_are_added_in_one_place() -> None:
    added = {
        f.name: text.count("router.add_")
        for f in sorted(SURFACES.glob("*.py"))
        if (text := f.read_text()).count("router.add_")
    }
    assert added == {"app.py": 1}  # make_app's add_routes(guarded(...))
