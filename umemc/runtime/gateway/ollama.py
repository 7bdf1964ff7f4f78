"""Ollama's API at the gateway's root, for the clients that speak it (Open WebUI, agent frameworks, editors):
/api/version, /api/tags, /api/ps, /api/show, /api/chat, /api/generate, /api/embed (and the older /api/embeddings).

Each request is translated to the worker's OpenAI-compatible route and goes through `relay.forward` like any
other (the same admission, slots, generation budget and figures); the answer is translated back: one JSON object,
or NDJSON lines while it streams (Ollama streams unless "stream": false). `keep_alive` is Ollama's: a duration
("5m", 300) the model stays loaded once idle, 0 to unload it once idle, a negative one to keep it until it is
evicted; it never shields a model from admission or pressure. An empty chat or prompt loads (or, with keep_alive
0, unloads) the model, as in Ollama. Errors are Ollama's shape: {"error": "..."} with the HTTP status.

Ollama's API as documented in its repository (docs/api.md) and as its Python client (`ollama` on PyPI) reads it."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from ...units import parse_duration
from .app_keys import SCHED
from .bodies import admit_of, json_object
from .model import Model, Refused
from .relay import Call, Seen, forward
from .scheduler import Scheduler
from .surfaces import Surface
from .translate import Translation
from .usage import Usage

VERSION = "0.12.0"  # the Ollama API release whose routes and fields this module serves
NDJSON = "application/x-ndjson"
FOREVER = "2318-11-24T00:00:00Z"  # what Ollama says as the expiry of a model kept loaded until evicted
KEEP_ALIVE_MAX_S = (2**63 - 1) // 10**9  # Ollama's keep_alive is a Go time.Duration: at most 2^63-1 ns, ~292 years
# Ollama's options -> the OpenAI (llama-server) request fields that mean the same
OPTIONS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
    "stop": "stop", "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "num_predict": "max_tokens", "typical_p": "typical_p",
}  # fmt: skip


def keep_alive_of(raw: Any) -> float | None:
    """Seconds from Ollama's keep_alive (a number of seconds or a duration string; negative: math.inf); None when
    absent."""
    if raw is None:
        return None
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError
        text = str(raw).strip()
        negative = text.startswith("-")
        value = float(text) if _number(text) else parse_duration(text.lstrip("-"))
    except ValueError:
        raise Refused(
            f'keep_alive must be a duration ("5m", "1h", "-1" for always, 0 to unload; got {raw!r})', "invalid_json"
        ) from None
    if negative or value < 0:
        return math.inf
    if not math.isfinite(value):
        raise Refused(f"keep_alive must be finite (got {raw!r})", "invalid_json")
    if value > KEEP_ALIVE_MAX_S:  # past it no expiry can be said (a date past year 9999): one client's 500 for all
        raise Refused(
            f"keep_alive must be at most {KEEP_ALIVE_MAX_S} s (Ollama's longest duration; -1 keeps the model loaded "
            f"until it is evicted; got {raw!r})",
            "invalid_json",
        )
    return value


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def ns(seconds: float) -> int:
    return int(seconds * 1e9)


def ollama_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def stream_error(message: str) -> bytes:
    """Ollama streams an error as a line of its own."""
    return json.dumps({"error": message}).encode() + b"\n"


# -- the catalogue: version, tags, ps, show ------------------------------------------------------------------
async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": VERSION})


def _digest(m: Model) -> str:
    """What identifies the model's configuration (its argv: file, context, flags), as a sha256 hex digest."""
    return hashlib.sha256(json.dumps(m.plan.argv).encode()).hexdigest()


def _details(m: Model) -> dict[str, Any]:
    arch = m.plan.arch or m.plan.runtime
    return {
        "parent_model": "",
        "format": "gguf" if m.plan.model_file and m.plan.model_file.endswith(".gguf") else m.plan.runtime,
        "family": arch,
        "families": [arch],
        "parameter_size": "",
        "quantization_level": m.plan.quant or "",
    }


def _names(sched: Scheduler) -> Iterator[tuple[str, Model]]:
    """Every name a client may use (each model's, its aliases, the names models share), with its model (for a
    shared name, the one that would answer now)."""
    for name, target in sched.slots.routes.items():
        yield name, sched.models[target]
    for shared, names in sched.slots.groups.items():
        yield shared, sched.admission.choose(names)


async def tags(request: web.Request) -> web.Response:
    sched = request.app[SCHED]
    built = _iso(sched.run.plan.stat().st_mtime) if sched.run.plan.exists() else now_iso()
    models = [
        {
            "name": name,
            "model": name,
            "modified_at": built,
            "size": m.plan.estimate_parts.weights_bytes,
            "digest": _digest(m),
            "details": _details(m),
        }
        for name, m in _names(sched)
    ]
    return web.json_response({"models": models})


def expires_at(sched: Scheduler, m: Model) -> str:
    limit = sched.admission.idle_limit(m)
    if limit is None:
        return FOREVER
    return _iso(sched.slots[m.name].last_used + limit)


async def ps(request: web.Request) -> web.Response:
    sched = request.app[SCHED]
    models = [
        {
            "name": m.name,
            "model": m.name,
            "size": max(m.usage, m.plan.estimate_bytes),
            "digest": _digest(m),
            "details": _details(m),
            "expires_at": expires_at(sched, m),
            "size_vram": m.plan.gpu_bytes,
            "context_length": m.plan.context or 0,
        }
        for m in sched.models.values()
        if m.ready
    ]
    return web.json_response({"models": models})


CAPABILITIES = {"chat": ["completion"], "embeddings": ["embedding"], "audio": [], "image": [], "other": []}


async def show(request: web.Request) -> web.Response:
    doc = await json_object(request)
    asked, m = _model(request, doc)
    info: dict[str, Any] = {"general.architecture": m.plan.arch or m.plan.runtime}
    if m.plan.context:
        info[f"{m.plan.arch or m.plan.runtime}.context_length"] = m.plan.context
    return web.json_response(
        {
            "modelfile": f"# served by umemc as {asked}\n",
            "parameters": "",
            "template": "",
            "details": _details(m),
            "model_info": info,
            "capabilities": CAPABILITIES.get(m.kind, []),
            "modified_at": now_iso(),
        }
    )


# -- requests to the model ------------------------------------------------------------------------------------
def _model(request: web.Request, doc: dict[str, Any]) -> tuple[str, Model]:
    asked = doc.get("model", doc.get("name"))
    if not isinstance(asked, str) or not asked:
        raise Refused('request has no "model": name a model of this stack (GET /api/tags)', "model_missing")
    return asked, request.app[SCHED].slots.route(asked)


def _options(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    options = doc.get("options") or {}
    if not isinstance(options, dict):
        raise Refused('"options" must be an object', "invalid_json")
    for key, value in options.items():
        if key in OPTIONS and not (key == "num_predict" and isinstance(value, int) and value < 0):
            out[OPTIONS[key]] = value
    fmt = doc.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    return out


def _stream(doc: dict[str, Any]) -> dict[str, Any]:
    """Ollama streams unless told "stream": false; a stream asks the worker for its usage in the last chunk."""
    if doc.get("stream", True) is False:
        return {"stream": False}
    return {"stream": True, "stream_options": {"include_usage": True}}


def _messages(raw: Any) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI's: images (base64) become image parts of the content."""
    if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
        raise Refused('"messages" must be an array of objects', "invalid_json")
    out = []
    for msg in raw:
        one = {k: v for k, v in msg.items() if k in ("role", "content", "tool_calls", "tool_name", "name")}
        images = msg.get("images") or []
        if images:
            parts: list[dict[str, Any]] = [{"type": "text", "text": msg.get("content") or ""}]
            parts += [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{i}"}} for i in images]
            one["content"] = parts
        out.append(one)
    return out


async def chat(request: web.Request) -> web.StreamResponse:
    doc = await json_object(request)
    asked, m = _model(request, doc)
    keep = keep_alive_of(doc.get("keep_alive"))
    messages = _messages(doc.get("messages") or [])
    if not messages:
        return await _load_or_unload(request, m, asked, keep, "message")
    body = {"model": asked, "messages": messages, **_stream(doc), **_options(doc)}
    if isinstance(doc.get("tools"), list):
        body["tools"] = doc["tools"]
    return await _send(request, m, asked, keep, "/v1/chat/completions", body, "message")


async def generate(request: web.Request) -> web.StreamResponse:
    doc = await json_object(request)
    asked, m = _model(request, doc)
    keep = keep_alive_of(doc.get("keep_alive"))
    prompt = doc.get("prompt") or ""
    if not isinstance(prompt, str):
        raise Refused('"prompt" must be a string', "invalid_json")
    if not prompt:
        return await _load_or_unload(request, m, asked, keep, "response")
    options = _options(doc)
    if doc.get("raw"):  # the prompt as it is, no template: a plain completion
        body: dict[str, Any] = {"model": asked, "prompt": prompt, **_stream(doc), **options}
        return await _send(request, m, asked, keep, "/v1/completions", body, "response")
    messages = [{"role": "system", "content": doc["system"]}] if isinstance(doc.get("system"), str) else []
    messages += _messages([{"role": "user", "content": prompt, "images": doc.get("images") or []}])
    body = {"model": asked, "messages": messages, **_stream(doc), **options}
    return await _send(request, m, asked, keep, "/v1/chat/completions", body, "response")


async def embed(request: web.Request) -> web.StreamResponse:
    doc = await json_object(request)
    asked, m = _model(request, doc)
    keep = keep_alive_of(doc.get("keep_alive"))
    given = doc.get("input", [])
    if not given:
        return await _load_or_unload(request, m, asked, keep, None)
    if not isinstance(given, (str, list)):
        raise Refused('"input" must be a string or an array of strings', "invalid_json")
    body = {"model": asked, "input": given}
    return await _send(request, m, asked, keep, "/v1/embeddings", body, "embeddings")


async def embeddings(request: web.Request) -> web.StreamResponse:
    """The older route: one prompt, one vector ({"embedding": [...]})."""
    doc = await json_object(request)
    asked, m = _model(request, doc)
    keep = keep_alive_of(doc.get("keep_alive"))
    if not isinstance(doc.get("prompt"), str) or not doc["prompt"]:
        return await _load_or_unload(request, m, asked, keep, None)
    body = {"model": asked, "input": doc["prompt"]}
    return await _send(request, m, asked, keep, "/v1/embeddings", body, "embedding")


async def _load_or_unload(
    request: web.Request, m: Model, asked: str, keep: float | None, field: str | None
) -> web.Response:
    """An empty request: keep_alive 0 unloads the model (once its requests are done), anything else loads it under
    the same admission as a cold start and sets how long it stays."""
    sched = request.app[SCHED]
    if keep == 0:
        await sched.actions.stop_now(m, drain=True)
        reason = "unload"
    else:
        await sched.actions.load(m, admit_of(request))
        sched.process.keep_alive(m, keep)
        reason = "load"
    doc: dict[str, Any] = {"model": asked, "created_at": now_iso(), "done": True, "done_reason": reason}
    if field == "message":
        doc["message"] = {"role": "assistant", "content": ""}
    elif field == "response":
        doc["response"] = ""
    else:
        doc = {"model": asked, "embeddings": []}
    return web.json_response(doc)


async def _send(
    request: web.Request, m: Model, asked: str, keep: float | None, path: str, body: dict[str, Any], field: str
) -> web.StreamResponse:
    request.app[SCHED].process.keep_alive(m, keep)  # keep_alive 0: housekeeping unloads it once this request is done
    call = Call("POST", path, json.dumps(body).encode(), asked)
    relay = _Translate(field, time.monotonic(), stream=bool(body.get("stream")))
    return await forward(request, m, call, relay.run)


class _Translate(Translation):
    """The worker's OpenAI answer in Ollama's words: `field` is where the text goes (message, response) or the
    vectors (embeddings, embedding)."""

    stream_type = NDJSON
    stream_error = staticmethod(stream_error)

    def __init__(self, field: str, began: float, *, stream: bool):
        super().__init__(stream=stream)
        self.field, self.began = field, began

    def refuse(self, status: int, message: str) -> web.Response:
        return ollama_error(status, message)

    def _timings(self, usage: Usage, seen: Seen) -> dict[str, Any]:
        total = time.monotonic() - self.began
        out: dict[str, Any] = {"total_duration": ns(total), "load_duration": ns(seen.queue_wait_s)}
        if usage.tokens_in is not None:
            out["prompt_eval_count"] = usage.tokens_in
        if usage.tokens_out is not None:
            out["eval_count"] = usage.tokens_out
            out["eval_duration"] = ns(seen.upstream_s)
        return out

    def whole(self, asked: str, doc: dict[str, Any], seen: Seen) -> dict[str, Any]:
        if self.field in ("embeddings", "embedding"):
            vectors = [d.get("embedding") for d in doc.get("data", [])]
            if self.field == "embedding":
                return {"embedding": vectors[0] if vectors else []}
            out = {"model": asked, "embeddings": vectors, **self._timings(seen.usage, seen)}
            out.pop("eval_duration", None)
            return out
        choice = (doc.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        text = message.get("content") if self.field == "message" else choice.get("text", message.get("content"))
        out = {"model": asked, "created_at": now_iso(), **self._said(text or "", message.get("tool_calls"))}
        return (
            out | {"done": True, "done_reason": _reason(choice.get("finish_reason"))} | self._timings(seen.usage, seen)
        )

    def _said(self, text: str, tool_calls: Any = None) -> dict[str, Any]:
        if self.field == "message":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = [_tool_call(t) for t in tool_calls]
            return {"message": message}
        return {"response": text}

    def piece(self, asked: str, event: bytes, state: dict[str, Any]) -> bytes:
        """One event of the worker's stream as an NDJSON line (or nothing: a chunk without text)."""
        if event == b"[DONE]":
            return b""
        try:
            return self._piece(asked, json.loads(event), state)
        except (ValueError, AttributeError, TypeError, RecursionError):  # an unreadable event is skipped, not fatal
            return b""

    def _piece(self, asked: str, doc: Any, state: dict[str, Any]) -> bytes:
        for choice in doc.get("choices") or []:
            if choice.get("finish_reason"):
                state["reason"] = choice["finish_reason"]
            delta = choice.get("delta") or {}
            text = delta.get("content") if "delta" in choice else choice.get("text")
            if text:
                line = {"model": asked, "created_at": now_iso(), **self._said(text), "done": False}
                return json.dumps(line).encode() + b"\n"
        return b""

    def last(self, asked: str, state: dict[str, Any], seen: Seen) -> bytes:
        line = {"model": asked, "created_at": now_iso(), **self._said("")}
        line |= {"done": True, "done_reason": _reason(state.get("reason"))} | self._timings(seen.usage, seen)
        return json.dumps(line).encode() + b"\n"


def _reason(finish: Any) -> str:
    return "length" if finish == "length" else "stop"


def _tool_call(call: Any) -> dict[str, Any]:
    """OpenAI's tool call (arguments as a JSON string) as Ollama's (arguments as an object)."""
    fn = call.get("function", {}) if isinstance(call, dict) else {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            args = {}
    return {"function": {"name": fn.get("name", ""), "arguments": args or {}}}


# Ollama's clients read {"error": "..."}, send the token (where one is asked) as a Bearer token
SURFACE = Surface(
    "ollama",
    ("/api/",),
    ("authorization",),
    lambda status, message, code, wait: ollama_error(status, message),
    stream_error,
)
ROUTES = (
    web.get("/api/version", version),
    web.get("/api/tags", tags),
    web.get("/api/ps", ps),
    web.post("/api/show", show),
    web.post("/api/chat", chat),
    web.post("/api/generate", generate),
    web.post("/api/embed", embed),
    web.post("/api/embeddings", embeddings),
)
