"""A request sent on by another node's gateway against the same request to the right node, with a real model: two
"nodes" on this machine (each its own `umemc up --node`: supervisord, enforcer, gateway), a serving the real
SmolLM2-135M (`python3 dev.py setup-models`, `setup-llama-server`), b a small command worker; a streamed chat of 64
tokens asked of a's gateway (direct) and of b's (forwarded to a's), alternating, one of each per set.

Per set: the forwarded side's time to the first content chunk less the direct side's, and its tokens/s over the
direct side's; medians over the sets with their interquartile range (the machine's drift moves both sides of a set
alike).

    python bench/federation.py [--sets 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_section
from bench.serving import one
from tests.realmodels import LLAMA_SERVER, SMOLLM2
from tests.runtime.conftest import free_port, live_sysctl_table

UMEMC = [sys.executable, "-m", "umemc"]


def stack_text(ports: dict[str, int]) -> str:
    files = [sys.executable, "-m", "http.server", str(ports["files"]), "--bind", "127.0.0.1"]
    nodes = "".join(
        f'\n[nodes.{n}]\nkind = "cpu"\nmemory = "4GiB"\nos_reserve = "1GiB"\ngateway_port = {ports[n]}\n' for n in "ab"
    )
    return (
        f'version = 1\nname = "bench-fed"\n{live_sysctl_table()}[gateway]\nport = {free_port()}\n{nodes}'
        f'\n[models.smollm2]\nruntime = "llama-server"\nbin = "{LLAMA_SERVER}"\nmodel = "{SMOLLM2}"\ncontext = 1024\n'
        f'mode = "hot"\nnode = "a"\nport = {free_port()}\n'
        f'\n[models.files]\nruntime = "command"\ncommand = {json.dumps(files)}\nmemory = "64MiB"\nmode = "hot"\n'
        f'node = "b"\nport = {ports["files"]}\n'
    )


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", type=int, default=40)
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(__file__).resolve().parents[1] / "umemc")])
    ports = {n: free_port() for n in ("a", "b", "files")}
    with tempfile.TemporaryDirectory(prefix="umemc-fed-") as d:
        root = Path(d)
        (root / "stack.toml").write_text(stack_text(ports))
        runs = []
        try:
            for n in "ab":
                run = root / f"run-{n}"
                runs.append(run)
                subprocess.run([*UMEMC, "up", "stack.toml", "--node", n, "--run-dir", str(run)], cwd=root, check=True,
                               capture_output=True)  # fmt: skip
            one(ports["a"], 4), one(ports["b"], 4)  # warm both paths
            extra, ratio = [], []
            for i in range(args.sets):
                sides = {}
                for side in ("direct", "forwarded") if i % 2 == 0 else ("forwarded", "direct"):
                    sides[side] = one(ports["a" if side == "direct" else "b"])
                extra.append((sides["forwarded"][0] - sides["direct"][0]) * 1000)
                ratio.append(sides["forwarded"][1] / sides["direct"][1])
        finally:
            for run in reversed(runs):
                subprocess.run([*UMEMC, "down", "--run-dir", str(run)], cwd=root, capture_output=True)
    e, r = quartiles(extra), quartiles(ratio)
    body = (
        f"SmolLM2-135M on node a, asked through node b's gateway (forwarded) against a's own (direct), streamed chats "
        f"of 64 tokens, {args.sets} sets, one of each, alternating: time to the first token +{e[1]:.2f} ms "
        f"(IQR {e[0]:.2f} to {e[2]:.2f}; goal <= +2 ms); tokens/s {r[1]:.3f}x (IQR {r[0]:.3f}-{r[2]:.3f}; goal >= "
        "0.99x). Both gateways on this 2-core machine, beside the model."
    )
    print(body)
    write_section("A request forwarded by another node's gateway (bench/federation.py)", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
