"""One endpoint for every model of a stack of several nodes, for real on one machine: three "nodes" (a, b, c), each
its own `umemc up --node` (its supervisord, enforcer and gateway, on a gateway port of its own), a serving the real
SmolLM2 (hot), b the real Gemma 3 270M (cold), c a command worker (a small HTTP server). Any node's gateway answers
for every model: through the openai, ollama and anthropic clients, streamed and not, the pass-through, `/v1/models`
listing all with where they run; the stack's token is asked at the door and given to the next gateway; a cold model
starts on its own node; a node that does not answer is said so, naming it."""

from __future__ import annotations

import http.client
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import patience
from tests.realmodels import GEMMA3, LLAMA_SERVER, SMOLLM2, needs_llama_server, needs_models
from tests.runtime.conftest import Running, bring_down, bring_up, free_port, live_sysctl_table
from umemc.cli import main

pytestmark = [pytest.mark.slow, needs_models, *needs_llama_server]
TOKEN = "fed-s3cret"
ASK = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def stack_text(ports: dict[str, int]) -> str:
    def node(name: str) -> str:
        return f'\n[nodes.{name}]\nkind = "cpu"\nmemory = "2GiB"\nos_reserve = "1GiB"\ngateway_port = {ports[name]}\n'

    files = [sys.executable, "-m", "http.server", str(ports["files"]), "--bind", "127.0.0.1"]
    return (
        'version = 1\nname = "fed"\n'
        + live_sysctl_table()
        + f'[gateway]\nport = {free_port()}\ntoken_env = "UMEMC_FED_TOKEN"\n'
        + node("a")
        + node("b")
        + node("c")
        + f'\n[models.smollm2]\nruntime = "llama-server"\nbin = "{LLAMA_SERVER}"\nmodel = "{SMOLLM2}"\n'
        f'context = 1024\nmode = "hot"\nnode = "a"\naliases = ["tiny"]\nport = {free_port()}\n'
        f'\n[models.gemma3]\nruntime = "llama-server"\nbin = "{LLAMA_SERVER}"\nmodel = "{GEMMA3}"\n'
        f'context = 1024\nmode = "cold"\nnode = "b"\nchat_template = "gemma"\nport = {free_port()}\n'
        f'\n[models.files]\nruntime = "command"\ncommand = {json.dumps(files)}\nmemory = "64MiB"\nmode = "hot"\n'
        f'node = "c"\nport = {ports["files"]}\n'
    )


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("UMEMC_FED_TOKEN", TOKEN)
    ports = {n: free_port() for n in ("a", "b", "c", "files")}
    text = stack_text(ports)
    root = tmp_path_factory.mktemp("fed")
    runs: dict[str, Running] = {}
    try:
        for name in ("a", "b", "c"):
            (root / name).mkdir()
            runs[name] = bring_up(root / name, text, "--node", name)
        yield {"runs": runs, "ports": ports}
    finally:
        for r in runs.values():
            bring_down(r)
        mp.undo()


def call(port: int, method: str, path: str, body: Any = None, token: str | None = TOKEN) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=patience(120))
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    conn.request(method, path, None if body is None else json.dumps(body), headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if "json" in resp.getheader("Content-Type", "") else data.decode()


def test_any_nodes_gateway_answers_for_every_model(nodes: dict[str, Any]) -> None:
    import anthropic
    import ollama
    import openai

    ports, runs = nodes["ports"], nodes["runs"]
    # /v1/models on any node: every model of the stack, with where it runs
    status, listed = call(ports["b"], "GET", "/v1/models")
    where = {m["id"]: m["umemc"]["node"] for m in listed["data"]}
    assert status == 200 and where == {"gemma3": "b", "smollm2": "a", "tiny": "a", "files": "c"}

    # c serves only a small HTTP server; through it, the model on a (by an alias), plain and streamed
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{ports['c']}/v1", api_key=TOKEN, timeout=patience(120))
    said = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8)
    assert said.model == "tiny" and "Paris" in (said.choices[0].message.content or "")
    chunks = list(client.chat.completions.create(model="smollm2", messages=ASK, temperature=0, max_tokens=8,
                                                 stream=True))  # fmt: skip
    assert {c.model for c in chunks} == {"smollm2"}
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # the request was a's to count: the model's own gateway counted its tokens
    assert call(ports["a"], "GET", "/umemc/status")[1]["models"]["smollm2"]["tokens_out"] > 0

    # b's cold model asked through a, by Ollama's API: started on b, by b's gateway
    assert runs["b"].status()["gemma3"]["state"] == "STOPPED"
    local = ollama.Client(host=f"http://127.0.0.1:{ports['a']}", headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=patience(120))  # fmt: skip
    chat = local.chat(model="gemma3", messages=ASK, options={"num_predict": 4})
    assert chat.done and chat.model == "gemma3" and chat.message.content
    assert runs["b"].events("cold_start", "gemma3") and not runs["a"].events("cold_start", "gemma3")

    # Anthropic's API through c, the token in x-api-key (c gives b's gateway the stack's own)
    claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{ports['c']}", api_key=TOKEN, timeout=patience(120))
    message = claude.messages.create(model="gemma3", max_tokens=4, messages=ASK)
    assert message.model == "gemma3" and message.content

    # the pass-through to c's worker through a
    status, page = call(ports["a"], "GET", "/models/files/")
    assert status == 200 and "Directory listing" in page

    # no token, no forwarding: the door of the first gateway refuses
    assert call(ports["a"], "GET", "/models/files/", token=None)[0] == 401


def test_status_on_any_node_shows_every_nodes_models(nodes: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    from umemc.commands.status import collect, contract

    ports, runs = nodes["ports"], nodes["runs"]
    doc = contract(collect(str(runs["b"].run_dir)))
    assert set(doc["models"]) == {"gemma3"}
    assert doc["nodes"] == {
        "a": {"url": f"127.0.0.1:{ports['a']}", "models": {"smollm2": {"state": "RUNNING", "status": "ready"}}},
        "c": {"url": f"127.0.0.1:{ports['c']}", "models": {"files": {"state": "RUNNING", "status": "ready"}}},
    }
    capsys.readouterr()
    assert main(["ps", "--json"]) == 0
    # the first node up holds the stack's name on this machine (the others are known by their run dirs)
    [row] = [r for r in json.loads(capsys.readouterr().out) if r["run_dir"] == str(runs["a"].run_dir)]
    assert (row["models"], row["elsewhere"]) == ({"smollm2": "hot"}, {"gemma3": "b", "files": "c"})
    assert runs["b"].cli("status") == 0
    shown = capsys.readouterr().out
    assert re.search(rf"smollm2 on a +RUNNING .* node a \(127\.0\.0\.1:{ports['a']}\)", shown), shown
    assert re.search(rf"files on c +RUNNING .* node c \(127\.0\.0\.1:{ports['c']}\)", shown), shown


def test_a_node_that_does_not_answer_is_named(nodes: dict[str, Any]) -> None:
    ports, runs = nodes["ports"], nodes["runs"]
    assert runs["c"].cli("down") == 0
    from umemc.commands.status import collect

    said = collect(str(runs["a"].run_dir))["_nodes"]["c"]
    assert said["url"] == f"127.0.0.1:{ports['c']}" and said["error"].startswith("its gateway does not answer (")
    status, body = call(ports["a"], "POST", "/v1/chat/completions", {"model": "files", "messages": ASK})
    assert status == 503 and body["error"]["code"] == "node_unreachable"
    assert body["error"]["message"].startswith(
        f"model files runs on node c (127.0.0.1:{ports['c']}), whose gateway does not answer: "
    )
    # the other nodes go on answering for each other
    assert call(ports["b"], "POST", "/v1/completions", {"model": "smollm2", "prompt": "Hi", "max_tokens": 2})[0] == 200
