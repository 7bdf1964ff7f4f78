"""The gateway while a worker misbehaves (tests/workers/hostile.py behind the real gateway, a good worker beside it):
its resident memory at the peak of each misbehaviour, and the latency another client sees meanwhile (a small
request to the good worker, asked back to back), against the same client with nothing misbehaving.

    python3 bench/hostile.py [--seconds 6]

Writes the section "Gateway under a hostile worker" of bench/RESULTS.md. The figures are bounds to watch, not
timings of umemc's own work: they say the gateway holds neither the answers it relays nor a line without an end,
and that one worker's stream does not stall the others."""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import ROOT, gateway_process, write_section

PY = sys.executable
MODES = ("huge-length", "endless-json", "no-newline", "endless-500", "endless-header")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stack_text(ports: dict[str, int]) -> str:
    hostile = [PY, str(ROOT / "tests" / "workers" / "hostile.py"), "{port}"]
    return (
        'version = 1\nname = "hostile-bench"\n[platform]\nkind = "cpu"\nmemory = "4GiB"\nos_reserve = "512MiB"\n'
        f'[gateway]\nport = {ports["gateway"]}\nupstream_timeout = "30s"\n'
        f'[models.h]\nruntime = "command"\ncommand = {json.dumps(hostile)}\nmemory = "64MiB"\nport = {ports["h"]}\n'
        f'[models.good]\nruntime = "command"\ncommand = {json.dumps(hostile)}\nmemory = "64MiB"\n'
        f"port = {ports['good']}\n"
    )


def ask(port: int, model: str, text: str, stream: bool = False, read_at_most: int = 1 << 40) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    got = 0
    while got < read_at_most and (piece := resp.read(1 << 20)):
        got += len(piece)
    conn.close()


def latencies(port: int, seconds: float) -> list[float]:
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        ask(port, "good", "hello")
        out.append((time.perf_counter() - t) * 1000)
    return out


def during(port: int, mode: str, seconds: float, gateway: object) -> tuple[float, float, int]:
    """Median and 95th percentile of the good client's latency (ms) while `mode` runs, and the gateway's peak RSS."""
    stop = threading.Event()

    def hostile() -> None:
        while not stop.is_set():
            try:
                ask(port, "h", mode, stream=mode == "no-newline", read_at_most=256 << 20)
            except (OSError, http.client.HTTPException):
                pass

    peak = [0]

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], gateway.memory_info().rss)  # type: ignore[attr-defined]
            time.sleep(0.05)

    threads = [threading.Thread(target=hostile, daemon=True), threading.Thread(target=watch, daemon=True)]
    for t in threads:
        t.start()
    got = latencies(port, seconds)
    stop.set()
    q = statistics.quantiles(got, n=20) if len(got) > 1 else got * 19
    return statistics.median(got), q[18], peak[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    ports = {n: free_port() for n in ("gateway", "h", "good")}
    rows = ["| misbehaviour | other client, median ms | p95 ms | gateway peak RSS MiB |", "|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        stack, run = Path(tmp) / "stack.toml", Path(tmp) / "run"
        stack.write_text(stack_text(ports))
        subprocess.run([PY, "-m", "umemc", "up", str(stack), "--run-dir", str(run), "--skip", "all"], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            gateway = gateway_process(run)
            base = latencies(ports["gateway"], args.seconds)
            q = statistics.quantiles(base, n=20)
            rows.append(f"| none | {statistics.median(base):.2f} | {q[18]:.2f} | {gateway.memory_info().rss >> 20} |")
            for mode in MODES:
                med, p95, peak = during(ports["gateway"], mode, args.seconds, gateway)
                rows.append(f"| {mode} | {med:.2f} | {p95:.2f} | {peak >> 20} |")
                print(rows[-1], flush=True)
            alive = gateway.is_running()
        finally:
            subprocess.run([PY, "-m", "umemc", "down", "--run-dir", str(run)], check=True, stdout=subprocess.DEVNULL)
    body = "\n".join(rows) + (
        f"\n\nThe gateway was the same process throughout: {alive}. Each row: {args.seconds:g} s of a client asking "
        "the good worker back to back while another client asks the hostile one for that misbehaviour again and "
        "again (reading at most 256 MiB of each answer); medians of this machine, noisy."
    )
    write_section("Gateway under a hostile worker (bench/hostile.py)", body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
