"""Two llama.cpp workers generating at once on one machine: the stack's total tokens/s with llama.cpp's default
threads (one per core each) against umemc's share (each worker its share of the cores by priority: here one each on
2 cores), with the real SmolLM2-135M and Gemma 3 270M (`python3 dev.py setup-models`) under the real llama-server
(`setup-llama-server`), started by this script by pid.

A round starts both servers one way, asks each for a streamed 64-token answer at the same moment, and takes each
answer's tokens over its own time; the two ways alternate round by round and the median of the rounds' totals is
given, with the ratio share / default taken within each pair of rounds.

    python bench/threads.py [--rounds 12]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import until_listening, write_section
from tests.realmodels import GEMMA3, LLAMA_SERVER, SMOLLM2
from tests.runtime.conftest import free_port

TOKENS = 64
PROMPT = "Write a short story about a lighthouse keeper."


def start(model: Path, port: int, threads: int | None) -> subprocess.Popen[bytes]:
    argv = [LLAMA_SERVER, "-m", str(model), "-c", "1024", "-np", "1", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-t", str(threads)] if threads else []
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def healthy(port: int) -> None:
    until_listening(port, time.perf_counter())
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)


def speed(port: int) -> float:
    body = {"prompt": PROMPT, "n_predict": TOKENS, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    answer = json.loads(conn.getresponse().read())
    return int(answer["tokens_predicted"]) / (time.perf_counter() - t0)


def one_round(threads: int | None) -> float:
    ports = [free_port(), free_port()]
    procs = [start(SMOLLM2, ports[0], threads), start(GEMMA3, ports[1], threads)]
    try:
        for p in ports:
            healthy(p)
        with ThreadPoolExecutor(2) as pool:
            return sum(pool.map(speed, ports))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    default, share, ratios = [], [], []
    for i in range(args.rounds):
        order = (None, 1) if i % 2 == 0 else (1, None)
        got = {t: one_round(t) for t in order}
        default.append(got[None])
        share.append(got[1])
        ratios.append(got[1] / got[None])
        print(f"round {i + 1}: default {got[None]:.1f} tokens/s, one thread each {got[1]:.1f}", file=sys.stderr)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    body = (
        f"SmolLM2-135M (Q4_1) and Gemma 3 270M (Q4_K_M) under llama-server, each asked for {TOKENS} tokens at the same "
        f"moment, on this 2-core VM (nothing else running); {args.rounds} rounds alternating.\n\n"
        "| threads | total tokens/s (median) |\n|---|---|\n"
        f"| llama.cpp's default (a thread per core, each) | {statistics.median(default):.1f} |\n"
        f"| umemc's share (1 each: 2 cores, two workers of one priority) | {statistics.median(share):.1f} |\n\n"
        f"Share / default, within each pair of rounds: {statistics.median(ratios):.2f}x "
        f"[interquartile {q[0]:.2f}-{q[2]:.2f}]."
    )
    print(body)
    write_section("CPU threads of two llama.cpp workers generating at once (bench/threads.py)", body)


if __name__ == "__main__":
    main()
