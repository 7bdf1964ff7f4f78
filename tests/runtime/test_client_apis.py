"""Ollama's and llama.cpp router's routes where what matters is umemc's rules, not the text: a client's load or
keep_alive goes through the cold start's admission (it can never overcommit the box), and every route but health
needs the token where one is set. Real supervisord and gateway, placeholder workers (`up --simulate`)."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from tests.conftest import patience
from tests.runtime.test_gateway import Gateway, model, stack_text

pytestmark = pytest.mark.slow

TOKEN = {"Authorization": "Bearer s3cret-token"}


def test_a_load_from_a_client_is_admitted_like_a_cold_start(stack: Any) -> None:
    """Room for one model: `hi` (priority 90) runs; a client's load of `lo` (50) would have to evict it, which
    the policy never does for a lower priority: refused at once, with why, on both APIs; the box holds one model."""
    text = stack_text("ca-admit", model("hi", priority=90, mode="hot") + model("lo", priority=50), slots=1)
    gw = Gateway(stack(text, "--simulate"))
    status, _, body = gw.call("POST", "/models/load", {"model": "lo"})
    assert (status, body["error"]["code"]) == (503, "not_admissible")
    assert body["error"]["message"].startswith("model lo cannot be loaded now: ")
    status, _, body = gw.call("POST", "/api/chat", {"model": "lo", "messages": [], "keep_alive": -1})
    assert status == 503 and set(body) == {"error"} and body["error"].startswith("model lo cannot be loaded now: ")
    state = gw.run.status()
    assert (state["hi"]["state"], state["lo"]["state"]) == ("RUNNING", "STOPPED")
    # a load the budget allows evicts by the same rule: hi unloaded by a client, then lo loads
    assert gw.call("POST", "/api/generate", {"model": "hi", "prompt": "", "keep_alive": 0})[2]["done_reason"] == (
        "unload"
    )
    assert gw.call("POST", "/models/load", {"model": "lo"})[::2] == (200, {"success": True})
    assert {m["id"]: m["status"]["value"] for m in gw.call("GET", "/models")[2]["data"]} == {
        "hi": "unloaded",
        "lo": "loaded",
    }


def test_ollama_chat_and_generate_are_translated_both_ways(stack: Any) -> None:
    """A placeholder answers OpenAI-shaped (streamed too): Ollama's client sees its own shapes, one JSON object
    or NDJSON lines, each naming the model as asked."""
    gw = Gateway(
        stack(stack_text("ca-shapes", model("chat", mode="hot", extra='aliases = ["mini"]\n'), slots=1), "--simulate")
    )
    status, headers, body = gw.call(
        "POST", "/api/chat", {"model": "mini", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    )
    assert (status, body["model"], body["message"], body["done"]) == (
        200,
        "mini",
        {"role": "assistant", "content": "(simulated reply from chat)"},
        True,
    )
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)
    conn.request("POST", "/api/chat", json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
    resp = conn.getresponse()
    assert (resp.status, resp.getheader("Content-Type")) == (200, "application/x-ndjson")
    lines = [json.loads(x) for x in resp.read().splitlines()]
    conn.close()
    assert [x["done"] for x in lines][-1] is True and {x["model"] for x in lines} == {"chat"}
    assert "".join(x["message"]["content"] for x in lines) == "(simulated reply from chat)"
    status, _, body = gw.call("POST", "/api/generate", {"model": "chat", "prompt": "hi", "stream": False})
    assert (status, body["response"], body["done"]) == (200, "(simulated reply from chat)", True)
    status, _, body = gw.call("POST", "/api/chat", {"model": "nope", "messages": []})
    assert (status, body) == (404, {"error": "model 'nope' is not in this stack (known: chat, mini)"})
    status, _, body = gw.call("POST", "/api/chat", {"model": "chat", "messages": [], "keep_alive": "soon"})
    assert (status, body) == (
        400,
        {"error": 'keep_alive must be a duration ("5m", "1h", "-1" for always, 0 to unload; got \'soon\')'},
    )
    assert gw.call("GET", "/api/version")[2] == {"version": "0.12.0"}


def test_every_new_route_needs_the_token_where_one_is_set(stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMEMC_TEST_TOKEN", "s3cret-token")
    text = stack_text("ca-token", model("x"), slots=1, gateway='token_env = "UMEMC_TEST_TOKEN"\n')
    gw = Gateway(stack(text, "--simulate"))
    calls = [
        ("GET", "/api/tags", None),
        ("GET", "/api/ps", None),
        ("GET", "/api/version", None),
        ("POST", "/api/show", {"model": "x"}),
        ("POST", "/api/chat", {"model": "x", "messages": []}),
        ("POST", "/api/generate", {"model": "x", "prompt": ""}),
        ("POST", "/api/embed", {"model": "x", "input": []}),
        ("GET", "/models", None),
        ("POST", "/models/load", {"model": "x"}),
        ("POST", "/models/unload", {"model": "x"}),
    ]
    for method, path, body in calls:
        assert gw.call(method, path, body)[0] == 401, path
    assert gw.run.status()["x"]["state"] == "STOPPED"  # nothing was loaded by the refused calls
    assert gw.call("POST", "/models/load", {"model": "x"}, TOKEN)[::2] == (200, {"success": True})
    assert gw.call("GET", "/api/ps", None, TOKEN)[2]["models"][0]["model"] == "x"
    assert gw.call("POST", "/models/unload", {"model": "x"}, TOKEN)[::2] == (200, {"success": True})


def test_a_wait_is_said_as_reasoning_where_the_stack_asks(stack: Any) -> None:
    """gateway.loading_progress = "reasoning": room for one model; `a` (priority 10) has a request in flight for
    about 2 s, so a streamed chat for `b` (50) waits for it to drain, then for `a`'s stop and `b`'s start. The
    wait comes as chat chunks whose delta is reasoning_content (what chat UIs show as thinking), then b's answer."""
    from tests.runtime.test_gateway import later

    text = stack_text(
        "ca-progress",
        model("a", priority=10, mode="hot") + model("b", priority=50),
        slots=1,
        gateway='loading_progress = "reasoning"\n',
    )
    gw = Gateway(stack(text, "--simulate"))
    slow = later(gw.complete, "a", delay=2.0)
    gw.run.wait_for(lambda: gw.status()["models"]["a"]["in_flight"] == 1, what="a's request in flight")
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)
    body = {"model": "b", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    events = [x.removeprefix("data: ") for x in resp.read().decode().split("\n\n") if x.startswith("data: ")]
    conn.close()
    chunks = [json.loads(x) for x in events if x != "[DONE]"]
    thinking = [c["choices"][0]["delta"]["reasoning_content"] for c in chunks if c["id"] == "umemc-loading"]
    answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["id"] != "umemc-loading")
    assert resp.status == 200 and thinking[0] == "waiting for a to finish their requests\n"
    assert {c["model"] for c in chunks} == {"b"} and answer == "(simulated reply from b)"
    assert slow.result(timeout=patience(30))[0] == 200  # a's request was served, never cut off


def test_a_directory_at_a_models_gate_path_does_not_keep_it_down(stack: Any) -> None:
    """Something not a gate at RUN/state/gates/MODEL (a directory with a file in it, a link): the exec wrapper
    would refuse to start the worker behind it, forever; the gateway clears its own gate path before a start, so
    the request is answered (a link is removed, never what it points to)."""
    gw = Gateway(stack(stack_text("ca-gate", model("x") + model("y"), slots=2), "--simulate"))
    gates = gw.run.run_dir / "state" / "gates"
    (gates / "x").mkdir(parents=True)
    (gates / "x" / "junk").write_text("not a gate\n")
    target = gw.run.run_dir / "keep.txt"
    target.write_text("keep me\n")
    (gates / "y").symlink_to(target)
    for name in ("x", "y"):
        status, _, body = gw.complete(name)
        assert (status, body["model"]) == (200, name)
    assert not (gates / "x").exists() and not (gates / "y").exists() and target.read_text() == "keep me\n"
