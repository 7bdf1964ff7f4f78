"""The live status page (GET /ui), rendered by a real headless Chromium (Debian's chromium) against the real
gateway: both ledgers, every model with its state and quotas, the leases, the events streaming in. Its data
endpoints (/umemc/events, /umemc/logs/MODEL) and the Host/Origin/token rules are checked over HTTP."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.test_gateway import Gateway, model, stack_text

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (Debian: apt-get install chromium)")
REPO = Path(__file__).resolve().parents[2]


def dom(url: str, screenshot: Path | None = None) -> str:
    assert CHROMIUM is not None
    flags = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=6000"]
    if screenshot is not None:
        subprocess.run([*flags, "--window-size=1280,900", f"--screenshot={screenshot}", url], capture_output=True,
                       timeout=120)  # fmt: skip
    return subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout


@needs_chromium
def test_the_status_page_shows_the_stack_in_a_real_browser(stack: Any, tmp_path: Path) -> None:
    text = stack_text(
        "ui", model("chat", priority=90, mode="hot") + model("code", priority=70, mode="hot") + model("embed"), slots=4
    )
    gw = Gateway(stack(text, "--simulate"))
    assert gw.complete("embed")[0] == 200  # a cold start: an event to stream
    assert gw.call("POST", "/umemc/leases", {"holder": "comfyui", "bytes": "8MiB"})[0] == 201
    page = dom(f"http://127.0.0.1:{gw.port}/ui", tmp_path / "ui.png")
    assert re.search(r"committed \d+\.\d\d GiB of \d+\.\d\d GiB", page)
    assert "all memory" in page and "used " in page
    for name in ("chat", "code", "embed"):
        assert re.search(rf"<td[^>]*>{name}</td><td[^>]*>(ready|starting)", page), name
    assert re.search(r"l-[0-9a-f]{12} comfyui: 0\.01 GiB", page)  # the lease
    assert re.search(r" embed cold start in \d+\.\d s", page)  # events streamed in, in words
    assert re.search(r" - lease l-[0-9a-f]{12} granted to comfyui \(0\.0 GiB\)", page)
    assert (tmp_path / "ui.png").stat().st_size > 10_000  # chromium drew it


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
