"""The enforcer's own CPU with 5, 50 and 100 idle workers, sampling through each of the two process probes behind
umemc.runtime.probes.host: Linux's direct /proc reads (kept-open statm, task children) and psutil (what every other
platform uses), under the same real supervisord. This is why Linux keeps its own reads.

    python bench/sampler.py [--workers 5,50,100] [--seconds 15] [--repeat 3]

Each worker is an idle process with 8 threads (a model server is one process with a few dozen: the tree walk reads
every thread's children). The enforcer samples every 100 ms with kernel enforcement off, so every sample reads
each worker's memory through the probes (a worker in its own cgroup is read from the cgroup instead). The anchor
is the psutil probe in the same run: the ratio is psutil's CPU over Linux's. Medians of --repeat interleaved runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_section
from bench.enforce import SYSCTL
from umemc.runtime.preflight import read_sysctl
from umemc.runtime.supervisor import Supervisor

PY = sys.executable
IDLE = (
    "import threading, time\nfor _ in range(8): threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()\n"
)
IDLE += "time.sleep(1e6)\n"


def stack_text(workers: int, work: Path) -> str:
    sysctl = "\n".join(f'"{k}" = {read_sysctl(k)}' for k in SYSCTL)
    text = (
        'version = 1\nname = "sampler"\n[platform]\nkind = "cpu"\nmemory = "20GiB"\nos_reserve = "2GiB"\n'
        '[policy]\nsample_interval = "100ms"\nkernel_enforcement = "off"\n'
        f"[sysctl]\n{sysctl}\n"
    )
    idle = work / "idle.py"
    idle.write_text(IDLE)
    for i in range(workers):
        text += f'[models.w{i}]\nruntime = "command"\ncommand = {json.dumps([PY, str(idle)])}\nmemory = "64MiB"\n'
    return text


UP_S: dict[int, list[float]] = {}  # how long `umemc up` took, by the number of workers


def enforcer_cpu(workers: int, probes: str, work: Path, seconds: float) -> float:
    """% of one core the enforcer used over `seconds` once the stack settled."""
    run_dir = work / f"{probes}-{workers}"
    stack = work / f"{probes}-{workers}.toml"
    stack.write_text(stack_text(workers, work))
    env = dict(os.environ, UMEMC_PROBES=probes)
    began = time.monotonic()
    subprocess.run([PY, "-m", "umemc", "up", str(stack), "--run-dir", str(run_dir), "--timeout", "600"], check=True,
                   stdout=subprocess.DEVNULL, env=env)  # fmt: skip
    UP_S.setdefault(workers, []).append(time.monotonic() - began)
    try:
        pid = Supervisor(run_dir / "state" / "supervisor.sock").processes()["umemc-enforcer"]["pid"]
        time.sleep(3)
        t0, c0 = time.monotonic(), _cpu(pid)
        time.sleep(seconds)
        return (_cpu(pid) - c0) / (time.monotonic() - t0) * 100
    finally:
        subprocess.run([PY, "-m", "umemc", "down", "--run-dir", str(run_dir)], check=True, stdout=subprocess.DEVNULL)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="5,50,100")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(n) for n in args.workers.split(",")]
    cpu: dict[tuple[int, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="umemc-bench-") as d:
        for _ in range(args.repeat):
            for n in sizes:
                for probes in ("linux", "psutil"):  # interleaved: a noisy minute hurts both alike
                    value = enforcer_cpu(n, probes, Path(d), args.seconds)
                    cpu.setdefault((n, probes), []).append(value)
                    print(f"{n:4} workers, {probes:6}: {value:.2f}% of a core", flush=True)
    lines = [
        "The enforcer's CPU (% of one core) at a 100 ms sample interval with N idle workers (8 threads each), kernel",
        f"enforcement off so every sample reads each worker through the probes; median of {args.repeat} interleaved",
        f"runs of {args.seconds:g} s, same machine, same run. Anchor: psutil (what every platform but Linux uses).",
        "",
        "| workers | Linux /proc reads | psutil | psutil / Linux |",
        "|---:|---:|---:|---:|",
    ]
    for n in sizes:
        linux, ps = statistics.median(cpu[(n, "linux")]), statistics.median(cpu[(n, "psutil")])
        lines.append(f"| {n} | {linux:.2f}% | {ps:.2f}% | {ps / linux:.1f}x |")
    lines += [
        "",
        "`umemc up` of each stack (supervisord, the enforcer, the gateway, every worker started), median: "
        + ", ".join(f"{n} workers {statistics.median(UP_S[n]):.1f} s" for n in sizes)
        + ".",
    ]
    text = "\n".join(lines)
    print(text)
    write_section("Sampling probes: Linux's /proc reads vs psutil (bench/sampler.py)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
