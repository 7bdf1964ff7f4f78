"""The client APIs the gateway speaks, each a `Surface`: the paths it answers, the headers its clients carry the
gateway's token in, and how it says a refusal (an answer, and an error inside a stream that already began). The
door (door.py) and the relay (relay.py) ask the table which surface a path is theirs and speak in its shape; each
surface module declares its own beside its routes (ollama.py, anthropic.py; OpenAI's, the default, is here), and
app.py puts the table together. What the gateway itself refuses is said here in HTTP: the scheduler speaks in codes.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import NamedTuple

from aiohttp import web

from .model import Refused

# What each refusal is in HTTP (the scheduler speaks in codes; statuses are this layer's business).
HTTP_STATUS = {
    "invalid_json": 400, "model_missing": 400, "invalid_lease": 400, "bad_request": 400,
    "model_not_found": 404, "no_port": 404,
    "body_timeout": 408,
    "queue_full": 429, "too_many_leases": 429,
    "body_too_large": 413,
    "upstream_unreachable": 502, "upstream_disconnected": 502, "upstream_too_large": 502, "upstream_cut": 502,
    "shutting_down": 503, "worker_unhealthy": 503, "worker_given_up": 503, "queue_timeout": 503,
    "insufficient_memory": 503, "not_admissible": 503, "start_failed": 503, "start_timeout": 503, "stop_failed": 503,
    "state_unwritable": 503, "node_unreachable": 503,
    "upstream_timeout": 504,
    "busy": 409,
}  # fmt: skip

Answer = Callable[[int, str, str, "int | None"], web.Response]  # status, message, umemc's code, Retry-After


class Surface(NamedTuple):
    name: str
    prefixes: tuple[str, ...]  # the paths it answers start with one of these
    token_headers: tuple[str, ...]  # where its clients put the token: "authorization" (Bearer) or a header of its own
    refuse: Answer  # a refusal as its clients read one
    stream_error: Callable[[str], bytes]  # an error in a stream its clients already read
    worker_error: Callable[[bytes, int], bytes] | None = None  # a worker's whole error answer reshaped (None: as it is)

    def answer(self, exc: Refused) -> web.Response:
        return self.refuse(HTTP_STATUS[exc.code], exc.message, exc.code, exc.retry_after)

    def token_given(self, request: web.BaseRequest, token: str) -> bool:
        """Whether one of its token headers carries `token` (compared in constant time)."""
        for name in self.token_headers:
            given = request.headers.get(name)
            if given is None:
                continue
            value = given
            if name == "authorization":
                scheme, _, value = given.partition(" ")
                if scheme.lower() != "bearer":
                    continue
            if hmac.compare_digest(value.encode(), token.encode()):
                return True
        return False

    def token_help(self) -> str:
        said = [
            "Authorization: Bearer <token>" if h == "authorization" else f"{h}: <token>" for h in self.token_headers
        ]
        return " or ".join(said)


# -- OpenAI's: every path no other surface claims (umemc's own API speaks it too) ------------------------------------
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    409: "insufficient_memory",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error(status: int, message: str, code: str, retry_after: int | None = None) -> web.Response:
    """A refusal as OpenAI's API says one: {"error": {"message", "type", "code"}}."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "code": code}}
    return web.json_response(body, status=status, headers=headers)


def refused(exc: Refused) -> web.Response:
    return OPENAI.answer(exc)


def sse_error(message: str) -> bytes:
    """An error as OpenAI's streams carry one."""
    return b"data: " + json.dumps({"error": {"message": message, "type": "server_error"}}).encode() + b"\n\n"


OPENAI = Surface("openai", ("/",), ("authorization",), error, sse_error)

SURFACES = web.AppKey[tuple[Surface, ...]]("surfaces")


def surface_of(table: tuple[Surface, ...], path: str) -> Surface:
    """The surface whose paths `path` is one of (the first that claims it; OpenAI's claims the rest)."""
    for surface in table:
        if path.startswith(surface.prefixes):
            return surface
    return OPENAI
