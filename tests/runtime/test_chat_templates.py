"""umemc's Jinja for llama.cpp's built-in template names, against llama.cpp itself: two real llama-servers per format,
one applying the built-in name with its own formatter (Jinja off), one given umemc's text (Jinja on), format the same
chats into the same prompt, byte for byte (llama-server's /apply-template); with tools, the Jinja one lists them, says
how a call is written, renders a call and its result, and llama.cpp reads the template as one that calls tools."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import patience
from tests.realmodels import LLAMA_SERVER, SMOLLM2, needs_llama_server, needs_models
from tests.runtime.conftest import free_port
from umemc.catalog.chat_templates import FORMATS, jinja

pytestmark = [needs_models, *needs_llama_server]

CHATS = [
    [{"role": "user", "content": "Hi"}],
    # a system turn, text with spaces at both ends (some formats trim), a model turn between two of the user's
    [
        {"role": "system", "content": "Be brief. "},
        {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a colour."},
    ],
    [{"role": "system", "content": "A"}, {"role": "system", "content": " B "}, {"role": "user", "content": "Hi"}],
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALLED = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


class Server:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        argv = [LLAMA_SERVER, "-m", str(SMOLLM2), "-c", "512", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def ready(self) -> None:
        """Its health answers 200 (read from its log: llama-server says when it listens; its exit ends the wait)."""
        log = self.proc.stderr
        assert log is not None
        for line in log:
            if b"listening on" in line:
                threading.Thread(target=log.read, daemon=True).start()  # drained to its end: never a full pipe
                return
        raise AssertionError(f"llama-server exited {self.proc.wait()} before listening")

    def ask(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=patience(60)) as answer:
            return json.load(answer)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(params=sorted(FORMATS))
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[str, Server, Server]]:
    name = request.param
    text = jinja(name)
    assert text is not None
    builtin, ours = Server("--no-jinja", "--chat-template", name), Server("--chat-template", text)
    try:
        builtin.ready()
        ours.ready()
        yield name, builtin, ours
    finally:
        builtin.stop()
        ours.stop()


def test_umemc_jinja_formats_a_chat_as_llama_cpp_formats_the_name(pair: tuple[str, Server, Server]) -> None:
    name, builtin, ours = pair
    for chat in CHATS:
        expected = builtin.ask("/apply-template", {"messages": chat})["prompt"]
        assert ours.ask("/apply-template", {"messages": chat})["prompt"] == expected, (name, chat)
    # the name's formatter refuses tools outright; the Jinja text takes them
    with pytest.raises(urllib.error.HTTPError) as refused:
        builtin.ask("/v1/chat/completions", {"messages": CHATS[0], "tools": TOOLS, "max_tokens": 1})
    assert refused.value.code == 500 and b"--jinja" in refused.value.read()
    caps = ours.ask("/props")["chat_template_caps"]
    assert (caps["supports_tools"], caps["supports_tool_calls"]) == (True, True)
    prompt = ours.ask("/apply-template", {"messages": CALLED, "tools": TOOLS})["prompt"]
    schema = json.dumps(TOOLS[0]["function"]["parameters"])
    assert '"name": "get_weather"' in prompt and schema in prompt and "<tools>" in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    answer = ours.ask("/v1/chat/completions", {"messages": CHATS[0], "tools": TOOLS, "max_tokens": 4})
    assert answer["choices"][0]["message"]["role"] == "assistant"
