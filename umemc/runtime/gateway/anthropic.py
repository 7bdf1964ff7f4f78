"""Anthropic's Messages API (/v1/messages, its /count_tokens), as Claude Code and the anthropic SDK speak it:
llama-server answers it itself, so its requests go to the model's worker as OpenAI's do (app.py's /v1 route, by
the body's "model"); what is Anthropic's is the surface: the token in `x-api-key` (or as a Bearer token), and every
refusal, the gateway's or a worker's, in Anthropic's shape ({"type": "error", "error": {"type", "message"}}; in a
stream, an `error` event). Its token counts are read by usage.py."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .surfaces import Surface

# Anthropic's error types by HTTP status (its API reference, "Errors"); a status it has none for is an api_error
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def _body(status: int, message: str, code: str | None) -> dict[str, Any]:
    said: dict[str, Any] = {"type": ERROR_TYPES.get(status, "api_error"), "message": message}
    if code is not None:
        said["code"] = code  # umemc's own code beside Anthropic's type (its clients read type and message)
    return {"type": "error", "error": said}


def refuse(status: int, message: str, code: str, retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return web.json_response(_body(status, message, code), status=status, headers=headers)


def stream_error(message: str) -> bytes:
    """An error inside a stream, as Anthropic's streams carry one: an `error` event."""
    return b"event: error\ndata: " + json.dumps(_body(500, message, None)).encode() + b"\n\n"


def worker_error(data: bytes, status: int) -> bytes:
    """A worker's error answer in OpenAI's shape (llama-server's on these routes too) in Anthropic's; any other body
    as it came."""
    try:
        doc = json.loads(data)
    except ValueError:
        return data
    said = doc.get("error") if isinstance(doc, dict) and doc.get("type") != "error" else None
    if not isinstance(said, dict) or not isinstance(said.get("message"), str):
        return data
    return json.dumps(_body(status, said["message"], None)).encode()


SURFACE = Surface("anthropic", ("/v1/messages",), ("x-api-key", "authorization"), refuse, stream_error, worker_error)
