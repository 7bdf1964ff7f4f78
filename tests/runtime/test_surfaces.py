"""Every client API the gateway speaks (OpenAI's chat, Anthropic's messages, Ollama's chat) through the same cases,
as uvicorn runs every test over both of its parsers: a refusal said in the API's own shape, a stream the worker cuts
ended with the API's own error, a request that waits for a cold start answered once the model is up, and the tokens
an answer says counted. In milliseconds: the whole application (app.make_app, the door included) over the
scheduler's fake supervisord (tests/runtime/test_scheduler.py) and a worker written byte for byte
(tests/runtime/test_upstream.py), on real loopback sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.runtime.test_scheduler import FakeSupervisor, model, scheduler
from tests.runtime.test_upstream import Worker
from umemc.runtime.gateway.app import make_app
from umemc.runtime.gateway.scheduler import Scheduler


@dataclass(frozen=True)
class Api:
    name: str
    path: str  # the client's route
    worker_path: str  # what the gateway asks the worker (Ollama's is translated into OpenAI's)
    body: Callable[[str, bool], dict[str, Any]]  # the client's request for (model, stream)
    answer: bytes  # the worker's whole answer (its API's shape), saying 7 tokens in and 3 out
    stream: tuple[bytes, ...]  # the worker's first events of a stream (it is cut after them)
    refusal: Callable[[dict[str, Any]], tuple[str, str]]  # a refusal's body -> (its message, its shape's kind)
    cut: Callable[[bytes], str]  # the client's stream -> the error its last line says
    text: Callable[[dict[str, Any]], str]  # a whole answer -> its text


def _openai_refusal(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["error"]["message"], doc["error"]["type"]


def _anthropic_refusal(doc: dict[str, Any]) -> tuple[str, str]:
    assert doc["type"] == "error"
    return doc["error"]["message"], doc["error"]["type"]


def _ollama_refusal(doc: dict[str, Any]) -> tuple[str, str]:
    assert set(doc) == {"error"}
    return doc["error"], "error"


def _sse_error(body: bytes) -> str:
    """The last event's error (OpenAI's `data:` line, or Anthropic's `event: error` with its data)."""
    events = [e for e in body.split(b"\n\n") if e.strip()]
    data = json.loads(events[-1].split(b"data: ", 1)[1])
    return str(data["error"]["message"])


def _ndjson_error(body: bytes) -> str:
    return str(json.loads(body.strip().splitlines()[-1])["error"])


OPENAI_ANSWER = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }
).encode()
OPENAI_CHUNK = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"content":"Pa"},"finish_reason":null}]}\n\n'
)
ANTHROPIC_ANSWER = json.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "Paris"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }
).encode()
ANTHROPIC_EVENTS = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message","role":'
    b'"assistant","model":"m","content":[],"usage":{"input_tokens":7,"output_tokens":0}}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    b'"text":"Pa"}}\n\n',
)


def _chat(model_name: str, stream: bool) -> dict[str, Any]:
    return {"model": model_name, "messages": [{"role": "user", "content": "Capital of France?"}], "stream": stream}


APIS = [
    Api("openai", "/v1/chat/completions", "/v1/chat/completions", _chat, OPENAI_ANSWER, (OPENAI_CHUNK,),
        _openai_refusal, _sse_error, lambda doc: doc["choices"][0]["message"]["content"]),
    Api("anthropic", "/v1/messages", "/v1/messages", lambda m, s: _chat(m, s) | {"max_tokens": 16},
        ANTHROPIC_ANSWER, ANTHROPIC_EVENTS, _anthropic_refusal, _sse_error, lambda doc: doc["content"][0]["text"]),
    Api("ollama", "/api/chat", "/v1/chat/completions", _chat, OPENAI_ANSWER, (OPENAI_CHUNK,), _ollama_refusal,
        _ndjson_error, lambda doc: doc["message"]["content"]),
]  # fmt: skip
REFUSAL_KIND = {"openai": "invalid_request_error", "anthropic": "not_found_error", "ollama": "error"}


def whole(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def posts(worker: Worker) -> list[bytes]:
    """What the worker was asked but the gateway's health probes."""
    return [r for r in worker.requests if r.startswith(b"POST ")]


def cut_stream(events: tuple[bytes, ...]) -> bytes:
    """A chunked event stream's head and first events, with no end: the worker then closes the connection."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events)


Scene = Callable[[Scheduler, aiohttp.ClientSession, Worker], Awaitable[None]]


def run(tmp_path: Path, answer: bytes, scene: Scene, mode: str = "hot", sv: FakeSupervisor | None = None) -> Worker:
    """The gateway's application for a stack of one model `m` over the fake supervisord, its worker answering every
    request with `answer` (and closing the connection), `scene` played against it; returns the worker (what it
    was asked)."""
    sv = sv if sv is not None else FakeSupervisor(running=("m",) if mode == "hot" else ())
    box: list[Worker] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        asked = await box[0].request(reader)
        if asked.startswith(b"GET "):  # the gateway's health probe: answered once supervisord runs it
            if sv.states.get("m") == "RUNNING":
                writer.write(whole(b"{}"))
        else:
            writer.write(answer)
        await writer.drain()

    async def main() -> None:
        async with Worker(serve) as worker:
            box.append(worker)
            sched = scheduler(tmp_path, model("m", 50, mode=mode) + f"port = {worker.port}\n", sv)
            app = make_app(sched, None)
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()  # the application's start started the scheduler too (app._lifetime)
            base = f"http://127.0.0.1:{runner.addresses[0][1]}"
            try:
                # the stack's gateway port is not this server's: the Host the door allows is said without a port
                async with aiohttp.ClientSession(base, headers={"Host": "127.0.0.1"}) as client:
                    await asyncio.wait_for(scene(sched, client, worker), 10)
            finally:
                await sched.close()
                await runner.cleanup()

    asyncio.run(main())
    return box[0]


@pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])
def test_a_refusal_is_said_in_the_apis_own_shape(tmp_path: Path, api: Api) -> None:
    async def scene(sched: Scheduler, client: aiohttp.ClientSession, worker: Worker) -> None:
        async with client.post(api.path, json=api.body("nope", False)) as resp:
            assert resp.status == 404
            message, kind = api.refusal(await resp.json())
        assert message == "model 'nope' is not in this stack (known: m)"
        assert kind == REFUSAL_KIND[api.name]
        assert posts(worker) == []

    run(tmp_path, whole(api.answer), scene)


@pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])
def test_a_stream_the_worker_cuts_ends_with_the_apis_own_error(tmp_path: Path, api: Api) -> None:
    async def scene(sched: Scheduler, client: aiohttp.ClientSession, worker: Worker) -> None:
        async with client.post(api.path, json=api.body("m", True)) as resp:
            assert resp.status == 200
            body = await resp.read()
        assert b'"Pa"' in body  # what came before the cut was relayed (translated, for Ollama)
        assert api.cut(body) == "worker m cut its answer: the worker closed the connection in the middle of an answer"
        assert posts(worker)[0].split(b" ", 2)[:2] == [b"POST", api.worker_path.encode()]

    run(tmp_path, cut_stream(api.stream), scene)


@pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])
def test_a_request_waits_for_a_cold_start_and_is_answered(tmp_path: Path, api: Api) -> None:
    sv = FakeSupervisor()
    sv.hold.add("m")  # its start stays STARTING until the scene lets it go

    async def scene(sched: Scheduler, client: aiohttp.ClientSession, worker: Worker) -> None:
        asked = asyncio.create_task(client.post(api.path, json=api.body("m", False)))
        while not sv.started:
            await asyncio.sleep(0.001)
        while sched.slots["m"].queued < 1:  # the request is in the model's queue
            await asyncio.sleep(0.001)
        assert not asked.done() and posts(worker) == []  # waiting for its start
        sv.states["m"] = "RUNNING"
        async with await asked as resp:
            assert resp.status == 200
            doc = await resp.json()
        assert api.text(doc) == "Paris" and sv.started == ["m"]

    run(tmp_path, whole(api.answer), scene, mode="cold", sv=sv)


@pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])
def test_the_tokens_an_answer_says_are_counted(tmp_path: Path, api: Api) -> None:
    async def scene(sched: Scheduler, client: aiohttp.ClientSession, worker: Worker) -> None:
        async with client.post(api.path, json=api.body("m", False)) as resp:
            assert resp.status == 200
            await resp.read()
        traffic = sched.traffic["m"]
        assert (traffic.tokens_in, traffic.tokens_out) == (7, 3)

    run(tmp_path, whole(api.answer), scene)
