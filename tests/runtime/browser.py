"""A real headless Chromium driven over its DevTools protocol (a websocket, aiohttp's client): open a page, then wait
until an expression evaluated in it is truthy, for what a page shows only after real time has passed (a model's
streamed answer), where `--dump-dom` with a virtual-time budget would dump it first."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

import aiohttp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_in_page(chromium: str, url: str, expression: str, timeout: float) -> Any:
    """The value of `expression` (JavaScript) in the page at `url`, once it is truthy; AssertionError at `timeout`
    with the last value seen. Chromium's process group (it leads it) is ended, whatever happens."""
    port = _free_port()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [
                chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--remote-debugging-port={port}", f"--user-data-dir={profile}", "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: its renderers and helpers end with it
        )  # fmt: skip
        try:
            return asyncio.run(_drive(port, url, expression, timeout))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def _drive(port: int, url: str, expression: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        target = None
        while target is None:  # until the DevTools endpoint answers
            try:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    pages = [t for t in await r.json() if t.get("type") == "page"]
                    target = pages[0] if pages else None
            except aiohttp.ClientError:
                pass
            if target is None:
                assert time.monotonic() < deadline, "chromium's DevTools endpoint never answered"
                await asyncio.sleep(0.05)
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 1 << 30))

            async def send(method: str, **params: Any) -> dict[str, Any]:
                n = next(ids)
                await ws.send_str(json.dumps({"id": n, "method": method, "params": params}))
                async for msg in ws:
                    doc = json.loads(msg.data)
                    if doc.get("id") == n:
                        return dict(doc.get("result") or {})
                raise AssertionError("chromium closed the DevTools connection")

            await send("Page.navigate", url=url)
            value = None
            while time.monotonic() < deadline:
                result = await send("Runtime.evaluate", expression=expression, returnByValue=True)
                value = result.get("result", {}).get("value")
                if value:
                    return value
                await asyncio.sleep(0.05)
            raise AssertionError(f"the page never showed it within {timeout} s (last: {value!r})")
