"""A bounded chaos soak: a real stack (`umemc up`: supervisord, enforcer, gateway; placeholder workers and
one real leaking worker, all run as the stack's own `command` workers, so the leaker really leaks: under
`--simulate` it would be a placeholder too) under steady requests, while random faults hit it: kill -9 of a
worker, of the gateway or of the enforcer, SIGSTOP/SIGCONT of a worker, leases granted and released. Loopback
only, fixed duration, it stops by itself and brings the stack down.

    python bench/chaos.py [--seconds 120] [--clients 4] [--seed 1]

It prints requests by outcome, the largest overshoot of a worker over its hard quota (sampled every
50 ms from /proc), how long each fault took to heal (the first answer after it from the model it hit),
and invariant violations: a 500, a granted lease missing after the gateway's restart, a process of the run
alive after `umemc down`. The figures go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_section
from tests.runtime.conftest import free_port, live_sysctl_table
from umemc.runtime.probes.host import marked_processes
from umemc.runtime.rundir import run_mark

PY = sys.executable
MiB = 2**20
WORKERS = Path(__file__).resolve().parents[1] / "tests" / "workers"
MODELS = ("a", "b", "c")  # placeholders; "leak" leaks on purpose and is killed at its quota


def placeholder(name: str) -> str:
    """umemc's placeholder run as a plain command worker: it holds 56 MiB and answers like a model server."""
    argv = [PY, "-m", "umemc.runtime.placeholder", "--model", name, "--bytes", str(56 * MiB), "--port", "{port}"]
    return json.dumps([*argv, "--health", "/health"])


def stack_text(ports: dict[str, int], kernel: str = "auto") -> str:
    models = "".join(
        f'\n[models.{n}]\nruntime = "command"\ncommand = {placeholder(n)}\nmemory = "64MiB"\nport = {ports[n]}\n'
        f'health = "/health"\nmode = "{"hot" if n == "a" else "cold"}"\npriority = {80 if n == "a" else 50}\n'
        "max_concurrency = 4\n"
        for n in MODELS
    )
    leak = [PY, str(WORKERS / "leaker.py"), "50", "4", "256", "5"]
    models += f'\n[models.leak]\nruntime = "command"\ncommand = {json.dumps(leak)}\nmemory = "96MiB"\n'
    return (
        f'version = 1\nname = "chaos"\n[platform]\nkind = "cpu"\nmemory = "{3 * 80 + 120 + 256}MiB"\n'
        'os_reserve = "256MiB"\n[policy]\nsafety_margin = 0.0\nquota_headroom = 0.25\nload_below = 0.95\n'
        f'kernel_enforcement = "{kernel}"\n'
        f"evict_above = 0.99\nmax_kills = 1000\n{live_sysctl_table()}[gateway]\nport = {ports['gateway']}\n"
        f'queue_timeout = "10s"\n{models}'
    )


class Soak:
    def __init__(self, run: Path, port: int, seconds: float, clients: int, seed: int):
        self.run, self.port, self.seconds, self.clients = run, port, seconds, clients
        self.rng = random.Random(seed)
        self.outcomes: Counter[str] = Counter()
        self.violations: list[str] = []
        self.faults: Counter[str] = Counter()
        self.heal: list[float] = []
        self.pending: dict[str, float] = {}  # model -> when a fault hit it
        self.overshoot = 0
        self.kills: dict[str, int] = {}  # the leaker's hard-limit kills, by whom
        self.leases: list[str] = []
        self.samples: dict[str, str] = {}  # one message per failing outcome
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw.startswith(b"{") else {})
        finally:
            conn.close()

    def client(self) -> None:
        while not self.stop.is_set():
            model = self.rng.choice(MODELS)
            try:
                status, doc = self.call("POST", "/v1/completions", {"model": model, "prompt": "hi"})
            except OSError as exc:  # the gateway itself was killed: supervisord restarts it
                outcome = f"connection ({type(exc).__name__})"
                status, doc = 0, {}
                self.stop.wait(0.05)  # as a client would: a moment before trying again
            else:
                outcome = f"{status} {doc.get('error', {}).get('code', '')}".strip()
            with self.lock:
                self.outcomes[outcome] += 1
                if status >= 500 and len(self.samples) < 8 and outcome not in self.samples:
                    self.samples[outcome] = str(doc.get("error", {}).get("message", ""))[:200]
                if status >= 500 and status not in (502, 503, 504):
                    self.violations.append(f"{model}: {status} {doc}")
                if status == 200 and model in self.pending:
                    self.heal.append(time.monotonic() - self.pending.pop(model))

    def pid(self, name: str) -> int | None:
        try:
            return int((self.run / "state" / "pids" / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def chaos(self) -> None:
        actions = ("kill worker", "stop worker", "kill gateway", "kill enforcer", "lease")
        while not self.stop.wait(self.rng.uniform(0.5, 2.0)):
            action = self.rng.choice(actions)
            model = self.rng.choice(MODELS)
            target = model if "worker" in action else f"umemc-{action.split()[-1]}"
            pid = self.pid(target)
            self.faults[action] += 1
            try:
                if action == "kill worker" and pid:
                    os.kill(pid, signal.SIGKILL)
                    self.pending.setdefault(model, time.monotonic())
                elif action == "stop worker" and pid:
                    os.kill(pid, signal.SIGSTOP)
                    self.pending.setdefault(model, time.monotonic())
                    self.stop.wait(self.rng.uniform(0.2, 3.0))
                    os.kill(pid, signal.SIGCONT)
                elif action == "kill gateway" and pid:
                    os.kill(pid, signal.SIGKILL)
                    self.check_leases()
                elif action == "kill enforcer" and pid:
                    os.kill(pid, signal.SIGKILL)
                elif action == "lease":
                    self.lease()
            except ProcessLookupError:
                pass

    def lease(self) -> None:
        try:
            if self.leases and self.rng.random() < 0.5:
                self.call("DELETE", f"/umemc/leases/{self.leases.pop()}")
                return
            status, doc = self.call("POST", "/umemc/leases", {"holder": "chaos", "bytes": "8MiB", "ttl": "10m"})
            if status == 201:
                self.leases.append(doc["lease"]["id"])
        except OSError:
            pass

    def check_leases(self) -> None:
        """After a kill -9 of the gateway: every lease it acknowledged is there when it answers again."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                status, doc = self.call("GET", "/umemc/leases")
            except OSError:
                time.sleep(0.1)
                continue
            if status == 200:
                have = {x["id"] for x in doc["leases"]}
                for lost in set(self.leases) - have:
                    self.violations.append(f"lease {lost} acknowledged with 201, gone after the gateway's restart")
                    self.leases.remove(lost)
                return

    def sampler(self) -> None:
        """Every 50 ms: each worker's resident memory against its hard quota (the enforcer's own reading)."""
        plan = json.loads((self.run / "bundle" / "plan.json").read_text())
        hard = {n: m["quota_hard_bytes"] for n, m in plan["models"].items()}
        page = os.sysconf("SC_PAGE_SIZE")
        while not self.stop.wait(0.05):
            for name in hard:
                pid = self.pid(name)
                try:
                    with open(f"/proc/{pid}/statm") as f:
                        rss = int(f.read().split()[1]) * page
                except (OSError, TypeError, ValueError):
                    continue
                self.overshoot = max(self.overshoot, rss - hard[name])

    def run_for(self) -> None:
        threads = [threading.Thread(target=self.client, daemon=True) for _ in range(self.clients)]
        threads += [threading.Thread(target=t, daemon=True) for t in (self.chaos, self.sampler)]
        for t in threads:
            t.start()
        time.sleep(self.seconds)
        self.stop.set()
        for t in threads:
            t.join(timeout=40)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--kernel-enforcement", choices=("auto", "off"), default="auto",
        help="off: only the enforcer's sampling stops the leaker (its overshoot is then the enforcer's own)",
    )  # fmt: skip
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="umemc-chaos-") as d:
        where = Path(d)
        ports = {n: free_port() for n in (*MODELS, "gateway")}
        (where / "stack.toml").write_text(stack_text(ports, a.kernel_enforcement))
        run = where / "run"
        up = [PY, "-m", "umemc", "up", str(where / "stack.toml"), "--run-dir", str(run)]
        subprocess.run(up, check=True, capture_output=True, timeout=300)
        soak = Soak(run, ports["gateway"], a.seconds, a.clients, a.seed)
        try:
            soak.run_for()
            soak.kills = _leak_kills(run)
        finally:
            mark = run_mark(run / "state")
            down = subprocess.run([PY, "-m", "umemc", "down", "--run-dir", str(run)], capture_output=True, text=True)
            left = marked_processes(mark)
            if down.returncode != 0 or left:
                soak.violations.append(f"after down (exit {down.returncode}): {len(left)} process(es) of the run alive")
            for pid, _ in left:
                os.kill(pid, signal.SIGKILL)
    text = report(soak, a)
    print(text)
    title = "Chaos soak (bench/chaos.py)"
    write_section(title if a.kernel_enforcement == "auto" else f"{title}, kernel enforcement off", text)
    return 1 if soak.violations else 0


def _leak_kills(run: Path) -> dict[str, int]:
    out = subprocess.run(
        [PY, "-m", "umemc", "events", "--json", "--run-dir", str(run), "--kind", "hard_limit_kill", "--model", "leak"],
        capture_output=True,
        text=True,
    ).stdout
    kills: Counter[str] = Counter(e["detail"].get("by", "enforcer") for e in json.loads(out or "[]"))
    return dict(kills)


def report(s: Soak, a: argparse.Namespace) -> str:
    total = sum(s.outcomes.values())
    lines = [
        f"{a.seconds:g} s, {a.clients} clients, seed {a.seed}, kernel enforcement {a.kernel_enforcement}: "
        f"{total} requests; faults: " + ", ".join(f"{k} {v}" for k, v in sorted(s.faults.items())),
        "",
        "| outcome | requests |",
        "|---|---:|",
        *[f"| {k} | {v} |" for k, v in s.outcomes.most_common()],
        "",
        "Largest overshoot of a worker over its hard quota (50 ms samples of /proc): "
        f"{max(0, s.overshoot) / MiB:.1f} MiB; the leaker (a real process growing 50 MiB/s to 256 MiB against "
        f"its 120 MiB hard quota) was killed {s.kills.get('enforcer', 0)} times by the enforcer and "
        f"{s.kills.get('kernel', 0)} by the kernel (its cgroup's limit)."
        + (
            " RSS also counts shared pages (the interpreter's libraries) that the kernel charges to whichever "
            "cgroup touched them first, so under the kernel's limit a worker's RSS may stand a few MiB above it."
            if s.kills.get("kernel")
            else ""
        ),
        *[f"- {k}: {v}" for k, v in s.samples.items()],
    ]
    if s.heal:
        lines.append(
            f"Recovery (fault to the model's next 200): median {statistics.median(s.heal):.2f} s, "
            f"worst {max(s.heal):.2f} s over {len(s.heal)} faults."
        )
    lines.append(
        f"Invariant violations: {len(s.violations)}" + (": " + "; ".join(s.violations[:5]) if s.violations else ".")
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
