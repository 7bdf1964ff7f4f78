"""The live status page (GET /ui), rendered by a real headless Chromium (Debian's chromium) against the real
gateway: both ledgers, every model with its state and quotas, the leases, the events streaming in. Its data
endpoints (/umemc/events, /umemc/logs/MODEL) and the Host/Origin/token rules are checked over HTTP."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import patience
from tests.runtime.test_gateway import Gateway, later, model, stack_text

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (Debian: apt-get install chromium)")
REPO = Path(__file__).resolve().parents[2]


UPDATE = os.environ.get("UMEMC_UPDATE_SCREENSHOTS") == "1"  # keep the screenshots in docs/


def dom(url: str, screenshot: Path | None = None, width: int = 1280, budget_ms: int = 6000) -> str:
    """The page as Chromium has it after `budget_ms` of the page's own (virtual) time; a screenshot at `width`."""
    assert CHROMIUM is not None
    flags = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", f"--virtual-time-budget={budget_ms}"]
    if screenshot is not None:
        subprocess.run([*flags, f"--window-size={width},1400", f"--screenshot={screenshot}", url], capture_output=True,
                       timeout=120)  # fmt: skip
    return subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout


@pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js here (Debian: apt-get install nodejs)")
def test_the_pages_scripts_parse(tmp_path: Path) -> None:
    """Every script of the page parses (Node.js's own parser): a redeclared name stops the whole script, and the
    page then shows nothing, with no error anywhere but the browser's console."""
    page = (REPO / "umemc" / "runtime" / "gateway" / "ui" / "index.html").read_text()
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)
    assert len(scripts) >= 1
    for i, script in enumerate(scripts):
        path = tmp_path / f"script{i}.js"
        path.write_text(script)
        checked = subprocess.run(["node", "--check", str(path)], capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stderr


@needs_chromium
def test_the_status_page_shows_the_stack_in_a_real_browser(stack: Any, tmp_path: Path) -> None:
    """Under load (requests to two models all along): memory over time drawn from the gateway's samples, every
    model with its mode, state in a word, speed and what a start would evict, the lease with a release button,
    the events in words; the first paint already shows the stack; at 1280 px and at a phone's 390 px."""
    text = stack_text(
        "ui",
        model("chat", priority=90, mode="hot", extra='kind = "chat"\n')
        + model("code", priority=70, mode="hot")
        + model("embed", extra='ttl = "10m"\nkind = "embeddings"\n')
        + model("batch", priority=10),  # never asked for: drawn as stopped, with what a start would evict
        slots=5,
    )
    gw = Gateway(stack(text, "--simulate"))
    assert gw.complete("embed")[0] == 200  # a cold start: an event to stream
    assert gw.call("POST", "/umemc/leases", {"holder": "comfyui", "bytes": "8MiB"})[0] == 201
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            for name in ("chat", "embed"):
                gw.complete(name)

    workers = [threading.Thread(target=load, daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        gw.run.wait_for(lambda: len(gw.call("GET", "/umemc/history")[2]["memory"]["t"]) >= 3, what="three samples")
        first = dom(f"http://127.0.0.1:{gw.port}/ui", budget_ms=1)  # before any fetch has answered
        page = dom(f"http://127.0.0.1:{gw.port}/ui", tmp_path / "wide.png")
        dom(f"http://127.0.0.1:{gw.port}/ui", tmp_path / "phone.png", width=390)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    assert re.search(r"\d of 4 models ready, pressure \d+%, committed \d+\.\d\d GiB", first)  # first paint
    assert "loading…" not in first
    assert re.search(r"committed \d+\.\d\d GiB of \d+\.\d\d GiB", page)
    lines = re.findall(r'<polyline points="([^"]+)"[^>]*class="series-line"', page)
    assert len(lines) >= 5 and all(len(x.split()) >= 3 for x in lines)  # committed, all models, three models
    assert "budget " in page and "of samples" in page
    for name, kind, mode in (("chat", "chat", "hot"), ("code", "other", "hot"), ("embed", "embeddings", "cold")):
        row = rf'<td>{name}<div class="muted kind">{kind}</div></td><td>{mode}[^<]*</td><td[^>]*>(ready|starting)'
        assert re.search(row, page), name
    assert re.search(r"<td>cold, ttl \d+(\.\d)? (s|min)( left)?</td>", page)  # embed's TTL (left, when idle)
    assert re.search(r"l-[0-9a-f]{12} comfyui: 0\.01 GiB at priority 50, \d+ min left <button>release</button>", page)
    assert re.search(r"embed: started on demand in \d+\.\d s, evicting nothing", page)  # events in words
    assert re.search(r"stack: lease l-[0-9a-f]{12} granted to comfyui \(0\.0 GiB\)", page)
    assert 'data-action="stop"' in page and 'data-action="evict"' in page
    batch = re.search(r'<td>batch<div class="muted kind">other</div></td>(.*?)</tr>', page)
    assert batch is not None and ">cold</td>" in batch[1] and ">stopped, holds nothing (quotas " in batch[1]
    assert '<td class="wide">nothing</td>' in batch[1] and 'data-action="start"' in batch[1]  # the budget holds five
    for shot in ("wide", "phone"):
        assert (tmp_path / f"{shot}.png").stat().st_size > 10_000  # chromium drew it
        if UPDATE:
            shutil.copy(
                tmp_path / f"{shot}.png", REPO / "docs" / f"status-page{'' if shot == 'wide' else '-phone'}.png"
            )


def test_the_pages_data_endpoints_and_rules(stack: Any) -> None:
    gw = Gateway(stack(stack_text("ui-api", model("w", mode="hot"), slots=2), "--simulate"))
    status, headers, page = gw.call("GET", "/ui")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "https://" not in page.split("<script>")[0] and "src=" not in page  # no external assets
    status, _, doc = gw.call("GET", "/umemc/events?after=0&limit=2")
    assert status == 200 and [e["kind"] for e in doc["events"]] == ["up", "enforcer_start"]
    assert [e["text"] for e in doc["events"]] == ["stack up (rehearsal)", "enforcer started"]
    assert doc["events"][1]["id"] > doc["events"][0]["id"]
    log = gw.run.run_dir / "state" / "logs" / "w.err.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))  # what supervisord captured, in its place
    status, headers, text = gw.call("GET", "/umemc/logs/w?lines=3")
    assert (status, text) == (200, "line 97\nline 98\nline 99\n")
    assert headers["Content-Type"].startswith("text/plain")
    assert gw.call("GET", "/umemc/logs/nope")[0] == 404
    assert gw.call("GET", "/ui", headers={"Host": "evil.example"})[0] == 403  # DNS rebinding
    assert gw.call("GET", "/umemc/events", headers={"Origin": "http://evil.example"})[0] == 403


def test_the_page_data_memory_over_time_and_speed(stack: Any) -> None:
    """/umemc/history: each model's usage from the enforcer's samples, one point per step, and per model its
    requests, latency quantiles, queue wait and tokens over the last minutes (each placeholder answer says
    prompt_tokens 1, completion_tokens 4)."""
    gw = Gateway(stack(stack_text("ui-history", model("w", mode="hot") + model("c"), slots=2), "--simulate"))
    for _ in range(5):
        assert gw.complete("w")[0] == 200

    def sampled() -> Any:
        doc = gw.call("GET", "/umemc/history?minutes=5")[2]
        return doc if len(doc["memory"]["t"]) >= 3 and doc["memory"]["models"]["w"][-1] > 0 else None

    doc = gw.run.wait_for(sampled, timeout=30, what="three samples with w's usage")
    memory = doc["memory"]
    assert memory["step_s"] == 2.0 and all(b - a >= 2.0 for a, b in itertools.pairwise(memory["t"]))
    assert set(memory["models"]) == {"w", "c"} and memory["models"]["c"][-1] == 0  # c is down: holds nothing
    assert 0 < memory["models"]["w"][-1] <= gw.plan["models"]["w"]["quota_hard_bytes"]
    assert doc["budget_bytes"] == gw.plan["capacity"]["budget_bytes"]
    w = doc["speed"]["w"]
    assert (w["requests"], w["errors"], w["tokens_in"], w["tokens_out"]) == (5, 0, 5, 20)
    assert 0 < w["p50_latency_s"] <= w["p95_latency_s"] and w["tokens_per_s"] > 0
    assert "c" not in doc["speed"]
    assert gw.call("GET", "/umemc/history?minutes=x")[0] == 400


def test_start_stop_and_evict_from_the_page(stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each action is a POST with a JSON body (a page elsewhere cannot send one without asking first), the token
    where there is one, and an event; start admits as a request would, stop drains first, evict refuses a busy
    model."""
    monkeypatch.setenv("UMEMC_UI_TOKEN", "ui-token")
    gw = Gateway(
        stack(
            stack_text(
                "ui-act", model("w", mode="hot") + model("c"), slots=2, gateway='token_env = "UMEMC_UI_TOKEN"\n'
            ),
            "--simulate",
        )
    )
    bearer = {"Authorization": "Bearer ui-token"}
    assert gw.call("POST", "/umemc/models/c/start", {})[0] == 401  # no token
    assert gw.call("POST", "/umemc/models/c/start", b"{}", {**bearer, "Content-Type": "text/plain"})[0] == 415
    assert gw.call("POST", "/umemc/models/c/start", None, bearer)[0] == 415  # no body
    assert gw.call("POST", "/umemc/models/c/start", {}, {**bearer, "Origin": "http://evil.example"})[0] == 403
    assert gw.call("POST", "/umemc/models/c/launch", {}, bearer)[0] == 404
    status, _, doc = gw.call("POST", "/umemc/models/c/start", {}, bearer)
    assert (status, doc["said"]) == (200, "starting c")

    def state(name: str) -> str:
        return str(gw.call("GET", "/umemc/status", headers=bearer)[2]["models"][name]["status"])

    gw.run.wait_for(lambda: state("c") == "ready", timeout=30, what="c started")
    slow = later(gw.call, "POST", "/v1/completions", {"model": "c", "prompt": "hi", "delay": 1.5}, bearer)
    gw.run.wait_for(
        lambda: gw.call("GET", "/umemc/status", headers=bearer)[2]["models"]["c"]["in_flight"] == 1, what="in flight"
    )
    status, _, doc = gw.call("POST", "/umemc/models/c/evict", {}, bearer)
    assert (status, doc["error"]["code"]) == (409, "busy")
    assert doc["error"]["message"] == "model c has 1 request(s) in flight and 0 queued: stop drains them first"
    status, _, doc = gw.call("POST", "/umemc/models/c/stop", {}, bearer)  # waits for the request, then stops
    assert (status, doc["said"], doc["status"]) == (200, "stopped c", "cold")
    assert slow.result(timeout=patience(30))[0] == 200  # served to the end
    status, _, doc = gw.call("POST", "/umemc/models/w/evict", {}, bearer)
    assert (status, doc["status"]) == (200, "stopped")  # a hot model stopped on request stays down
    kinds = [(m, k, d.get("action")) for m, k, d in gw.kinds("action", "unload")]
    assert kinds == [("c", "action", "start"), ("c", "action", "stop"), ("c", "unload", None),
                     ("w", "action", "evict"), ("w", "unload", None)]  # fmt: skip
    assert state("w") == "stopped"


@needs_chromium
def test_the_playground_and_the_captured_requests_in_a_real_browser(stack: Any) -> None:
    """A link that opens the playground with a prompt (#try=…&prompt=…) streams the model's answer into the page,
    through the token given in the same fragment; with gateway.capture on, the request and its answer are listed
    (the bodies only: the token is in no entry)."""
    import json as jsonlib

    os.environ["UMEMC_UI_TOKEN"] = "ui-s3cret"
    try:
        text = stack_text(
            "ui-play",
            model("chat", priority=90, mode="hot", extra='kind = "chat"\nserves = ["coder"]\n')
            + model("code", extra='serves = ["coder"]\n'),
            slots=2,
            gateway='token_env = "UMEMC_UI_TOKEN"\ncapture = 5\ncapture_bytes = "1KiB"\n',
        )
        gw = Gateway(stack(text, "--simulate"))
    finally:
        del os.environ["UMEMC_UI_TOKEN"]
    page = dom(f"http://127.0.0.1:{gw.port}/ui#token=ui-s3cret&try=chat&prompt=hello%20there", budget_ms=8000)
    out = re.search(r'<pre id="pgout">(.*?)</pre>', page, re.S)
    assert out is not None and out.group(1) == "(simulated reply from chat)"
    assert re.search(r'<span id="pgstate" class="muted">done</span>', page)
    status, _, doc = gw.call("GET", "/umemc/captures", headers={"Authorization": "Bearer ui-s3cret"})
    [entry] = [e for e in doc["entries"] if e["path"] == "/v1/chat/completions"]
    assert (status, doc["enabled"], doc["keep"], doc["bytes"]) == (200, True, 5, 1024)
    assert jsonlib.loads(entry["request"])["messages"] == [{"role": "user", "content": "hello there"}]
    assert "(simulated" in entry["answer"] and "ui-s3cret" not in jsonlib.dumps(doc)
    assert "chat: POST /v1/chat/completions → 200" in page
    assert "shared names: coder → chat, code (answers now: chat)" in page  # the loaded one answers


@needs_chromium
def test_the_page_asks_before_evicting_fits_small_models_and_keeps_its_events_in_a_box(stack: Any) -> None:
    """In a real browser: evict asks first (and does nothing when told no); one small model on a large budget is
    drawn to its own scale, the key saying the budget is far above; the event list scrolls in its own box (it no
    longer pushes the playground off the screen); a request whose client left is no failure on the page's figures."""
    from tests.runtime.browser import wait_in_page

    assert CHROMIUM is not None
    gw = Gateway(stack(stack_text("ui-ask", model("w", mode="hot"), slots=20), "--simulate"))
    shown = wait_in_page(
        CHROMIUM,
        f"http://127.0.0.1:{gw.port}/ui",
        """(() => {
          const b = document.querySelector('[data-action="evict"]');
          const keys = document.getElementById('chartkeys').textContent;
          if (!b || !keys.includes('budget')) return null;
          let asked = null;
          window.confirm = (q) => { asked = q; return false; };
          b.click();
          return {asked, keys, box: getComputedStyle(document.getElementById('events')).overflowY,
                  budgetLine: document.querySelectorAll('#chart line').length};
        })()""",
        patience(60),
    )
    assert shown["asked"] == "Evict w now? It stops at once, without waiting for its requests."
    assert "budget 1.56 GiB (far above: the chart fits the models)" in shown["keys"]
    assert (shown["box"], shown["budgetLine"]) == ("auto", 0)
    assert gw.run.status()["w"]["state"] == "RUNNING" and not gw.kinds("action")  # told no: nothing done

    # a client that goes away before its answer (a closed tab): counted apart, not as a failure
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=0.5)
    conn.request("POST", "/v1/completions", json.dumps({"model": "w", "prompt": "hi", "delay": 3}),
                 {"Content-Type": "application/json"})  # fmt: skip
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()

    def left() -> Any:
        w = gw.call("GET", "/umemc/history?minutes=5")[2]["speed"].get("w")
        return w if w and w["left"] else None

    w = gw.run.wait_for(left, timeout=30, what="the request whose client left")
    assert (w["requests"], w["errors"], w["left"]) == (1, 0, 1)
