"""How long `umemc up` of two real models takes, against the anchor: the same two llama-servers (the real SmolLM2-135M
and Gemma 3 270M, `python3 dev.py setup-models`, under the real llama-server, `setup-llama-server`) started by hand
until both answer their health. In the same round, when supervisord calls both workers RUNNING (its startsecs: 5 s
alive), which is where `up` returned before it returned on their health.

    python bench/up_speed.py [--rounds 5]

Each round: the anchor (both servers started at once, by pid, until both answer /health, then stopped), then `umemc
up` of a stack with both hot (a fresh run dir; `umemc` as users run it, its own process with compiled bytecode;
llama.cpp's dry run of the models recorded once before the rounds, as after a user's first `up`), then the time
until both are RUNNING, then `umemc down`. Medians of the rounds; the ratio is taken within each round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_section
from tests.realmodels import GEMMA3, LLAMA_SERVER, SMOLLM2
from tests.runtime.conftest import free_port, live_sysctl_table

UMEMC = [sys.executable, "-m", "umemc"]


def stack_text() -> str:
    def model(name: str, path: Path, extra: str = "") -> str:
        return (
            f'\n[models.{name}]\nruntime = "llama-server"\nbin = "{LLAMA_SERVER}"\nmodel = "{path}"\ncontext = 1024\n'
            f'mode = "hot"\nport = {free_port()}\n{extra}'
        )

    return (
        'version = 1\nname = "upspeed"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\nos_reserve = "1GiB"\n'
        f"{live_sysctl_table()}[gateway]\nport = {free_port()}\n"
        + model("smollm2", SMOLLM2)
        + model("gemma3", GEMMA3, 'chat_template = "gemma"\n')
    )


def healthy(port: int) -> bool:
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def anchor() -> float:
    ports = [free_port(), free_port()]
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [LLAMA_SERVER, "-m", str(m), "-c", "1024", "--port", str(p)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for m, p in zip((SMOLLM2, GEMMA3), ports, strict=True)
    ]
    try:
        while not all(healthy(p) for p in ports):
            time.sleep(0.02)
        return time.perf_counter() - t0
    finally:
        for p in procs:
            p.kill()
            p.wait()


def up_round(where: Path, run: Path) -> tuple[float, float]:
    """`up`'s own time, and the time until supervisord calls both workers RUNNING (from the same start)."""
    t0 = time.perf_counter()
    subprocess.run([*UMEMC, "up", "stack.toml", "--run-dir", str(run)], cwd=where, check=True, capture_output=True)
    returned = time.perf_counter() - t0
    try:
        while True:
            out = subprocess.run([*UMEMC, "status", "--json", "--run-dir", str(run)], capture_output=True, text=True)
            states = {name: m["state"] for name, m in json.loads(out.stdout)["models"].items()}
            if all(states.get(n) == "RUNNING" for n in ("smollm2", "gemma3")):
                return returned, time.perf_counter() - t0
            time.sleep(0.05)
    finally:
        subprocess.run([*UMEMC, "down", "--run-dir", str(run)], cwd=where, check=True, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(__file__).resolve().parents[1] / "umemc")])
    rows = []
    with tempfile.TemporaryDirectory(prefix="umemc-upspeed-") as d:
        where = Path(d)
        (where / "stack.toml").write_text(stack_text())
        # llama.cpp's dry run of each model is asked once, at the first `check` (a user's first `up` asks it too)
        subprocess.run([*UMEMC, "check", "stack.toml", "--measure"], cwd=where, check=True, capture_output=True)
        for i in range(args.rounds):
            a = anchor()
            up, running = up_round(where, where / f"run-{i}")
            rows.append((a, up, running))
            print(f"round {i + 1}: anchor {a:.2f} s, up {up:.2f} s ({up / a:.2f}x), both RUNNING at {running:.2f} s")
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    ratio = statistics.median(r[1] / r[0] for r in rows)
    lines = [
        f"Two real llama-servers (SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M), {args.rounds} rounds, medians: started by "
        f"hand until both answer /health {med[0]:.2f} s; `umemc up` of both hot {med[1]:.2f} s ({ratio:.2f}x the "
        f"anchor, paired); both RUNNING in supervisord's eyes (where `up` returned before) at {med[2]:.2f} s.",
    ]
    print("\n".join(lines))
    write_section("`umemc up` of two real models (bench/up_speed.py)", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
