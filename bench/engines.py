"""vLLM and MLX: umemc's estimate against the engine's own figures and against the worker's real peak.

Each engine serves the real SmolLM2-135M-Instruct as a Hugging Face directory (`python3 dev.py setup-hf-model`,
`setup-vllm`, `setup-mlx`) under `umemc up`, with the argv and environment umemc compiled, and is driven to its
sized load: `parallel` requests at once, each a prompt filling most of `context`, streamed to its end. The worker's
process tree is sampled every 50 ms: the sum of its processes' resident sets (what umemc's sampler holds to the
quota where there is no cgroup) and of their proportional sets (PSS: shared library pages counted once, the memory
they really take). vLLM's own figures come from its log: the KV cache it was given and the tokens it made of it.

    python bench/engines.py [--engines vllm,mlx] [--context 2048] [--parallel 2]

Goal (the issue's): the estimate's total within 10% of the peak; the KV cache exact to what the engine reports.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_section
from tests.realmodels import MLX_PYTHON, SMOLLM2_HF, VLLM_PYTHON
from tests.runtime.conftest import Running, free_port, live_sysctl_table
from umemc.cli import main

MiB = 2**20
PYTHONS = {"vllm": VLLM_PYTHON, "mlx": MLX_PYTHON}
# one sentence of about 12 tokens, repeated to fill the prompt
SENTENCE = "The lighthouse keeper counted the ships that passed the rocks at night. "


def stack_text(engine: str, context: int, parallel: int, gateway: int, port: int) -> str:
    return (
        f'version = 1\nname = "bench-{engine}"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\nos_reserve = "1GiB"\n'
        f'{live_sysctl_table()}[gateway]\nport = {gateway}\nqueue_timeout = "10m"\n'
        f'\n[models.{engine}]\nruntime = "{engine}"\nbin = "{PYTHONS[engine]}"\nmodel = "{SMOLLM2_HF}"\n'
        f"context = {context}\nparallel = {parallel}\nport = {port}\n"
    )


def tree(pid: int) -> list[psutil.Process]:
    try:
        top = psutil.Process(pid)
        return [top, *top.children(recursive=True)]
    except psutil.Error:
        return []


def sample(pid: int, stop: threading.Event, peak: dict[str, int]) -> None:
    while not stop.is_set():
        rss = pss = 0
        for p in tree(pid):
            try:
                full = p.memory_full_info()
            except psutil.Error:
                continue
            rss, pss = rss + full.rss, pss + full.pss
        peak["rss"], peak["pss"] = max(peak.get("rss", 0), rss), max(peak.get("pss", 0), pss)
        stop.wait(0.05)


def ask(port: int, model: str, words: int) -> int:
    """One streamed chat completion with a prompt of about `words` sentences; its completion tokens."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": SENTENCE * words + "Summarize."}],
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{model}: {resp.status} {text[:300]}")
    usage = [json.loads(x[6:]).get("usage") for x in text.splitlines() if x.startswith("data: {")]
    return next((u["prompt_tokens"] for u in usage if u), 0)


def measure(engine: str, context: int, parallel: int, where: Path) -> dict[str, object]:
    gateway, port = free_port(), free_port()
    path = where / f"{engine}.toml"
    path.write_text(stack_text(engine, context, parallel, gateway, port))
    out = where / f"{engine}.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["check", str(path), "--format", "json"]) == 0
    est = json.loads(buf.getvalue())["models"][engine]
    out.write_text(json.dumps(est))
    run = where / f"run-{engine}"
    t0 = time.monotonic()
    assert main(["up", str(path), "--run-dir", str(run), "--timeout", "900"]) == 0
    started = time.monotonic() - t0
    try:
        pid = Running(run).status()[engine]["pid"]
        peak: dict[str, int] = {}
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(pid, stop, peak), daemon=True)
        sampler.start()
        words = max(1, (context - 120) // 13)
        with ThreadPoolExecutor(parallel) as pool:
            prompts = list(pool.map(lambda _: ask(gateway, engine, words), range(parallel)))
        time.sleep(1)
        stop.set()
        sampler.join()
        logs = run / "state" / "logs"
        log = "".join(f.read_text(errors="replace") for f in sorted(logs.glob(f"{engine}.*.log")))
    finally:
        main(["down", "--run-dir", str(run)])
    given = re.search(r"Explicitly set \(([\d.]+)/", log)
    tokens = re.search(r"KV cache size: ([\d,]+) tokens", log)
    return {
        "engine": engine,
        "start_s": started,
        "prompt_tokens": prompts,
        "estimate": est,
        "peak_rss": peak["rss"],
        "peak_pss": peak["pss"],
        "vllm_kv_gib": float(given.group(1)) if given else None,
        "vllm_kv_tokens": int(tokens.group(1).replace(",", "")) if tokens else None,
    }


def main_() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="mlx,vllm")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--parallel", type=int, default=2)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            r = measure(engine, args.context, args.parallel, Path(tmp))
            print(json.dumps(r, indent=1, default=str))
            rows.append(r)
    lines = [
        f"SmolLM2-135M-Instruct (bfloat16 safetensors, 30 layers, 3 KV heads of 64), context {args.context}, "
        f"parallel {args.parallel}, kind = cpu, on this 2-core machine; driven with {args.parallel} requests at once "
        "filling most of the context. MiB; peak of the worker's process tree, sampled every 50 ms.",
        "",
        "| engine | weights | KV | compute | overhead | estimate | peak RSS (sum) | peak PSS | estimate / RSS "
        "| estimate / PSS | start s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e = r["estimate"]
        assert isinstance(e, dict)
        total = e["estimate_bytes"]
        lines.append(
            f"| {r['engine']} | {e['weights_bytes'] / MiB:.1f} | {e['kv_bytes'] / MiB:.1f} | "
            f"{e['compute_bytes'] / MiB:.1f} | {e['overhead_bytes'] / MiB:.1f} | {total / MiB:.1f} | "
            f"{int(r['peak_rss']) / MiB:.1f} | {int(r['peak_pss']) / MiB:.1f} | {total / int(r['peak_rss']):.3f} | "
            f"{total / int(r['peak_pss']):.3f} | {float(r['start_s']):.0f} |"
        )
    for r in rows:
        if r["vllm_kv_tokens"] is not None:
            e = r["estimate"]
            assert isinstance(e, dict)
            blocks = -(-args.context // 128) * args.parallel + 1
            lines.append(
                f"\nvLLM's own report: KV cache explicitly set to {r['vllm_kv_gib']} GiB, {r['vllm_kv_tokens']:,} "
                f"tokens; umemc gave it {e['kv_bytes']:,} bytes = ({args.context} / 128 x {args.parallel} + its null "
                f"block) = {blocks} blocks of 128 tokens x 23,040 bytes a token (30 layers x 2 x 3 heads x 64 x 2 "
                f"bytes): {r['vllm_kv_tokens'] * 23040:,} bytes by its count."
            )
    write_section("vLLM and MLX: the estimate vs the engine and the worker's peak (bench/engines.py)", "\n".join(lines))


if __name__ == "__main__":
    main_()
