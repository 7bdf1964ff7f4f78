"""The gateway over real HTTP: real supervisord, real placeholder workers (`up --simulate`) that hold
their memory and answer OpenAI-shaped requests (streaming too), the real gateway process."""

from __future__ import annotations

import http.client
import itertools
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import patience
from tests.runtime.conftest import (
    Running,
    bring_down,
    bring_up,
    free_port,
    live_sysctl_table,
)

pytestmark = pytest.mark.slow  # real stacks behind a real gateway

MiB = 2**20
HARD = 80 * MiB  # a 64MiB placeholder's hard quota at quota_headroom = 0.25


def stack_text(name: str, models: str, *, slots: int, gateway: str = "", port: int | None = None) -> str:
    """A cpu stack whose budget holds exactly `slots` models of 64MiB (hard quota 80MiB each)."""
    return (
        f'version = 1\nname = "{name}"\n[platform]\nkind = "cpu"\nmemory = "{slots * 80 + 256}MiB"\n'
        'os_reserve = "256MiB"\n[policy]\nsafety_margin = 0.0\nquota_headroom = 0.25\nload_below = 0.9\n'
        f"evict_above = 0.95\n{live_sysctl_table()}[gateway]\nport = {port or free_port()}\n{gateway}{models}"
    )


def model(name: str, *, priority: int = 50, mode: str = "cold", extra: str = "") -> str:
    # the command is never run: --simulate puts a placeholder holding the soft quota in its place
    return (
        f'\n[models.{name}]\nruntime = "command"\ncommand = ["true"]\nmemory = "64MiB"\nport = {free_port()}\n'
        f'priority = {priority}\nmode = "{mode}"\n{extra}'
    )


class Gateway:
    def __init__(self, run: Running):
        self.run = run
        plan = json.loads((run.run_dir / "bundle" / "plan.json").read_text())
        self.port = plan["gateway"]["port"]
        self.plan = plan

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 60
    ) -> tuple[int, dict[str, str], Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=patience(timeout))  # a bound: it scales
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        ctype = resp.getheader("Content-Type", "")
        return resp.status, dict(resp.getheaders()), json.loads(raw) if "json" in ctype else raw.decode()

    def complete(self, model_name: str, **extra: Any) -> tuple[int, dict[str, str], Any]:
        return self.call("POST", "/v1/completions", {"model": model_name, "prompt": "hi", **extra})

    def status(self) -> dict[str, Any]:
        return self.call("GET", "/umemc/status")[2]

    def kinds(self, *kinds: str) -> list[tuple[str | None, str, dict[str, Any]]]:
        return [(e["model"], e["kind"], e["detail"]) for e in self.run.events() if e["kind"] in kinds]


def answered(gw: Gateway, name: str, queue_timeout: str) -> None:
    """A request to a cold model answered. A stack with a short queue_timeout (a test of the queue) can see the start
    outlast it on a loaded box: that request is told 'still starting' (503), the start goes on, and the next is
    answered."""
    status, _, body = gw.complete(name)
    if status != 200:
        why = f"model {name} could not start within {queue_timeout}: still starting"
        assert (status, body["error"]["message"]) == (503, why)
        gw.run.wait_for(lambda: gw.status()["models"][name]["ready"], what=f"{name} ready")
        assert gw.complete(name)[0] == 200


def later(fn: Any, *args: Any, **kw: Any) -> Any:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn, *args, **kw)
    pool.shutdown(wait=False)
    return future


# -- one stack for routing, streaming, metrics ----------------------------------------------------
@pytest.fixture(scope="module")
def routing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    models = (
        model("chat", priority=90, mode="hot", extra='aliases = ["gpt-4o-mini"]\nmax_concurrency = 4\nkind = "chat"\n')
        + model("embed", extra='kind = "embeddings"\n')
        + model("speech", extra='kind = "audio"\n')
    )
    r = bring_up(tmp_path_factory.mktemp("routing"), stack_text("gw-routing", models, slots=3), "--simulate")
    try:
        yield Gateway(r)
    finally:
        bring_down(r)


def test_routes_by_model_and_alias(routing: Gateway) -> None:
    status, _, body = routing.call("POST", "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": []})
    assert (status, body["model"], body["choices"][0]["message"]["content"]) == (
        200,
        "gpt-4o-mini",  # answered as asked, like an OpenAI-compatible server
        "(simulated reply from chat)",  # by the chat worker
    )
    status, _, body = routing.call("POST", "/v1/embeddings", {"model": "embed", "input": ["a", "b"]})
    assert (status, body["model"], len(body["data"])) == (200, "embed", 2)  # a cold start, held until healthy
    form = (
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'
        b'RIFF....\r\n--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nspeech\r\n--XyZ--\r\n'
    )
    status, _, body = routing.call(
        "POST", "/v1/audio/transcriptions", form, {"Content-Type": "multipart/form-data; boundary=XyZ"}
    )
    assert (status, body) == (200, {"text": "(simulated transcription by speech)"})
    status, _, body = routing.call("GET", "/models/chat/health")
    assert (status, body["status"], body["model"]) == (200, "ok", "chat")
    # the pass-through's target reaches the worker as the client encoded it (the placeholder names what it got):
    # an encoded space, line break and percent sign stay encoded
    status, _, body = routing.call("GET", "/models/chat/a%20b/c%25d?x=%0A1&y=2")
    assert (status, body["error"]["message"]) == (404, "no route /a%20b/c%25d?x=%0A1&y=2")
    status, _, body = routing.call("GET", "/v1/models")
    assert [m["id"] for m in body["data"]] == ["chat", "gpt-4o-mini", "embed", "speech"]
    assert body["data"][1]["root"] == "chat"


def test_unknown_or_missing_model_is_a_clear_error(routing: Gateway) -> None:
    assert routing.complete("gpt-5")[::2] == (
        404,
        {
            "error": {
                "message": "model 'gpt-5' is not in this stack (known: chat, embed, gpt-4o-mini, speech)",
                "type": "invalid_request_error",
                "code": "model_not_found",
            }
        },
    )
    assert routing.call("POST", "/v1/completions", {"prompt": "hi"})[::2] == (
        400,
        {
            "error": {
                "message": 'request has no "model" field: name a model of this stack (GET /v1/models)',
                "type": "invalid_request_error",
                "code": "model_missing",
            }
        },
    )
    assert routing.call("POST", "/v1/completions", b"{not json")[::2] == (
        400,
        {"error": {"message": "request body is not JSON", "type": "invalid_request_error", "code": "invalid_json"}},
    )


def test_streaming_passes_through_unbuffered(routing: Gateway) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", routing.port, timeout=patience(30))
    t0 = time.monotonic()
    conn.request(
        "POST", "/v1/chat/completions", json.dumps({"model": "chat", "stream": True, "chunks": 5, "delay": 0.3})
    )
    resp = conn.getresponse()
    assert (resp.status, resp.getheader("Content-Type")) == (200, "text/event-stream")
    arrivals, words = [], []
    for line in resp:
        if line.startswith(b"data: {"):
            arrivals.append(time.monotonic() - t0)
            words.append(json.loads(line[6:])["choices"][0]["delta"]["content"])
    conn.close()
    assert words == ["(simulated", " reply", " from", " chat)", " ..."]
    assert arrivals[0] < 0.25  # the first chunk did not wait for the rest
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert all(0.2 < g < 0.6 for g in gaps), gaps  # each chunk as the worker sent it


def test_client_disconnect_cancels_the_upstream_request(routing: Gateway) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", routing.port, timeout=patience(30))
    conn.request(
        "POST", "/v1/chat/completions", json.dumps({"model": "chat", "stream": True, "chunks": 20, "delay": 0.2})
    )
    resp = conn.getresponse()
    assert resp.readline().startswith(b"data: {")
    conn.sock.close()  # the client goes away after the first chunk of twenty
    conn.close()

    def cancelled() -> list[str]:
        return [x for x in routing.run.log_lines("chat") if x.startswith("stream cancelled by the client")]

    lines = routing.run.wait_for(cancelled, timeout=5, what="the placeholder to see its stream cancelled")
    assert lines[-1] in {f"stream cancelled by the client after {k} of 20 chunks" for k in range(2, 6)}
    routing.run.wait_for(
        lambda: routing.status()["models"]["chat"]["in_flight"] == 0, timeout=5, what="the slot to be released"
    )


def test_metrics_in_prometheus_format(routing: Gateway) -> None:
    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, headers, text = routing.call("GET", "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }

    before = scrape()
    for _ in range(3):
        assert routing.complete("chat")[0] == 200
    after = scrape()
    key = ("umemc_requests_total", (("code", "200"), ("model", "chat")))
    assert after[key] - before.get(key, 0) == 3
    count = ("umemc_request_duration_seconds_count", (("model", "chat"),))
    assert after[count] - before[count] == 3
    plan = routing.plan
    assert after[("umemc_budget_bytes", ())] == plan["capacity"]["budget_bytes"] == 3 * HARD
    assert after[("umemc_model_quota_bytes", (("kind", "hard"), ("model", "chat")))] == HARD
    assert after[("umemc_model_ready", (("model", "chat"),))] == 1
    assert after[("umemc_model_state", (("model", "chat"), ("state", "RUNNING")))] == 1
    assert sum(v for (n, labels), v in after.items() if n == "umemc_model_state" and ("model", "chat") in labels) == 1
    assert after[("umemc_model_in_flight", (("model", "chat"),))] == 0
    assert after[("umemc_model_max_concurrency", (("model", "chat"),))] == 4
    assert after[("umemc_leases", ())] == 0
    assert after[("umemc_cold_starts_total", (("model", "embed"),))] == 1
    # each placeholder answer says prompt_tokens 1, completion_tokens 4
    tokens = [("umemc_tokens_total", (("direction", d), ("model", "chat"))) for d in ("in", "out")]
    assert [after[k] - before.get(k, 0) for k in tokens] == [3, 12]
    assert after[("umemc_model_tokens_per_second", (("model", "chat"),))] > 0


def test_models_say_what_they_serve_and_the_access_log_each_request(routing: Gateway) -> None:
    status, _, body = routing.call("GET", "/v1/models")
    models = {m["id"]: m["umemc"] for m in body["data"]}
    assert {name: m["kind"] for name, m in models.items()} == {
        "chat": "chat",
        "gpt-4o-mini": "chat",
        "embed": "embeddings",
        "speech": "audio",
    }
    assert models["chat"]["status"] == "ready"
    for name in ("embed", "speech"):  # cold: started by an earlier request, or not yet
        assert models[name]["status"] == ("ready" if models[name]["ready"] else "cold"), models[name]
    log = routing.run.run_dir / "state" / "logs" / "access.log"

    def last(n: int) -> list[dict[str, Any]]:
        lines = log.read_text().splitlines()
        return [json.loads(x) for x in lines[-n:]]

    def logged(request: Any) -> dict[str, Any]:
        before = len(log.read_text().splitlines()) if log.exists() else 0
        request()
        routing.run.wait_for(lambda: len(log.read_text().splitlines()) > before, timeout=10, what="its line")
        return last(1)[0]

    def stream(**extra: Any) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", routing.port, timeout=patience(30))
        conn.request("POST", "/v1/chat/completions", json.dumps({"model": "chat", "stream": True, **extra}))
        assert conn.getresponse().read().endswith(b"data: [DONE]\n\n")
        conn.close()

    plain = logged(lambda: routing.complete("gpt-4o-mini"))
    streamed = logged(lambda: stream(chunks=5))
    counted = logged(lambda: stream(chunks=5, stream_options={"include_usage": True}))
    for entry in (plain, streamed, counted):
        assert entry["model"] == "chat" and entry["status"] == 200 and entry["method"] == "POST"
        assert 0 <= entry["queue_wait_s"] <= entry["latency_s"] and entry["tokens_per_s"] > 0
    assert (plain["path"], plain["stream"], plain["tokens_in"], plain["tokens_out"], plain["tokens_from"]) == (
        "/v1/completions", False, 1, 4, "usage"
    )  # fmt: skip
    # a stream without usage: its five content chunks, one token each
    assert (streamed["stream"], streamed["tokens_in"], streamed["tokens_out"], streamed["tokens_from"]) == (
        True, None, 5, "chunks"
    )  # fmt: skip
    assert (counted["tokens_in"], counted["tokens_out"], counted["tokens_from"]) == (1, 5, "usage")
    assert set(plain) == {
        "time", "model", "method", "path", "status", "queue_wait_s", "latency_s", "tokens_in", "tokens_out",
        "tokens_per_s", "tokens_from", "stream",
    }  # fmt: skip
    assert log.stat().st_mode & 0o777 == 0o600
    assert routing.status()["models"]["chat"]["tokens_per_s"] > 0


# -- admission, eviction, drains ------------------------------------------------------------------
def test_eviction_order_is_priority_then_lru_and_drains_requests_in_flight(stack: Any) -> None:
    models = model("l1", priority=10) + model("l2", priority=10) + model("m", priority=20) + model("h", priority=90)
    gw = Gateway(stack(stack_text("gw-evict", models, slots=3), "--simulate"))
    for name in ("l1", "l2", "m", "l1"):  # l2 is now the least recently used of the two lowest
        assert gw.complete(name)[0] == 200
    assert gw.complete("h")[0] == 200
    evictions = gw.kinds("evict")
    assert [(m, d["for_model"]) for m, _, d in evictions] == [("l2", "h")]
    # l1 has a request in flight: l2 (same priority, both cold) may swap it out only once it is done
    slow = later(gw.complete, "l1", delay=2.0)
    gw.run.wait_for(lambda: gw.status()["models"]["l1"]["in_flight"] == 1, what="l1's request in flight")
    t0 = time.monotonic()
    assert gw.complete("l2")[0] == 200
    assert time.monotonic() - t0 > 1.0  # it waited for the drain
    status, _, body = slow.result(timeout=patience(30))
    assert (status, body["model"]) == (200, "l1")  # never cut off
    assert [(m, d["for_model"]) for m, _, d in gw.kinds("evict")] == [("l2", "h"), ("l1", "l2")]
    states = {n: m["state"] for n, m in gw.status()["models"].items()}
    assert (
        states["l1"] == "STOPPED" and states["m"] in ("RUNNING", "STARTING") and states["h"] in ("RUNNING", "STARTING")
    )


def test_drain_timeout_abandons_the_eviction_never_the_request(stack: Any) -> None:
    models = model("busy", priority=10) + model("other", priority=10)
    text = stack_text("gw-drain", models, slots=1, gateway='drain_timeout = "1s"\nqueue_timeout = "2s"\n')
    gw = Gateway(stack(text, "--simulate"))
    answered(gw, "busy", "2 s")
    slow = later(gw.complete, "busy", delay=4.0)
    gw.run.wait_for(lambda: gw.status()["models"]["busy"]["in_flight"] == 1, what="busy's request in flight")
    status, headers, body = gw.complete("other")
    assert status == 503 and headers["Retry-After"] == "10"
    assert body["error"] == {
        "message": f"model other could not start within 2 s: other needs {HARD} bytes (0.08 GiB), 0 bytes "
        "(0.00 GiB) free; blocked by busy (requests in flight (drain timed out))",
        "type": "server_error",
        "code": "insufficient_memory",
    }
    assert slow.result(timeout=patience(30))[0] == 200
    assert [(m, k) for m, k, _ in gw.kinds("drain_timeout", "evict")] == [("other", "drain_timeout")]


def test_queue_bound_429_and_queue_timeout_503(stack: Any, capsys: Any) -> None:
    text = stack_text(
        "gw-queue", model("q", extra="max_concurrency = 1\n"), slots=1, gateway='queue = 1\nqueue_timeout = "1.5s"\n'
    )
    gw = Gateway(stack(text, "--simulate"))
    answered(gw, "q", "1.5 s")  # started
    first = later(gw.complete, "q", delay=1.0)
    gw.run.wait_for(lambda: gw.status()["models"]["q"]["in_flight"] == 1, what="one in flight")
    second = later(gw.complete, "q")
    gw.run.wait_for(lambda: gw.status()["models"]["q"]["queued"] == 1, what="one queued")
    published = gw.run.run_dir / "state" / "gateway.json"  # written at start, then within 0.5 s of a change
    gw.run.wait_for(
        lambda: json.loads(published.read_text())["models"]["q"] | {"ready": 0, "tokens_per_s": 0}
        == {
            "in_flight": 1,
            "queued": 1,
            "ready": 0,
            "starting": False,
            "health": "ok",
            "unhealthy": None,
            "tokens_per_s": 0,
        },  # fmt: skip
        what="gateway.json",
    )
    capsys.readouterr()
    assert gw.run.cli("status") == 0  # `umemc status` shows the gateway: 1 in flight + 1 queued
    out = capsys.readouterr().out
    row = next((x for x in out.splitlines() if x.strip().startswith("q ")), out)
    assert " 1+1 " in row, row
    status, headers, body = gw.complete("q")
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert body["error"] == {
        "message": "model q: 1 requests in flight and 1 queued (max_concurrency 1, queue 1)",
        "type": "rate_limit_error",
        "code": "queue_full",
    }
    assert first.result(timeout=patience(10))[0] == 200  # the queue is FIFO
    assert second.result(timeout=patience(10))[0] == 200
    blocker = later(gw.complete, "q", delay=3.0)
    gw.run.wait_for(lambda: gw.status()["models"]["q"]["in_flight"] == 1, what="one in flight")
    status, headers, body = gw.complete("q")
    assert status == 503 and int(headers["Retry-After"]) >= 1
    assert body["error"] == {
        "message": "model q: no slot within 1.5 s (1 in flight, 0 queued)",
        "type": "server_error",
        "code": "queue_timeout",
    }
    assert blocker.result(timeout=patience(10))[0] == 200


def test_ttl_unloads_an_idle_cold_model(stack: Any) -> None:
    gw = Gateway(stack(stack_text("gw-ttl", model("t", extra='ttl = "1s"\n'), slots=1), "--simulate"))
    assert gw.complete("t")[0] == 200
    gw.run.wait_for(lambda: gw.status()["models"]["t"]["state"] == "STOPPED", timeout=10, what="the TTL unload")
    [(name, _, detail)] = gw.kinds("ttl_unload")
    assert (name, detail["by"], detail["ttl_s"]) == ("t", "gateway", 1.0) and detail["idle_s"] >= 1.0
    assert gw.complete("t")[0] == 200  # and it comes back on demand
    assert len(gw.kinds("cold_start")) == 2


def test_interleaved_abcabc_starts_each_model_once(stack: Any) -> None:
    gw = Gateway(stack(stack_text("gw-swap", model("a") + model("b") + model("c"), slots=1), "--simulate"))
    # All six are sent at once, each generating for a while: the batching is of what is queued when a model's turn
    # comes, and a request for a model that arrives once it drains for another waits for its next start (a
    # second one). Sent 20 ms apart, a loaded machine delayed the second "a" past a's start and b's drain of it.
    # The generation is work, the same on any machine; only the bounds of the waits scale with patience.
    futures = [later(gw.complete, name, delay=1.0) for name in "abcabc"]
    assert [f.result(timeout=patience(60))[2]["model"] for f in futures] == list("abcabc")
    starts = [m for m, _, _ in gw.kinds("cold_start")]
    assert sorted(starts) == ["a", "b", "c"]


def test_check_and_gateway_agree_on_a_pressure_blocked_cold_start(stack: Any, run_cli: Any, tmp_path: Any) -> None:
    """load_below is part of the one policy: `check` says the cold model can never start (its hot neighbour's
    hard quota is half of usable memory, load_below 0.3), and the gateway refuses a request for it at once,
    saying why, and records it, instead of queueing it until queue_timeout."""
    import re

    text = stack_text(
        "gw-press", model("h", priority=90, mode="hot") + model("c", priority=50), slots=2,
        gateway='queue_timeout = "5s"\n',
    ).replace("load_below = 0.9\n", "load_below = 0.3\n")  # fmt: skip
    (tmp_path / "press.toml").write_text(text)
    code, out, _ = run_cli("check", str(tmp_path / "press.toml"), "--format", "json")
    report = json.loads(out)
    assert (code, report["cold_admission"]["c"]) == (
        0,
        {"fits_alongside_hot": False, "admissible": False, "evicts": []},
    )
    assert "models.c: cold model can never start: it fits the budget, but the hot set's hard quotas hold 0.50 of " \
        "usable memory, not below load_below 0.3 and evicting every lower-priority hot model does not bring it " \
        "under; lower the hot set or raise load_below" in report["warnings"]  # fmt: skip
    gw = Gateway(stack(text, "--simulate"))
    # a reading taken once h holds its memory (64 MiB of 160 usable: 0.4); the enforcer's first may predate it
    gw.run.wait_for(lambda: (gw.status()["pressure"] or 0) >= 0.3, timeout=10, what="a pressure reading counting h")
    t0 = time.monotonic()
    status, headers, body = gw.complete("c")
    assert time.monotonic() - t0 < 2  # at once, not after the 5 s queue_timeout
    assert (status, headers["Retry-After"], body["error"]["code"]) == (503, "30", "not_admissible")
    assert re.fullmatch(
        rf"model c cannot be loaded now: c needs {HARD} bytes \(0\.08 GiB\), {HARD} bytes \(0\.08 GiB\) free; "
        r"blocked by memory pressure 0\.\d+ \(after any evictions\) is not below load_below 0\.3, "
        r"h \(priority 90 >= 50\)\. Send 'X-Umemc-Wait: 1' to queue until memory frees \(up to the queue timeout\)",
        body["error"]["message"],
    ), body["error"]["message"]
    [(name, _, detail)] = gw.kinds("refused")
    assert name == "c" and [b["kind"] for b in detail["blocked_by"]] == ["pressure", "worker"]
    assert gw.status()["models"]["c"]["state"] == "STOPPED"


# -- leases ---------------------------------------------------------------------------------------
def test_leases_grant_evict_refuse_extend_expire_release(stack: Any) -> None:
    text = stack_text(
        "gw-lease", model("lo", priority=10) + model("hi", priority=90), slots=3, gateway='queue_timeout = "1s"\n'
    )
    gw = Gateway(stack(text, "--simulate"))
    answered(gw, "lo", "1 s")
    status, _, a = gw.call("POST", "/umemc/leases", {"bytes": "160MiB", "holder": "comfyui", "ttl": "10m"})
    assert (status, a["granted"], a["evicted"], a["lease"]["bytes"]) == (201, True, [], 160 * MiB)
    status, _, b = gw.call("POST", "/umemc/leases", {"bytes": 80 * MiB, "holder": "batch", "ttl": 600})
    assert (status, b["evicted"]) == (201, ["lo"])  # lower priority (10 < 50) and idle: evicted
    assert gw.status()["models"]["lo"]["state"] == "STOPPED"
    status, _, refused = gw.call("POST", "/umemc/leases", {"bytes": "1MiB", "holder": "late"})
    assert status == 409 and refused["granted"] is False
    assert refused["reason"] == (
        f"lease needs {MiB} bytes (0.00 GiB), 0 bytes (0.00 GiB) free; blocked by lease {a['lease']['id']} of "
        f"comfyui ({160 * MiB} bytes (0.16 GiB)), lease {b['lease']['id']} of batch ({HARD} bytes (0.08 GiB)); no "
        "priority would be granted now (this lease asked 50)"
    )
    assert refused["grant_at_priority"] is None  # leases are not evicted, whatever the priority
    status, _, can = gw.call("GET", "/umemc/can-load/hi")
    assert (status, can["fits_now"], can["would_evict"], [x["kind"] for x in can["blocked_by"]]) == (
        200,
        False,
        [],
        ["lease", "lease"],
    )
    t0 = time.monotonic()
    status, headers, body = gw.complete("hi")  # blocked by the leases: refused at once, with why
    assert (status, headers["Retry-After"], body["error"]["code"]) == (503, "30", "not_admissible")
    assert time.monotonic() - t0 < 0.9  # not after the 1 s queue_timeout
    assert body["error"]["message"] == (
        f"model hi cannot be loaded now: hi needs {HARD} bytes (0.08 GiB), 0 bytes (0.00 GiB) free; blocked by lease "
        f"{a['lease']['id']} of comfyui ({160 * MiB} bytes (0.16 GiB)), lease {b['lease']['id']} of batch ({HARD} "
        "bytes (0.08 GiB)). "
        "Send 'X-Umemc-Wait: 1' to queue until memory frees (up to the queue timeout)"
    )
    status, headers, body = gw.call(  # asked to wait: queued, 503 after queue_timeout
        "POST", "/v1/completions", {"model": "hi", "prompt": "hi"}, headers={"X-Umemc-Wait": "1"}
    )
    assert status == 503 and headers["Retry-After"] == "10" and body["error"]["code"] == "insufficient_memory"
    # a restart of the gateway keeps the leases (they are in RUN/state/gateway.json)
    sup = gw.run.run_dir / "state" / "supervisor.sock"
    from umemc.runtime.supervisor import Supervisor

    Supervisor(sup).stop("umemc-gateway")
    Supervisor(sup).start("umemc-gateway", wait=True)
    gw.run.wait_for(lambda: _answers(gw), what="the gateway back")
    assert [x["id"] for x in gw.call("GET", "/umemc/leases")[2]["leases"]] == [a["lease"]["id"], b["lease"]["id"]]
    assert gw.call("DELETE", f"/umemc/leases/{b['lease']['id']}")[0] == 200
    assert gw.call("DELETE", f"/umemc/leases/{b['lease']['id']}")[::2] == (
        404,
        {
            "error": {
                "message": f"no lease {b['lease']['id']!r}",
                "type": "invalid_request_error",
                "code": "lease_not_found",
            }
        },
    )
    status, _, ext = gw.call("POST", f"/umemc/leases/{a['lease']['id']}/extend", {"ttl": "1s"})
    assert status == 200 and ext["lease"]["expires_in_s"] <= 1.0
    gw.run.wait_for(lambda: gw.kinds("lease_expire"), timeout=10, what="the lease to expire")
    assert gw.call("GET", "/umemc/can-load/hi")[2]["fits_now"] is True
    answered(gw, "hi", "1 s")
    # loaded: it fits because it is there; free is the budget (3 x 80 MiB) less what runs (hi's 80 MiB); its state
    # is supervisord's (STARTING until its startsecs pass, then RUNNING)
    can = gw.call("GET", "/umemc/can-load/hi")[2]
    assert can.pop("state") in ("STARTING", "RUNNING")
    assert can == {
        "model": "hi", "loaded": True, "fits_now": True, "would_evict": [], "would_drain": [],
        "blocked_by": [], "need_bytes": HARD, "free_bytes": 2 * HARD,
        "reason": f"loaded: it holds its {HARD} bytes already",
    }  # fmt: skip
    assert [k for _, k, _ in gw.kinds("lease_grant", "lease_release", "lease_expire")] == [
        "lease_grant",
        "lease_grant",
        "lease_release",
        "lease_expire",
    ]


def test_the_figures_shown_outlive_a_gateway_restart(stack: Any) -> None:
    """Requests answered, then the gateway stopped and started (as a reconcile does): the page's history (each
    request's latency and tokens, the memory drawn) and the status's tokens/s are the ones it had."""
    gw = Gateway(stack(stack_text("gw-figures", model("a", mode="hot"), slots=1), "--simulate"))
    for _ in range(3):
        assert gw.complete("a")[0] == 200
    before = gw.call("GET", "/umemc/history")[2]
    assert before["speed"]["a"]["requests"] == 3, before["speed"]
    from umemc.runtime.supervisor import Supervisor

    sup = Supervisor(gw.run.run_dir / "state" / "supervisor.sock")
    sup.stop("umemc-gateway")  # SIGTERM: it keeps its figures as it stops
    sup.start("umemc-gateway", wait=True)
    gw.run.wait_for(lambda: _answers(gw), what="the gateway back")
    after = gw.call("GET", "/umemc/history")[2]
    assert after["speed"] == before["speed"]
    assert after["memory"]["t"][: len(before["memory"]["t"])] == before["memory"]["t"]
    assert gw.status()["models"]["a"]["tokens_per_s"] == before["speed"]["a"]["tokens_per_s"]


def _answers(gw: Gateway) -> bool:
    try:
        return gw.call("GET", "/umemc/health", timeout=1)[0] == 200
    except OSError:
        return False


def test_bad_lease_requests_are_clear_errors_and_leases_end_with_the_stack(stack: Any) -> None:
    text = stack_text("gw-lease-bad", model("x"), slots=1)
    gw = Gateway(stack(text, "--simulate"))
    cases = {
        json.dumps({"bytes": "1GiB"}): '"holder" is required: who asks (e.g. "comfyui"), 1-128 printable characters',
        json.dumps({"holder": "h"}): 'give exactly one of "bytes" (e.g. "8GiB") or "model" (a model of this stack)',
        json.dumps({"holder": "h", "bytes": "lots"}): "\"bytes\": not a size: 'lots'",
        json.dumps({"holder": "h", "bytes": 1, "ttl": "soon"}): "\"ttl\": not a duration: 'soon'",
        json.dumps({"holder": "h", "bytes": 1, "priority": 101}): '"priority" must be an integer 0-100 (got 101)',
        "[1]": "request body must be a JSON object",
    }
    for body, message in cases.items():
        assert gw.call("POST", "/umemc/leases", body.encode())[::2] == (
            400,
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "code": "invalid_lease" if "{" in body else "invalid_json",
                }
            },
        )
    status, _, granted = gw.call("POST", "/umemc/leases", {"model": "x", "holder": "h"})
    assert (status, granted["lease"]["bytes"], granted["lease"]["model"], granted["lease"]["priority"]) == (
        201,
        HARD,
        "x",
        50,
    )
    assert gw.run.cli("down") == 0  # a new run of the stack starts without the old run's leases
    gw = Gateway(stack(text, "--simulate"))
    assert gw.call("GET", "/umemc/leases")[2] == {"leases": []}


# -- security -------------------------------------------------------------------------------------
def test_off_loopback_needs_the_bearer_token(stack: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    text = stack_text("gw-token", model("x"), slots=1, gateway='host = "0.0.0.0"\ntoken_env = "UMEMC_TEST_TOKEN"\n')
    monkeypatch.delenv("UMEMC_TEST_TOKEN", raising=False)
    stack(text, "--simulate", expect=1)
    out = capsys.readouterr().out
    assert (
        "    FAIL  gateway: gateway.token_env names UMEMC_TEST_TOKEN, which is not set (or empty) here; `umemc up` "
        "hands the token to the gateway (never to the workers) and the gateway refuses to start without it"
    ) in out
    monkeypatch.setenv("UMEMC_TEST_TOKEN", "s3cret-token")
    gw = Gateway(stack(text, "--simulate"))
    unauthorized = (
        401,
        {
            "error": {
                "message": "this gateway needs Authorization: Bearer <token>",
                "type": "authentication_error",
                "code": "unauthorized",
            }
        },
    )
    assert gw.call("GET", "/v1/models")[::2] == unauthorized
    assert gw.call("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[::2] == unauthorized
    assert gw.call("GET", "/metrics")[0] == 401
    assert gw.call("GET", "/umemc/health")[0] == 200  # liveness only: says nothing about the stack
    assert gw.call("GET", "/v1/models", headers={"Authorization": "Bearer s3cret-token"})[0] == 200
    assert gw.complete("x")[0] == 401
    status, _, body = gw.call(
        "POST", "/v1/completions", {"model": "x", "prompt": "hi"}, {"Authorization": "Bearer s3cret-token"}
    )
    assert (status, body["model"]) == (200, "x")
    # Anthropic's clients carry the token in x-api-key: taken there on its routes (a Bearer token too), and every
    # refusal there in Anthropic's shape; OpenAI's routes want the Bearer token
    ask = {"model": "x", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    said = "this gateway needs x-api-key: <token> or Authorization: Bearer <token>"
    anthropic_401 = (401, {"type": "error", "error": {"type": "authentication_error", "message": said,
                                                      "code": "unauthorized"}})  # fmt: skip
    assert gw.call("POST", "/v1/messages", ask)[::2] == anthropic_401
    assert gw.call("POST", "/v1/messages", ask, {"x-api-key": "wrong"})[::2] == anthropic_401
    assert gw.call("POST", "/v1/messages", ask, {"x-api-key": "s3cret-token"})[0] == 200
    assert gw.call("POST", "/v1/messages", ask, {"Authorization": "Bearer s3cret-token"})[0] == 200
    assert gw.call("GET", "/v1/models", headers={"x-api-key": "s3cret-token"})[::2] == unauthorized
    status, _, body = gw.call("POST", "/v1/messages", {**ask, "model": "nope"}, {"x-api-key": "s3cret-token"})
    assert (status, body) == (
        404,
        {
            "type": "error",
            "error": {
                "type": "not_found_error",
                "message": "model 'nope' is not in this stack (known: x)",
                "code": "model_not_found",
            },
        },
    )


def test_gateway_disabled_runs_no_gateway(stack: Any) -> None:
    text = stack_text("gw-off", model("x", mode="hot"), slots=1).replace("[gateway]\n", "[gateway]\nenabled = false\n")
    r = stack(text, "--simulate")
    plan = json.loads((r.run_dir / "bundle" / "plan.json").read_text())
    assert plan["gateway"] is None
    conf = (r.run_dir / "bundle" / "supervisord.conf").read_text()
    assert "umemc-gateway" not in conf
    assert "[program:x]" in conf and r.status()["x"]["state"] in ("STARTING", "RUNNING")  # the stack runs without


def test_pressure_guard_waits_for_a_worker_with_requests_in_flight(stack: Any) -> None:
    models = model("low", priority=10) + model("mid", priority=50) + model("high", priority=90, mode="hot")
    text = stack_text("gw-press", models, slots=3).replace(
        "load_below = 0.9\nevict_above = 0.95", "load_below = 0.55\nevict_above = 0.6"
    )
    gw = Gateway(stack(text, "--simulate"))
    assert gw.complete("low")[0] == 200
    gw.run.wait_for(lambda: gw.run.status()["low"]["state"] == "RUNNING", what="low past startsecs")
    slow = later(gw.complete, "low", delay=4.0)
    gw.run.wait_for(lambda: gw.status()["models"]["low"]["in_flight"] == 1, what="low's request in flight")
    assert gw.complete("mid")[0] == 200  # pressure goes from ~0.52 to ~0.78
    deferred = gw.run.wait_for(lambda: gw.run.events("evict_deferred"), timeout=10, what="a deferred eviction")
    assert deferred[0]["model"] == "low" and not gw.run.events("evict")
    status, _, body = slow.result(timeout=patience(30))
    assert (status, body["model"]) == (200, "low")  # never cut off
    evicted = gw.run.wait_for(lambda: gw.run.events("evict"), timeout=10, what="the eviction")
    assert [e["model"] for e in evicted] == ["low"]  # then evicted: still the lowest priority
    assert evicted[0]["time"] > deferred[0]["time"]


def test_a_granted_lease_survives_a_kill_9_of_the_gateway_right_after(stack: Any) -> None:
    """The lease is on disk (fsynced) before the client hears 201: a gateway killed at once finds it again."""
    import os
    import signal

    gw = Gateway(stack(stack_text("gw-durable", model("a"), slots=2), "--simulate"))
    pidfile = gw.run.run_dir / "state" / "pids" / "umemc-gateway"
    before = int(pidfile.read_text().split()[0])
    status, _, granted = gw.call("POST", "/umemc/leases", {"holder": "comfyui", "bytes": "16MiB", "ttl": "10m"})
    os.kill(before, signal.SIGKILL)  # within microseconds of the answer
    assert status == 201

    def back() -> bool:
        try:
            return int(pidfile.read_text().split()[0]) != before and gw.call("GET", "/umemc/health")[0] == 200
        except (OSError, ValueError):
            return False

    gw.run.wait_for(back, timeout=30, what="the gateway's restart")
    ids = [x["id"] for x in gw.call("GET", "/umemc/leases")[2]["leases"]]
    assert ids == [granted["lease"]["id"]]


def test_a_request_for_a_worker_supervisord_is_restarting_waits_for_it(stack: Any) -> None:
    """kill -9 of a serving worker: supervisord restarts it (autorestart); requests sent meanwhile wait for
    that restart instead of failing with start_failed (ALREADY_STARTED, or the EXITED moment)."""
    import os
    import signal

    gw = Gateway(stack(stack_text("gw-restart", model("c"), slots=2), "--simulate"))
    assert gw.complete("c")[0] == 200
    for _ in range(2):
        # RUNNING: past supervisord's startsecs, so a kill is a crash it restarts, not a failed start
        gw.run.wait_for(lambda: gw.run.status()["c"]["state"] == "RUNNING", timeout=30, what="RUNNING")
        pid = gw.run.status()["c"]["pid"]
        os.kill(pid, signal.SIGKILL)
        futures = [later(gw.complete, "c") for _ in range(3)]
        got = [f.result(timeout=patience(60)) for f in futures]
        assert [g[0] for g in got] == [200, 200, 200], [g[2] for g in got]
        assert gw.run.status()["c"]["pid"] != pid
    assert gw.kinds("cold_start_failed") == []
    # two crashes, two restarts (its cold start is not one)
    gw.run.wait_for(lambda: gw.run.status()["c"]["restarts"] == 2, timeout=30, what="two restarts counted")


def test_status_says_an_eviction_and_counts_only_crashes_as_restarts(stack: Any) -> None:
    """a and b take turns in a one-model budget: every start a cold start, every stop an eviction; none is a
    restart, and each one's last event is the gateway's, in words. A kill -9 is a restart."""
    import os
    import signal

    gw = Gateway(stack(stack_text("gw-turns", model("a") + model("b"), slots=1), "--simulate"))
    for name in ("a", "b", "a", "b"):
        assert gw.complete(name)[0] == 200
    assert [(m, d["for_model"]) for m, _, d in gw.kinds("evict")] == [("a", "b"), ("b", "a"), ("a", "b")]

    def settled() -> bool:
        st = gw.run.status()
        return (
            st["a"]["state"] == "STOPPED" and st["b"]["state"] == "RUNNING" and st["b"]["_last_event"] == "cold_start"
        )

    gw.run.wait_for(settled, timeout=30, what="b running, a evicted")
    st = gw.run.status()
    assert (st["a"]["restarts"], st["b"]["restarts"]) == (0, 0)
    assert st["a"]["_last_event"] == "evict"
    [*_, (_, _, last)] = gw.kinds("evict")  # a's last eviction: what its last start took, as measured
    assert st["a"]["_last_said"].startswith(
        f"evicted to start b (both priority 50: bringing it back takes {last['restore_s']:g} s by its last start; the "
        "quicker to bring back, then the longer idle, gives way), "
    )
    assert last["restore_from"] == "measured"
    assert st["b"]["_last_said"].startswith("started on demand in ") and ", evicting a, " in st["b"]["_last_said"]
    os.kill(st["b"]["pid"], signal.SIGKILL)
    gw.run.wait_for(lambda: gw.run.status()["b"]["restarts"] == 1, timeout=30, what="the crash counted")


def test_a_worker_that_cannot_start_is_said_once_supervisord_gives_up(stack: Any) -> None:
    """A command that does not exist: supervisord retries it (BACKOFF, "Exited too quickly"), the request waits
    through those retries, and is answered with why once supervisord gives up (FATAL)."""
    text = stack_text("gw-fatal", "", slots=2) + (
        f'\n[models.x]\nruntime = "command"\ncommand = ["/nonexistent/worker", "{{port}}"]\nmemory = "64MiB"\n'
        f'port = {free_port()}\nmode = "cold"\n'
    )
    gw = Gateway(stack(text, "--force"))  # preflight says the executable is missing; forced anyway
    status, _, body = gw.complete("x")
    assert (status, body["error"]["code"]) == (503, "start_failed")
    # the client is told what happened and where to look, never a path of this machine
    assert body["error"]["message"] == "worker x failed to start: it is FATAL; `umemc logs x` shows why"
    [(name, _, detail)] = gw.kinds("cold_start_failed")
    assert name == "x" and detail["reason"] == body["error"]["message"]
    assert detail["detail"].endswith(f"(log: {gw.run.run_dir.resolve() / 'state' / 'logs' / 'x.err.log'})")
    assert (
        "umemc-wrap: cannot run /nonexistent/worker: No such file or directory"
        in (gw.run.run_dir / "state" / "logs" / "x.err.log").read_text()
    )


def test_a_worker_that_dies_at_every_start_after_its_startsecs_ends_the_start(stack: Any) -> None:
    """A worker that lives past supervisord's startsecs and then dies, every time (vLLM refusing a setting after
    its engine came up): supervisord restarts it for good, so the start ends at its third death with why, not
    after start_timeout (10 minutes by default)."""
    code = "import time; time.sleep(5.5); print('refused: no room for one request', flush=True); raise SystemExit(1)"
    text = stack_text("gw-dies", "", slots=2) + (
        f'\n[models.x]\nruntime = "command"\ncommand = ["{sys.executable}", "-c", "{code}"]\nmemory = "64MiB"\n'
        f'port = {free_port()}\nmode = "cold"\n'
    )
    gw = Gateway(stack(text, "--force"))
    status, _, body = gw.call("POST", "/v1/completions", {"model": "x", "prompt": "hi"}, timeout=300)
    assert (status, body["error"]["code"]) == (503, "start_failed")
    assert body["error"]["message"] == (
        "worker x failed to start: it exited 3 times before it answered; `umemc logs x` shows why"
    )
    log = (gw.run.run_dir / "state" / "logs" / "x.out.log").read_text()
    assert log.count("refused: no room for one request") >= 3


def test_a_cold_models_port_taken_by_another_program_is_refused_not_relayed_to(stack: Any) -> None:
    """A cold model's port is free when `up` checks it, not reserved: another program may listen there before the
    model starts (CI saw another test's llama-server answer for a placeholder). Its health answer is not the
    worker's: the request is refused with why, never relayed to the stranger; once the port is free again, the
    model starts and answers."""
    import subprocess
    import sys

    from umemc.runtime.waits import healthy

    port = free_port()
    text = stack_text("gw-stranger", "", slots=2) + (
        f'\n[models.x]\nruntime = "command"\ncommand = ["true"]\nmemory = "64MiB"\nport = {port}\nmode = "cold"\n'
    )
    gw = Gateway(stack(text, "--simulate"))
    stranger = subprocess.Popen(
        [sys.executable, "-m", "umemc.runtime.placeholder", "--model", "stranger", "--bytes", "0", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        gw.run.wait_for(lambda: healthy(port, "/health"), what="the stranger listening")
        status, _, body = gw.complete("x")
        assert (status, body["error"]["code"]) == (503, "start_failed")
        assert body["error"]["message"] == (
            f"worker x could not listen on its port {port}: another program answers there; stop it (ss -ltnp) or "
            "give the model another port"
        )
        assert [(n, d["reason"]) for n, _, d in gw.kinds("cold_start_failed")] == [("x", body["error"]["message"])]
    finally:
        stranger.kill()
        stranger.wait()
    status, _, body = gw.complete("x")
    assert (status, body["choices"][0]["text"]) == (200, "(simulated reply from x)")


def test_a_worker_whose_server_left_its_process_tree_is_still_its_own(stack: Any) -> None:
    """The port check above must not refuse a worker whose server double-forked away from supervisord's process (a
    daemon): it carries the run's mark for its model, so it is the worker's own, and it answers."""
    from tests.runtime.conftest import worker

    text = stack_text("gw-daemon", "", slots=2) + worker(
        "x", "daemonizing.py", "{port}", "x", memory="64MiB", mode="cold", port=free_port()
    )
    gw = Gateway(stack(text))
    status, _, body = gw.complete("x")
    assert (status, body["choices"][0]["text"]) == (200, "(simulated reply from x)")
    assert not gw.kinds("cold_start_failed")


def test_max_generating_caps_generations_across_models_by_priority_then_fifo(stack: Any) -> None:
    """policy.max_generating = 1: one generation in flight across the stack; while c generates, b (priority 50)
    and then a (priority 90) wait; a goes first, then b, whatever their arrival order. Visible in
    /umemc/status and /metrics (the wait apart from the latency)."""
    text = stack_text(
        "gw-gen",
        model("a", priority=90, mode="hot") + model("b", priority=50, mode="hot") + model("c", priority=50, mode="hot"),
        slots=3,
    ).replace("evict_above = 0.95\n", "evict_above = 0.95\nmax_generating = 1\n")
    gw = Gateway(stack(text, "--simulate"))
    done: dict[str, float] = {}

    def run(name: str, delay: float) -> int:
        status = gw.complete(name, delay=delay)[0]
        done[name] = time.monotonic()
        return status

    long = later(run, "c", 1.5)
    gw.run.wait_for(lambda: gw.status()["generation"]["in_use"] == 1, timeout=10, what="c generating")
    b = later(run, "b", 0.1)
    gw.run.wait_for(lambda: gw.status()["generation"]["waiting"] == 1, timeout=10, what="b waiting")
    a = later(run, "a", 0.1)
    gw.run.wait_for(lambda: gw.status()["generation"]["waiting"] == 2, timeout=10, what="a waiting")
    assert gw.status()["generation"] == {"max": 1, "in_use": 1.0, "waiting": 2, "throttling": None}
    from umemc.commands.status import collect, table

    # gateway.json carries it too (written every 0.5 s): `umemc status` shows it in its title and --json
    gw.run.wait_for(
        lambda: collect(str(gw.run.run_dir))["_generation"]
        == {"max": 1, "in_use": 1.0, "waiting": 2, "throttling": None},
        timeout=10,
        what="gateway.json with the generation budget",
    )
    assert ", generating 1 of 1 (2 waiting)" in str(table(collect(str(gw.run.run_dir))).title)
    assert [f.result(timeout=patience(30)) for f in (long, b, a)] == [200, 200, 200]
    assert done["c"] < done["a"] < done["b"]  # priority first, not arrival
    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(gw.call("GET", "/metrics")[2])
        for s in f.samples
    }
    assert metrics[("umemc_generation_max", ())] == 1.0
    assert metrics[("umemc_generation_wait_seconds_count", (("model", "a"),))] == 1.0
    assert metrics[("umemc_generation_wait_seconds_count", (("model", "b"),))] == 1.0
    assert metrics[("umemc_generation_wait_seconds_sum", (("model", "b"),))] > 1.0  # c's 1.5 s, then a's
