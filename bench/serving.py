"""Speed as a user of the gateway feels it, with a real model: a real llama-server serving the real SmolLM2-135M
(`python3 dev.py setup-models`, `setup-llama-server`) under `umemc up`, asked straight on its port and through the
gateway in the same run, rounds alternating, medians:

1. generation speed (tokens/s each client sees: completion tokens over the time from its request to the stream's
   end) at 1 and 4 concurrent clients, streamed chat completions of 64 tokens;
2. time to the first token (the first content chunk), at 1 client, on an idle machine and with a CPU hog busy on
   every core (one `while True` interpreter per core, started and stopped by this script, by pid; answers of 16
   tokens there, so a round can ask 4 times a side as the others do).

    python bench/serving.py [--rounds 5]

Ratios are gateway / direct. The machine is shared by the clients, the gateway and the worker (2 cores here).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import until_listening, write_section
from tests.realmodels import LLAMA_SERVER, SMOLLM2
from tests.runtime.conftest import free_port, live_sysctl_table

PY = sys.executable
TOKENS = 64
HOG_TOKENS = 16  # the hog row's figure is the first token: shorter answers, four times the samples
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


def round_of(port: int, clients: int, per_client: int, tokens: int = TOKENS) -> tuple[float, float]:
    """Median first-token seconds and median tokens/s per client over clients x per_client requests."""
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda _: one(port, tokens), range(clients * per_client)))
    return statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)


SIDES = ("direct", "relay", "gateway")


def compare(
    ports: dict[str, int], clients: int, rounds: int, per_client: int, tokens: int = TOKENS
) -> dict[str, tuple[float, float]]:
    got: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            got[side].append(round_of(ports[side], clients, per_client, tokens))
    return {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in got.items()}


def hog() -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
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
                r = compare(ports, clients, args.rounds, 4 // clients)  # 4 requests a side each round
                rows.append((f"{clients} client(s)", r))
            hogs = hog()
            try:
                rows.append(("1 client, CPU hog on every core", compare(ports, 1, args.rounds, 4, HOG_TOKENS)))
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
        f"{TOKENS} tokens ({HOG_TOKENS} in the hog row), {args.rounds} alternating rounds per row of 4 requests a side "
        f"(one client asking 4 times or 4 at once), medians; {os.cpu_count()} cores shared by the clients, the "
        "gateway and the worker.",
        "",
        "The bare relay (bench/bare_relay.py: aiohttp's server and client, nothing of the gateway's work) is the "
        "floor of any Python relay. With the hog, llama-server's two threads, the clients and the hogs share 2 "
        "cores and the tokens/s of every path swings from run to run (direct 3 to 35 tokens/s seen; a relayed "
        "stream 0.03x to 1.07x of direct, the bare relay as much as the gateway: each relayed token waits for a "
        "time slice behind the hogs and llama-server's spinning threads); the first token is the figure that holds.",
        "",
        "| load | tokens/s direct | bare relay | gateway | gateway ratio | first token direct | bare relay | gateway "
        "| gateway added |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        (fd, sd), (fr, sr), (fg, sg) = r["direct"], r["relay"], r["gateway"]
        lines.append(
            f"| {name} | {sd:.1f} | {sr:.1f} | {sg:.1f} | {sg / sd:.3f}x | {fd * 1000:.1f} ms | {fr * 1000:.1f} ms | "
            f"{fg * 1000:.1f} ms | {(fg - fd) * 1000:+.1f} ms ({fg / fd:.2f}x) |"
        )
    text = "\n".join(lines)
    print(text)
    write_section("Serving a real model through the gateway (bench/serving.py)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
