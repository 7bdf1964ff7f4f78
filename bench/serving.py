"""Speed as a user of the gateway feels it, with a real model: a real llama-server serving the real SmolLM2-135M
(`python3 dev.py setup-models`, `setup-llama-server`) under `umemc up`, asked straight on its port, through a bare
relay and through the gateway in the same run:

1. generation speed (tokens/s each client sees: completion tokens over the time from its request to the stream's
   end) at 1 and 4 concurrent clients, streamed chat completions of 64 tokens;
2. time to the first token (the first content chunk), at 1 client, on an idle machine and with a CPU hog busy on
   every core (one `while True` interpreter per core, started and stopped by this script, by pid; answers of 2
   tokens there; the row stops after --hog-seconds, as llama.cpp's threads can slow to a token every few seconds
   on every path while they share the cores with the hog).

Measured in sets: one measurement a side (1 request, or 4 at once), the three sides back to back, their order
rotating through all six orders. A ratio or a difference is taken within each set and the median of the sets is
given with its interquartile range: the machine's drift from set to set (the hog's share of the cores, the page
cache, a neighbour) moves all three sides of a set alike, and cancels there.

    python bench/serving.py [--sets 96] [--hog-seconds 300]

Ratios are gateway / direct. The machine is shared by the clients, the gateway and the worker (2 cores here).
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import until_listening, write_section
from tests.realmodels import LLAMA_SERVER, SMOLLM2
from tests.runtime.conftest import free_port, live_sysctl_table

PY = sys.executable
TOKENS = 64
HOG_TOKENS = 2  # the hog row's figure is the first token: the shortest answers, the most sets in its time
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def stack_text(gateway: int, worker: int) -> str:
    return (
        'version = 1\nname = "bench-serving"\n[platform]\nkind = "cpu"\nmemory = "4GiB"\nos_reserve = "1GiB"\n'
        f"{live_sysctl_table()}[gateway]\nport = {gateway}\n"
        f'\n[models.smollm2]\nruntime = "llama-server"\nbin = "{LLAMA_SERVER}"\nmodel = "{SMOLLM2}"\n'
        f'context = 1024\nparallel = 4\nmax_concurrency = 4\nmode = "hot"\nport = {worker}\n'
    )


def one(port: int, tokens: int = TOKENS) -> tuple[float, float]:
    """(seconds to the first content chunk, tokens per second over the whole stream) of one streamed chat."""
    body = {"model": "smollm2", "messages": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True}
    body |= {"stream_options": {"include_usage": True}, "ignore_eos": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first, said, buf = None, 0, b""
    while chunk := resp.read1(65536):
        buf += chunk
        *events, buf = buf.split(b"\n\n")
        for ev in events:
            if not ev.startswith(b"data: {"):
                continue
            doc = json.loads(ev[6:])
            if first is None and any((c.get("delta") or {}).get("content") for c in doc.get("choices") or []):
                first = time.perf_counter() - t0
            if doc.get("usage"):
                said = doc["usage"]["completion_tokens"]
    total = time.perf_counter() - t0
    conn.close()
    assert first is not None and said, "no tokens streamed"
    return first, said / total


def round_of(port: int, clients: int, tokens: int) -> tuple[float, float]:
    """Median first-token seconds and median tokens/s per client of `clients` requests at once."""
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda _: one(port, tokens), range(clients)))
    return statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)


SIDES = ("direct", "relay", "gateway")
ORDERS = list(itertools.permutations(SIDES))


class Row(NamedTuple):
    sets: int
    first: dict[str, float]  # each side's median seconds to the first token
    speed: dict[str, float]  # each side's median tokens/s
    ratio: dict[str, tuple[float, float, float]]  # a relayed side's tokens/s over direct's, in its set: q1, median, q3
    added: dict[str, tuple[float, float, float]]  # its first token minus direct's, in its set, seconds: q1, median, q3
    slower: dict[str, float]  # its first token over direct's, in its set: the median


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """The first quartile, the median and the third (one value alone is all three)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def compare(ports: dict[str, int], clients: int, sets: int, tokens: int = TOKENS, within: float = 1e9) -> Row:
    """`sets` sets, or as many as begin within `within` seconds (at least one)."""
    got: list[dict[str, tuple[float, float]]] = []
    end = time.monotonic() + within
    for s in range(sets):
        if got and time.monotonic() > end:
            break
        got.append({side: round_of(ports[side], clients, tokens) for side in ORDERS[s % len(ORDERS)]})
        print(f"{clients} client(s), set {s + 1}/{sets}: " + ", ".join(
            f"{side} {first * 1000:.1f} ms {speed:.1f} t/s" for side, (first, speed) in got[-1].items()
        ), file=sys.stderr, flush=True)  # fmt: skip
    return Row(
        len(got),
        {side: statistics.median(g[side][0] for g in got) for side in SIDES},
        {side: statistics.median(g[side][1] for g in got) for side in SIDES},
        {side: quartiles([g[side][1] / g["direct"][1] for g in got]) for side in SIDES[1:]},
        {side: quartiles([g[side][0] - g["direct"][0] for g in got]) for side in SIDES[1:]},
        {side: statistics.median(g[side][0] / g["direct"][0] for g in got) for side in SIDES[1:]},
    )


def hog() -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", type=int, default=96, help="sets at 1 client, half at 4 (a multiple of 12)")
    ap.add_argument("--hog-seconds", type=float, default=300, help="the hog row's time (it stops at --sets)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM still takes the stack down
    if not (SMOLLM2.is_file() and Path(LLAMA_SERVER).is_file()):
        sys.exit("needs the real model and llama-server: python3 dev.py setup-models setup-llama-server")
    from umemc.cli import main as umemc

    ports = {"gateway": free_port(), "direct": free_port(), "relay": free_port()}
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "stack.toml").write_text(stack_text(ports["gateway"], ports["direct"]))
        run = str(Path(d) / "run")
        if umemc(["up", str(Path(d) / "stack.toml"), "--run-dir", run]) != 0:
            return 1
        relay = subprocess.Popen([PY, str(Path(__file__).with_name("bare_relay.py")), str(ports["relay"]),
                                  str(ports["direct"])])  # fmt: skip
        try:
            until_listening(ports["relay"], time.perf_counter())
            for side in SIDES:  # warm every path (the prompt cache too)
                one(ports[side])
            rows = []
            for clients in (1, 4):
                rows.append(
                    (f"{clients} client(s)", compare(ports, clients, args.sets if clients == 1 else args.sets // 2))
                )
            hogs = hog()
            try:
                rows.append(
                    ("1 client, CPU hog on every core", compare(ports, 1, args.sets, HOG_TOKENS, args.hog_seconds))
                )
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
        finally:
            relay.terminate()
            relay.wait()
            umemc(["down", "--run-dir", run])
    lines = [
        f"A real llama-server (SmolLM2-135M-Instruct Q4_1, -np 4) under `umemc up`, streamed chat completions of "
        f"{TOKENS} tokens ({HOG_TOKENS} in the hog row), in sets: one measurement a side (1 request, or 4 at once) "
        "back to back, the sides' order rotating through all six orders; "
        f"{os.cpu_count()} cores shared by the clients, the gateway and the worker. Each side's figure is the median "
        "of its sets; a ratio or an added time is taken within each set (the drift between sets cancels) and given "
        "as the median of the sets [interquartile range].",
        "",
        "The bare relay (bench/bare_relay.py: aiohttp's server and client, nothing of the gateway's work) is the "
        "floor of any Python relay. With the hog, llama-server's two threads, the clients and the hogs share 2 "
        "cores: llama.cpp's two threads meet at a barrier many times a token, and one of them waiting for a time "
        "slice behind a hog holds both, on every path alike (a token took seconds in some runs, in others tens of "
        "milliseconds); every relayed token also waits for a time slice of its own. The first token is the figure "
        "that holds there; the row stops after a time rather than a count of sets.",
        "",
        "| load | sets | tokens/s direct / bare relay / gateway | gateway ratio | bare relay ratio "
        "| first token direct / bare relay / gateway | gateway added | bare relay added |",
        "|---|---:|---|---|---|---|---|---|",
    ]

    def ratio(q: tuple[float, float, float]) -> str:
        return f"{q[1]:.3f}x [{q[0]:.3f}-{q[2]:.3f}]"

    def added(q: tuple[float, float, float], times: float) -> str:
        return f"{q[1] * 1000:+.1f} ms [{q[0] * 1000:+.1f} to {q[2] * 1000:+.1f}], {times:.2f}x"

    for name, r in rows:
        speeds = " / ".join(f"{r.speed[side]:.1f}" for side in SIDES)
        firsts = " / ".join(f"{r.first[side] * 1000:.1f}" for side in SIDES)
        lines.append(
            f"| {name} | {r.sets} | {speeds} | {ratio(r.ratio['gateway'])} | {ratio(r.ratio['relay'])} | {firsts} ms "
            f"| {added(r.added['gateway'], r.slower['gateway'])} | {added(r.added['relay'], r.slower['relay'])} |"
        )
    text = "\n".join(lines)
    print(text)
    write_section("Serving a real model through the gateway (bench/serving.py)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
