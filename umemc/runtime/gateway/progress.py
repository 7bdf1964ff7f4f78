"""A streamed request that waits for a cold start is told what is happening while it waits: which models are being
stopped to make room, the start, and how far the load has come: llama.cpp's own log lines name the load's steps
(the weights, then the KV cache and compute buffers, then "model loaded"), and the enforcer's figure for the
worker's memory against its weights says how much of them is in.

(llama-server also reports a load percentage, but only as a child of llama.cpp's own router: given
LLAMA_SERVER_ROUTER_PORT it watches its stdin and, stopped, waits for that stdin to close before it exits, which
under supervisord never comes: supervisord's stop then times out. umemc does not run it that way.)

The stream begins only once the wait has lasted the slots' WAIT_GRACE_S: a request answered at once, or refused at
once, keeps the plain HTTP answer. Then the 200 and the event-stream headers go out, and each change of stage is sent
as an event-stream comment (gateway.loading_progress = "comment": OpenAI clients skip comments) or as a chat chunk
with `reasoning_content` ("reasoning": chat UIs show it as the model's thinking); the worker's own stream follows in
the same response. A refusal after that point is an error event in the stream, as OpenAI streams errors."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from .model import Model, Refused

EVERY_S = 0.1  # how often the stage is looked at while waiting
TAIL = 256 * 1024
STREAMS = re.compile(rb'"stream"\s*:\s*true')
# The log lines that begin each step of a load, latest first: llama.cpp's (src/llama-model.cpp load_tensors,
# src/llama-context.cpp, tools/server/server.cpp) and vLLM's, whose start takes minutes (its API server, then its
# engine core process, its worker loading the weights, its KV cache allocated, its model warmed up or compiled:
# vllm/v1/engine/core.py, vllm/v1/worker/*_model_runner.py, vllm/v1/core/kv_cache_utils.py)
STEPS = (
    (b"model loaded", "warming up"),
    (b"llama_context: constructing llama_context", "allocating the KV cache and compute buffers"),
    (b"load_tensors: loading model tensors", "loading weights"),
    (b"init engine (profile, create kv cache, warmup model) took", "starting its API server"),
    (b"Warming up model", "warming up (compiling its graphs)"),
    (b"KV cache size:", "KV cache allocated"),
    (b"Loading weights took", "allocating the KV cache"),
    (b"Starting to load model", "loading weights"),
    (b"Initializing a V1 LLM engine", "starting its engine"),
)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def load_step(log: Path, since: int) -> str | None:
    """The step of its load a llama.cpp worker's log has reached after byte `since` (None: none yet, or a runtime
    whose log says none of them)."""
    try:
        with log.open("rb") as f:
            end = f.seek(0, 2)
            f.seek(max(since, end - TAIL))
            data = f.read()
    except OSError:
        return None
    return next((step for line, step in STEPS if line in data), None)


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


class Progress:
    """One streamed request's wait, said as it goes (`run`, the slot's while_waiting), and the response it began."""

    def __init__(
        self, request: web.Request, stage: Callable[[Model], str], m: Model, asked: str, style: str, *, chat: bool
    ):
        """`stage` says what a model's start is doing now (the scheduler's word for it)."""
        self.request, self.stage, self.m, self.asked = request, stage, m, asked
        self.reasoning = style == "reasoning" and chat  # a reasoning chunk is a chat chunk: completions get comments
        self.resp: web.StreamResponse | None = None

    async def run(self) -> None:
        resp = self.resp
        if resp is None:  # once: a request sent again (its worker went away) goes on in the same stream
            resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
            await resp.prepare(self.request)
            self.resp = resp
        said = None
        while True:
            stage = self.stage(self.m)
            if stage != said:
                await resp.write(self.event(stage))
                said = stage
            await asyncio.sleep(EVERY_S)

    def event(self, stage: str) -> bytes:
        if not self.reasoning:
            return f": umemc: {self.m.name}: {stage}\n\n".encode()
        chunk: dict[str, Any] = {
            "id": "umemc-loading",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.asked,
            "choices": [{"index": 0, "delta": {"reasoning_content": f"{stage}\n"}, "finish_reason": None}],
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    async def fail(self, exc: Refused, status: int) -> web.StreamResponse:
        """A refusal after the stream began: an error event, then the end."""
        assert self.resp is not None
        body = {"error": {"message": exc.message, "type": "server_error", "code": exc.code, "status": status}}
        await self.resp.write(b"data: " + json.dumps(body).encode() + b"\n\n")
        await self.resp.write_eof()
        return self.resp
