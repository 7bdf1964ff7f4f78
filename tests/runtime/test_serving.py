"""The gateway as the server clients talk to, for real: real llama-server processes serving the two real tiny models
from PyPI (SmolLM2-135M-Instruct, hot, with an alias; Gemma 3 270M, cold, whose file has no chat template: the
stack names Gemma's; SmolLM2 again as an embedding server), under `umemc up`, through the real `openai` and
`ollama` Python clients. SmolLM2 answers "What is the capital of France? Answer in one word." with Paris: a broken
template or relay would show."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import patience
from tests.realmodels import GEMMA3, LLAMA_SERVER, MODELS, SMOLLM2, needs_llama_server, needs_models
from tests.runtime.conftest import bring_down, bring_up, free_port, live_sysctl_table
from tests.runtime.test_gateway import Gateway

pytestmark = [pytest.mark.slow, needs_models, *needs_llama_server]
ASK = "What is the capital of France? Answer in one word."
QUESTION = [{"role": "user", "content": ASK}]


def served(name: str, model: Path, extra: str) -> str:
    return (
        f'\n[models.{name}]\nruntime = "llama-server"\nbin = "{LLAMA_SERVER}"\nmodel = "{model}"\ncontext = 1024\n'
        f"port = {free_port()}\n{extra}"
    )


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    text = (
        'version = 1\nname = "serving"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\nos_reserve = "1GiB"\n'
        f"{live_sysctl_table()}[gateway]\nport = {free_port()}\n"
        + served("smollm2", SMOLLM2, 'mode = "hot"\npriority = 80\naliases = ["tiny-chat"]\n')
        + served("gemma3", GEMMA3, 'mode = "cold"\npriority = 50\nchat_template = "gemma"\n')
        + served("embed", SMOLLM2, 'mode = "cold"\nkind = "embeddings"\nargs = ["--embeddings", "--pooling", "mean"]\n')
    )
    r = bring_up(tmp_path_factory.mktemp("serving"), text)
    try:
        yield Gateway(r)
    finally:
        bring_down(r)


def raw(gw: Gateway, path: str, body: dict[str, Any]) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=patience(120))
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    data = conn.getresponse().read()
    conn.close()
    return data


def test_openai_answers_name_the_model_or_alias_asked_for_never_a_path(gw: Gateway) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="none", timeout=patience(120))
    answer = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=16)
    assert answer.model == "smollm2"
    assert "Paris" in (answer.choices[0].message.content or "")
    chunks = list(
        client.chat.completions.create(model="tiny-chat", messages=QUESTION, temperature=0, max_tokens=16, stream=True)
    )
    assert {c.model for c in chunks} == {"tiny-chat"}
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    completion = client.completions.create(model="tiny-chat", prompt="The capital of France is", max_tokens=4)
    assert completion.model == "tiny-chat"
    # the bytes as they come, plain and streamed: no file of this machine in them
    for body in (
        {"model": "smollm2", "messages": QUESTION, "max_tokens": 4},
        {"model": "smollm2", "messages": QUESTION, "max_tokens": 4, "stream": True},
        {"model": "smollm2", "prompt": "hi", "max_tokens": 4, "stream": True},
    ):
        data = raw(gw, "/v1/completions" if "prompt" in body else "/v1/chat/completions", body)
        assert b'"model":"smollm2"' in data
        assert b".gguf" not in data and str(MODELS).encode() not in data


def test_a_file_without_a_template_chats_in_the_one_the_stack_names(gw: Gateway) -> None:
    """Gemma 3 270M's file has none: without chat_template llama.cpp formats in ChatML and the model answered
    `<|im_start|>admin ...`; with Gemma's built-in template (and llama-server's own formatter) no ChatML marker is
    left in the answer. This 270M model is a base model, so what it says is not checked beyond that."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="none", timeout=patience(120))
    answer = client.chat.completions.create(model="gemma3", messages=QUESTION, temperature=0, max_tokens=24)
    text = answer.choices[0].message.content or ""
    assert answer.model == "gemma3" and text
    assert "<|im_start|>" not in text and "<|im_end|>" not in text
    # what llama-server formats a chat into, asked of the worker itself
    status, _, body = gw.call("POST", "/models/gemma3/apply-template", {"messages": QUESTION})
    assert (status, body["prompt"]) == (
        200,
        f"<start_of_turn>user\n{ASK}<end_of_turn>\n<start_of_turn>model\n",
    )


GREEDY = {"temperature": 0}  # the anthropic SDK (2.x) takes no temperature of its own: sent as part of the body


def counted(gw: Gateway, name: str) -> tuple[int, int]:
    m = gw.status()["models"][name]
    return m["tokens_in"], m["tokens_out"]


def test_anthropic_and_the_responses_api_answer_through_the_gateway_and_are_counted(gw: Gateway) -> None:
    """The anthropic SDK (what Claude Code speaks) and the openai SDK's Responses API, plain and streamed, through
    the gateway to llama-server: Paris, the model named as asked, and every token they say they used on the
    model's figures (Anthropic's input is its input_tokens plus what the prompt cache read)."""
    import anthropic
    import openai

    before = counted(gw, "smollm2")
    claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{gw.port}", api_key="none", timeout=patience(120))
    said = claude.messages.create(model="smollm2", max_tokens=16, messages=QUESTION, extra_body=GREEDY)
    assert said.model == "smollm2" and "Paris" in said.content[0].text
    used = [(said.usage.input_tokens + (said.usage.cache_read_input_tokens or 0), said.usage.output_tokens)]
    with claude.messages.stream(model="tiny-chat", max_tokens=16, messages=QUESTION, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert "Paris" in text and final.model == "tiny-chat"
    used.append((final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0), final.usage.output_tokens))
    assert claude.messages.count_tokens(model="smollm2", messages=QUESTION).input_tokens > 0

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="none", timeout=patience(120))
    answer = client.responses.create(model="smollm2", input=ASK, max_output_tokens=16, temperature=0)
    assert answer.model == "smollm2" and "Paris" in answer.output_text
    assert answer.usage is not None
    used.append((answer.usage.input_tokens, answer.usage.output_tokens))
    events = list(client.responses.create(model="tiny-chat", input=ASK, max_output_tokens=16, temperature=0,
                                          stream=True))  # fmt: skip
    done = [e.response for e in events if e.type == "response.completed"]
    assert len(done) == 1 and done[0].usage is not None and done[0].model == "tiny-chat"
    assert "Paris" in "".join(e.delta for e in events if e.type == "response.output_text.delta")
    used.append((done[0].usage.input_tokens, done[0].usage.output_tokens))

    want = (before[0] + sum(i for i, _ in used), before[1] + sum(o for _, o in used))
    wait_for(
        "the four answers counted", lambda: counted(gw, "smollm2") == want, seen=lambda: (counted(gw, "smollm2"), want)
    )


WEATHER = {
    "name": "get_weather",
    "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_tools_reach_a_model_on_a_built_in_template_through_every_client_api(gw: Gateway) -> None:
    """gemma3 runs on Gemma's built-in format (its file has none): a request with tools is answered on OpenAI's,
    Ollama's and Anthropic's routes (with llama.cpp's formatter it was a 500, "tools param requires --jinja"), and
    the tools are in the prompt the model read: each request reads the tool's ~100 tokens more than without."""
    import anthropic
    import ollama
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="none", timeout=patience(120))
    plain = client.chat.completions.create(model="gemma3", messages=QUESTION, max_tokens=2)
    with_tools = client.chat.completions.create(
        model="gemma3", messages=QUESTION, max_tokens=2, tools=[{"type": "function", "function": WEATHER}]
    )
    assert plain.usage is not None and with_tools.usage is not None
    extra = with_tools.usage.prompt_tokens - plain.usage.prompt_tokens
    assert extra > 50

    local = ollama.Client(host=f"http://127.0.0.1:{gw.port}", timeout=patience(120))
    said = local.chat(model="gemma3", messages=QUESTION, options={"num_predict": 2},
                      tools=[{"type": "function", "function": WEATHER}])  # fmt: skip
    assert said.done and said.prompt_eval_count is not None and said.prompt_eval_count - plain.usage.prompt_tokens > 50

    claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{gw.port}", api_key="none", timeout=patience(120))
    tool = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
    bare = claude.messages.create(model="gemma3", max_tokens=2, messages=QUESTION)
    told = claude.messages.create(model="gemma3", max_tokens=2, messages=QUESTION, tools=[tool])

    def read(u: Any) -> int:
        return int(u.input_tokens + (u.cache_read_input_tokens or 0))

    assert read(told.usage) - read(bare.usage) > 50


def embedding_length(path: Path) -> int:
    import gguf

    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    return int(reader.fields[f"{arch}.embedding_length"].parts[-1][0])


def test_the_ollama_client_lists_shows_chats_generates_and_embeds(gw: Gateway) -> None:
    import ollama

    client = ollama.Client(host=f"http://127.0.0.1:{gw.port}", timeout=patience(120))
    listed = {m.model: m for m in client.list().models}
    assert sorted(listed) == ["embed", "gemma3", "smollm2", "tiny-chat"]
    assert (listed["smollm2"].details.family, listed["smollm2"].details.quantization_level) == ("llama", "Q4_1")
    assert (listed["gemma3"].details.family, listed["gemma3"].details.quantization_level) == ("gemma3", "Q4_K_M")
    shown = client.show("gemma3")
    assert shown.capabilities == ["completion"] and shown.modelinfo["general.architecture"] == "gemma3"
    assert client.show("embed").capabilities == ["embedding"]

    said = client.chat(model="smollm2", messages=QUESTION, options={"temperature": 0, "num_predict": 16}, stream=False)
    assert (said.model, said.done, said.done_reason) == ("smollm2", True, "stop")
    assert "Paris" in said.message.content and said.eval_count and said.prompt_eval_count
    parts = list(client.chat(model="tiny-chat", messages=QUESTION, options={"temperature": 0}, stream=True))
    assert [p.done for p in parts][-1] is True and not any(p.done for p in parts[:-1])
    assert {p.model for p in parts} == {"tiny-chat"}
    assert "Paris" in "".join(p.message.content or "" for p in parts)
    generated = client.generate(model="smollm2", prompt=ASK, options={"temperature": 0})
    assert "Paris" in generated.response and generated.done

    vectors = client.embed(model="embed", input=["hello", "world"])
    width = embedding_length(SMOLLM2)  # the real file's hidden size (576 for SmolLM2-135M)
    assert [len(v) for v in vectors.embeddings] == [width, width]
    assert vectors.model == "embed"
    running = {m.model for m in client.ps().models}
    assert {"smollm2", "embed"} <= running


def wait_for(what: str, predicate: Any, timeout: float = 60, seen: Any = None) -> Any:
    """Until predicate() is truthy; on a timeout, what `seen()` says then is in the message."""
    deadline = time.monotonic() + patience(timeout)
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f": {seen()}" if seen is not None else ""))


def test_keep_alive_loads_keeps_and_unloads_as_ollama_means_it(gw: Gateway) -> None:
    import ollama

    client = ollama.Client(host=f"http://127.0.0.1:{gw.port}", timeout=patience(120))
    loaded = client.chat(model="gemma3", messages=[], keep_alive=-1)  # an empty chat loads, kept until evicted
    assert (loaded.done, loaded.done_reason) == (True, "load")
    [gemma] = [m for m in client.ps().models if m.model == "gemma3"]
    assert gemma.expires_at is not None and gemma.expires_at.year == 2318
    assert gw.status()["models"]["gemma3"]["keep_alive_s"] == "forever"

    unloaded = client.generate(model="gemma3", prompt="", keep_alive=0)  # an empty prompt with 0 unloads
    assert (unloaded.done, unloaded.done_reason) == (True, "unload")
    assert "gemma3" not in {m.model for m in client.ps().models}
    assert gw.run.status()["gemma3"]["state"] == "STOPPED"

    # keep_alive 0 on a request: answered, then unloaded once idle (on the OpenAI route as well)
    status, _, body = gw.call(
        "POST", "/v1/chat/completions", {"model": "gemma3", "messages": QUESTION, "max_tokens": 2, "keep_alive": 0}
    )
    assert (status, body["model"]) == (200, "gemma3")
    unload = wait_for("gemma3 unloaded by its keep_alive", lambda: gw.run.events("ttl_unload", "gemma3"))
    assert (unload[-1]["detail"]["reason"], unload[-1]["detail"]["ttl_s"]) == ("keep_alive", 0)


def test_the_router_routes_load_list_and_unload(gw: Gateway) -> None:
    def states() -> dict[str, str]:
        return {m["id"]: m["status"]["value"] for m in gw.call("GET", "/models")[2]["data"]}

    wait_for(
        "gemma3 down",
        lambda: states()["gemma3"] == "unloaded",
        seen=lambda: (states(), gw.status()["models"]["gemma3"], gw.run.status()["gemma3"], gw.run.events()[-8:]),
    )
    assert gw.call("POST", "/models/load", {"model": "gemma3"})[::2] == (200, {"success": True})
    assert states()["gemma3"] == "loaded"  # the load answers once the model is ready
    assert gw.call("POST", "/models/unload", {"model": "gemma3"})[::2] == (200, {"success": True})
    assert states()["gemma3"] == "unloaded"
    status, _, body = gw.call("POST", "/models/unload", {"model": "gemma3"})
    assert (status, body["error"]["message"]) == (400, "model gemma3 is not running")
    # every stop of gemma3 so far was asked for (loads, unloads, a keep-alive): none is a restart
    assert gw.run.status()["gemma3"]["restarts"] == 0


def test_a_streamed_request_hears_the_cold_start_it_waits_for(gw: Gateway) -> None:
    """gemma3 is down: a streamed chat for it gets event-stream comments (which the openai client skips) saying
    the start and the steps of llama.cpp's load, then the answer in the same stream."""
    import openai

    wait_for("gemma3 down", lambda: gw.run.status()["gemma3"]["state"] == "STOPPED")
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=patience(120))
    body = {"model": "gemma3", "messages": QUESTION, "max_tokens": 8, "stream": True}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    events = resp.read().decode().split("\n\n")
    conn.close()
    said = [x.removeprefix(": umemc: gemma3: ") for x in events if x.startswith(":")]
    data = [i for i, x in enumerate(events) if x.startswith("data: {")]
    assert resp.status == 200 and said and events[0].startswith(": umemc: gemma3: ")
    steps = {"queued", "starting", "loading weights", "allocating the KV cache and compute buffers", "warming up"}
    weights = round(gw.plan["models"]["gemma3"]["estimate_parts"]["weights_bytes"] / 2**20)
    shown = rf"loading weights: \d+ of {weights} MiB in memory"
    assert all(x in steps or re.fullmatch(shown, x) for x in said), said
    assert data and max(i for i, x in enumerate(events) if x.startswith(":")) < min(data)
    assert {json.loads(events[i].removeprefix("data: "))["model"] for i in data} == {"gemma3"}
    # and the openai client reads such a stream as any other
    assert gw.call("POST", "/models/unload", {"model": "gemma3"})[::2] == (200, {"success": True})
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="none", timeout=patience(120))
    chunks = list(client.chat.completions.create(model="gemma3", messages=QUESTION, max_tokens=8, stream=True))
    assert chunks and {c.model for c in chunks} == {"gemma3"}


def test_the_playground_asks_a_real_model_in_a_real_browser(gw: Gateway) -> None:
    """The status page's playground, opened by a link with a prompt, streams SmolLM2's real answer into the page."""
    from tests.runtime.browser import wait_in_page
    from tests.runtime.test_ui import CHROMIUM

    if CHROMIUM is None:
        pytest.skip("no chromium here (Debian: apt-get install chromium)")
    prompt = ASK.replace(" ", "%20").replace("?", "%3F")
    shown = wait_in_page(
        CHROMIUM,
        f"http://127.0.0.1:{gw.port}/ui#try=tiny-chat&temperature=0&prompt={prompt}",
        "document.getElementById('pgstate').textContent === 'done' && document.getElementById('pgout').textContent",
        patience(60),
    )
    assert "Paris" in shown


def test_umemc_chat_streams_an_answer_through_the_gateway(gw: Gateway, capsys: pytest.CaptureFixture[str]) -> None:
    from umemc.cli import main

    run = str(gw.run.run_dir)
    assert main(["chat", "tiny-chat", ASK, "--temperature", "0", "--run-dir", run]) == 0
    assert "Paris" in capsys.readouterr().out
    # a conversation from standard input, as a script would pipe it (gemma3 is cold: its start is said on stderr)
    turns = subprocess.run(
        [sys.executable, "-m", "umemc", "chat", "gemma3", "--max-tokens", "8", "--run-dir", run],
        input="hello\nand again\n\n",
        capture_output=True,
        text=True,
        timeout=patience(120),
    )
    assert turns.returncode == 0, turns.stderr
    assert main(["chat", "nope", "hi", "--run-dir", run]) == 1
    assert capsys.readouterr().err == (
        "nope: 404 model 'nope' is not in this stack (known: embed, gemma3, smollm2, tiny-chat)\n"
    )


def test_the_demo_brings_up_asks_shows_and_brings_down_a_real_stack(tmp_path: Path) -> None:
    """examples/demo.py (`python3 dev.py demo`) as a user runs it: SmolLM2 answers Paris through `umemc chat`, the
    cold Gemma 3 (a base model) starts on demand and continues a text, `status` and `ps` show the stack, `down`
    stops all of it (5 processes: supervisord's children are 3 workers, the enforcer and the gateway, whose process
    holds the standby enforcer)."""
    demo = Path(__file__).resolve().parents[2] / "examples" / "demo.py"
    done = subprocess.run(
        [sys.executable, str(demo), "--llama-server", LLAMA_SERVER, "--models", str(MODELS)],
        capture_output=True,
        text=True,
        timeout=patience(300),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    answer = out.split("$ umemc chat smollm2", 1)[1].split("$ umemc", 1)[0]
    assert "Paris" in answer, answer
    assert "umemc: gemma3: starting" in done.stderr  # its cold start, said while the client waits
    # the base model is given text to continue (a completion), never a chat: its words follow the text, with no
    # turn marker of a chat format in them
    continued = out.split("$ umemc chat gemma3 'The three primary colours are' --complete", 1)[1].split("$ umemc")[0]
    assert continued.strip() and "<start_of_turn>" not in continued and "<|im_start|>" not in continued, continued
    assert re.search(r"^ demo +running +smollm2 \(hot\), gemma3 \(cold\), files \(hot\) ", out, re.M), out
    assert "down: demo stopped (5 processes)" in out
