"""A request's body as the gateway reads it: within its bounds (gateway.max_body, gateway.body_timeout), the model
it names (a JSON body's `model`, a multipart form's), strict JSON (no NaN, no nesting past MAX_JSON_DEPTH), and
whether it asks to wait for memory (X-Umemc-Wait)."""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import json
from typing import Any

import msgspec
from aiohttp import web

from .app_keys import SCHED
from .core import Admit
from .model import Refused


def admit_of(request: web.Request) -> Admit:
    """`X-Umemc-Wait: 1` (or true/yes): queue for a model that cannot be admitted now, until memory
    frees or the queue timeout; without it such a request is refused at once with the reason."""
    wait = request.headers.get("X-Umemc-Wait", "").strip().lower() in ("1", "true", "yes")
    return Admit.QUEUE if wait else Admit.REFUSE_NOW


class _Named(msgspec.Struct):
    model: object = None


_MODEL_ONLY = msgspec.json.Decoder(_Named).decode  # the body's other fields checked as JSON and skipped, in C


def model_of(content_type: str, body: bytes) -> str:
    """The `model` field of a JSON body, or of a multipart form (audio transcriptions). The usual body (UTF-8, a JSON
    object nesting no deeper than the limit allows) is read for its model alone (0.2 us where the whole parse took
    2.5); any other, and any body that does not read so, is read as strict_json reads it, which says what is wrong."""
    if content_type.startswith("multipart/form-data"):
        return _multipart_model(content_type, body)
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        try:
            body.decode("utf-8", "surrogatepass")  # what strict_json reads a UTF-8 body as (msgspec skips strings)
            named = _MODEL_ONLY(body).model
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            pass  # said below
        else:
            if isinstance(named, str) and named:
                return named
    try:
        doc = strict_json(body) if body else None
    except ValueError as exc:
        raise Refused(str(exc) if isinstance(exc, TooDeep) else "request body is not JSON", "invalid_json") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), str) or not doc["model"]:
        raise Refused('request has no "model" field: name a model of this stack (GET /v1/models)', "model_missing")
    return str(doc["model"])


def _multipart_model(content_type: str, body: bytes) -> str:
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    for part in msg.iter_parts():
        if part.get_param("name", header="content-disposition") == "model":
            value = part.get_payload(decode=True)
            if isinstance(value, bytes) and value.strip():
                return value.decode(errors="replace").strip()
    raise Refused('form has no "model" field: name a model of this stack (GET /v1/models)', "model_missing")


async def read_body(request: web.Request) -> bytes:
    """The whole body within gateway.body_timeout (a client trickling bytes cannot hold a handler),
    at most gateway.max_body bytes (aiohttp answers 413 beyond; a larger declared Content-Length is
    answered 413 at once, before a byte of it is waited for)."""
    limit = request.app[SCHED].gw.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise Refused(
            f"request body of {request.content_length} bytes is larger than {limit} bytes (gateway.max_body)",
            "body_too_large",
        )
    if request.content.is_eof():  # all of it is in already (the usual small body): nothing to wait for
        return await request.read()
    try:
        async with asyncio.timeout(request.app[SCHED].gw.body_timeout_s):
            return await request.read()
    except TimeoutError:
        raise Refused(
            f"request body not received within {request.app[SCHED].gw.body_timeout_s:g} s", "body_timeout"
        ) from None


MAX_JSON_DEPTH = 64  # no request of this API nests deeper than a few levels
TOO_DEEP = f"request body nests more than {MAX_JSON_DEPTH} levels of arrays or objects"


async def json_object(request: web.Request) -> dict[str, Any]:
    """The request's body as a JSON object (empty: {}), read within its bounds."""
    raw = await read_body(request)
    try:
        doc = strict_json(raw) if raw else {}
    except ValueError as exc:
        raise Refused(str(exc) if isinstance(exc, TooDeep) else "request body is not JSON", "invalid_json") from None
    if not isinstance(doc, dict):
        raise Refused("request body must be a JSON object", "invalid_json")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_STRICT = json.JSONDecoder(parse_constant=_no_constant)  # made once (json.loads with an option makes one a call)


def strict_json(raw: bytes) -> Any:
    """json.loads without NaN/Infinity (Python accepts them; JSON does not) and without nesting past
    MAX_JSON_DEPTH (3000 levels made the parser recurse until Python gave up: a 500 with a traceback)."""

    try:
        doc = _STRICT.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except RecursionError:  # deeper than Python's recursion limit (about 1000 levels)
        raise TooDeep(TOO_DEEP) from None
    # no more opening brackets than the limit (strings' included) bound the depth: most bodies end here
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and depth(doc) > MAX_JSON_DEPTH:
        raise TooDeep(TOO_DEEP)
    return doc


class TooDeep(ValueError):
    pass


def depth(doc: Any) -> int:
    """How deep a parsed document nests arrays and objects, counted up to one level past MAX_JSON_DEPTH; level by
    level over the containers only (a 1 MiB prompt is one string: nothing to walk). Scanning the body's bytes
    for brackets outside strings instead took 17 ms a MiB in Python, 8 ms with a regular expression on a prompt
    of code; the parser is C and 1 ms."""
    level = [doc] if type(doc) in (dict, list) else []
    deepest = 0
    while level and deepest <= MAX_JSON_DEPTH:
        deepest += 1
        level = [v for c in level for v in (c.values() if type(c) is dict else c) if type(v) in (dict, list)]
    return deepest
