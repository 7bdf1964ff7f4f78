"""What the gateway costs and what its cold-start path does, on a real stack (`umemc up --simulate`):

1. latency added (p50/p99) and throughput through the gateway vs straight to the same worker, in the
   same run, at 1, 8 and 32 concurrent keep-alive clients, plain and streamed replies, from an instant worker
   and from one that takes generation time (rounds alternate direct/gateway; medians); small requests'
   latency while 1 MiB bodies go through;
2. cold start: time from a request for a stopped cold model to the first byte of its streamed reply;
3. swaps: cold starts for an interleaved A B C A B C load (three cold models, memory for one);
4. the floor: at 1 and 8 clients, a bare relay on the gateway's own HTTP parts (bench/bare_relay.py) beside the
   gateway and the worker alone; a cold start's parts one at a time.

    python bench/gateway.py [--requests 2000] [--rounds 3]

The worker is umemc's placeholder (a ThreadingHTTPServer) with max_concurrency 64, so the gateway
never queues here: the figures are its proxying cost. Client, gateway and worker share the 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from bench.common import cpu_seconds, gateway_process, until_listening, write_section
from tests.runtime.conftest import free_port, live_sysctl_table
from umemc.runtime.event_log import EventLog

PY = sys.executable
BODY = json.dumps({"model": "w", "messages": [{"role": "user", "content": "hi"}]}).encode()


def stack_text(ports: dict[str, int]) -> str:
    models = "".join(
        f'\n[models.{n}]\nruntime = "command"\ncommand = ["true"]\nmemory = "64MiB"\nport = {ports[n]}\n'
        f'mode = "{"hot" if n == "w" else "cold"}"\npriority = {90 if n == "w" else 50}\n'
        + ("max_concurrency = 64\n" if n == "w" else "")
        for n in ("w", "a", "b", "c")
    )
    return (
        f'version = 1\nname = "bench-gw"\n[platform]\nkind = "cpu"\nmemory = "{2 * 80 + 256}MiB"\n'
        'os_reserve = "256MiB"\n[policy]\nsafety_margin = 0.0\nquota_headroom = 0.25\nload_below = 0.9\n'
        f"evict_above = 0.95\n{live_sysctl_table()}[gateway]\nport = {ports['gateway']}\n{models}"
    )


@contextlib.contextmanager
def running() -> Iterator[tuple[dict[str, int], Path]]:
    """The stack up (`umemc up --simulate`) while the block runs: its ports by name, and its run dir."""
    ports = {n: free_port() for n in ("gateway", "w", "a", "b", "c")}
    with tempfile.TemporaryDirectory() as tmp:
        stack, run = Path(tmp) / "stack.toml", Path(tmp) / "run"
        stack.write_text(stack_text(ports))
        subprocess.run(
            [PY, "-m", "umemc", "up", str(stack), "--simulate", "--run-dir", str(run)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        try:
            yield ports, run
        finally:
            subprocess.run([PY, "-m", "umemc", "down", "--run-dir", str(run)], check=True, stdout=subprocess.DEVNULL)


# -- load ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What each request of a measurement asks: a streamed reply or not, and the worker's time per answer (per
    chunk when streamed: 4 chunks)."""

    stream: bool
    delay: float

    def body(self) -> bytes:
        doc = {"model": "w", "messages": [{"role": "user", "content": "hi"}], "delay": self.delay}
        return json.dumps(doc | ({"stream": True} if self.stream else {})).encode()

    def label(self) -> str:
        kind = "streamed" if self.stream else "plain"
        each = "instant" if not self.delay else f"{self.delay * 1000:g} ms" + (" a chunk" if self.stream else "")
        return f"{kind}, {each}"


async def _read_reply(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head  # an error answered fast is no measurement
    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
    fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
    if b"content-length" in fields:
        await reader.readexactly(int(fields[b"content-length"]))
        return
    assert fields.get(b"transfer-encoding") == b"chunked", head
    while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
        await reader.readexactly(size + 2)
    await reader.readuntil(b"\r\n")


def _request(port: int, body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (port, len(body))
    ) + body


async def _client(port: int, n: int, body: bytes, lat: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    req = _request(port, body)
    for _ in range(n):
        t = time.perf_counter()
        writer.write(req)
        await _read_reply(reader)
        lat.append(time.perf_counter() - t)
    writer.close()


async def _load(port: int, total: int, clients: int, body: bytes) -> tuple[float, float, float, float]:
    lat: list[float] = []
    t = time.perf_counter()
    await asyncio.gather(*(_client(port, max(1, total // clients), body, lat) for _ in range(clients)))
    wall = time.perf_counter() - t
    lat.sort()
    return len(lat) / wall, lat[len(lat) // 2], lat[int(len(lat) * 0.99)], statistics.fmean(lat)


def load(port: int, total: int, clients: int, body: bytes = BODY) -> tuple[float, float, float, float]:
    import uvloop

    return uvloop.run(_load(port, total, clients, body))


async def _beside_big_bodies(port: int, small: int, big: bytes | None) -> list[float]:
    """Latencies of `small` one-at-a-time small requests while another connection sends `big` bodies back to
    back (None: alone)."""
    lat: list[float] = []
    done = asyncio.Event()

    async def heavy() -> int:
        assert big is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = 0
        while not done.is_set():
            writer.write(_request(port, big))
            await _read_reply(reader)
            sent += 1
        writer.close()
        return sent

    task = asyncio.ensure_future(heavy()) if big is not None else None
    await asyncio.sleep(0.05)
    await _client(port, small, BODY, lat)
    done.set()
    if task is not None:
        await task
    return sorted(lat)


def beside_big_bodies(port: int, small: int, big: bytes | None) -> list[float]:
    import uvloop

    return uvloop.run(_beside_big_bodies(port, small, big))


# -- cold path ----------------------------------------------------------------------------------
def first_byte(port: int, model: str) -> float:
    """Seconds from sending a streaming request to the first byte of the reply's body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    return _streamed_first_byte(conn, model, time.perf_counter())


def _streamed_first_byte(conn: http.client.HTTPConnection, model: str, t: float) -> float:
    """Seconds from `t` to the first byte of a streamed chat reply asked on `conn` (read whole, then closed)."""
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": model, "stream": True, "messages": []}))
    resp = conn.getresponse()
    resp.read1(1)
    took = time.perf_counter() - t
    resp.read()
    conn.close()
    return took


def straight(run: Path, model: str) -> tuple[subprocess.Popen[bytes], float]:
    """The worker's own share of a cold start: its argv from the run's plan started straight (no supervisord, no
    wrapper, no gateway), its port asked every millisecond. The process (left running: the caller ends it) and the
    seconds to the first byte of a streamed reply."""
    plan = json.loads((run / "bundle" / "plan.json").read_text())
    spec = plan["models"][model]
    env = dict(os.environ, **spec["env"])
    t = time.perf_counter()
    proc = subprocess.Popen(spec["argv"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", spec["port"], timeout=120)
        try:
            conn.connect()
            break
        except ConnectionRefusedError:
            conn.close()
            time.sleep(0.001)
    return proc, _streamed_first_byte(conn, model, t)


def ended(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM a process started straight and wait for its exit (its memory is free then): seconds."""
    t = time.perf_counter()
    proc.terminate()
    proc.wait()
    return time.perf_counter() - t


def interleaved(port: int, names: str, stagger: float) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(model: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": "x", "delay": 0.2}))
        status = conn.getresponse().status
        conn.close()
        return status

    with ThreadPoolExecutor(len(names)) as pool:
        futures = []
        for name in names:
            futures.append(pool.submit(one, name))
            time.sleep(stagger)
        assert all(f.result() == 200 for f in futures)


def cold_starts(run: Path, since: float) -> list[str]:
    log = EventLog(run / "state" / "events.db")
    try:
        return [e.model or "" for e in log.since(0) if e.kind == "cold_start" and e.ts >= since]
    finally:
        log.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS), help="(RESULTS.md: all of them)")
    args = ap.parse_args()
    with running() as (ports, run):
        load(ports["w"], 200, 4)  # warm both paths
        load(ports["gateway"], 200, 4)
        parts = [PARTS[p](ports, args, run) for p in args.parts]
    rows = "\n\n".join(parts)
    if args.parts == list(PARTS):
        write_section("Gateway (bench/gateway.py)", rows)
    print(rows)
    return 0


SHAPES = (Shape(False, 0.0), Shape(True, 0.0), Shape(False, 0.01), Shape(True, 0.005))


def _count(shape: Shape, clients: int, total: int) -> int:
    """Requests per measurement: `total` for an instant worker, about 1.5 s of work for a slow one."""
    if not shape.delay:
        return total
    each = shape.delay * (4 if shape.stream else 1)
    return max(clients, int(1.5 / each * min(clients, 16)))


def throughput(ports: dict[str, int], args: argparse.Namespace, run: Path) -> str:
    total, rounds = args.requests, args.rounds
    out = [
        (
            "Placeholder worker (`umemc up --simulate`, max_concurrency 64), keep-alive clients in one uvloop "
            f"process; {total} requests per measurement for an instant worker, about 1.5 s of work for a slow one; "
            f"{rounds} rounds alternating direct/gateway; medians of the rounds. A streamed reply is 4 chunks."
        ),
        "",
        (
            "| reply | clients | direct req/s | gateway req/s | ratio | direct p50 / p99 / mean ms | "
            "gateway p50 / p99 / mean ms | added p50 / p99 ms |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shape in SHAPES:
        body = shape.body()
        for clients in (1, 8, 32):
            n = _count(shape, clients, total)
            d, g = [], []
            for r in range(rounds):
                pair = [("d", ports["w"]), ("g", ports["gateway"])]
                for which, port in pair if r % 2 == 0 else pair[::-1]:
                    (d if which == "d" else g).append(load(port, n, clients, body))
            med = [statistics.median(x[i] for x in d) for i in range(4)]
            gmed = [statistics.median(x[i] for x in g) for i in range(4)]
            added50 = statistics.median(gx[1] - dx[1] for dx, gx in zip(d, g, strict=True)) * 1000
            added99 = statistics.median(gx[2] - dx[2] for dx, gx in zip(d, g, strict=True)) * 1000
            ratio = statistics.median(gx[0] / dx[0] for dx, gx in zip(d, g, strict=True))
            row = (
                f"| {shape.label()} | {clients} | {med[0]:.0f} | {gmed[0]:.0f} | {ratio:.2f}x | {med[1] * 1000:.2f} / "
                f"{med[2] * 1000:.2f} / {med[3] * 1000:.2f} | {gmed[1] * 1000:.2f} / {gmed[2] * 1000:.2f} / "
                f"{gmed[3] * 1000:.2f} | {added50:.2f} / {added99:.2f} |"
            )
            print(row, flush=True)
            out.append(row)
    out += [
        "",
        (
            "With an instant worker the 1-client rows are the gateway's own cost per request (two HTTP hops in "
            "Python: aiohttp's server and client); once a reply takes generation time, that cost is a small "
            "share of it. At 32 clients the worker alone (a thread per connection on 2 cores) serves some "
            "connections while others stall; through the gateway it sees a few pooled keep-alive connections."
        ),
    ]
    return "\n".join(out)


def floor(ports: dict[str, int], args: argparse.Namespace, run: Path) -> str:
    """1 and 8 clients, an instant worker: the worker alone, a bare relay on the gateway's own parts
    (bench/bare_relay.py: aiohttp's server and client on uvloop, none of the gateway's work) and the gateway, in
    alternating rounds; the relay's and the gateway's own CPU time per request."""
    relay = free_port()
    proc = subprocess.Popen([PY, str(Path(__file__).with_name("bare_relay.py")), str(relay), str(ports["w"])])
    procs = {"relay": psutil.Process(proc.pid), "gateway": gateway_process(run)}
    try:
        until_listening(relay, time.perf_counter())
        rows = [
            f"1 and 8 clients, an instant worker, {args.requests} requests per measurement, {args.rounds * 2} rounds "
            "alternating the three; medians. The bare relay is bench/bare_relay.py: the gateway's HTTP parts "
            "(aiohttp's server and client on uvloop) forwarding to the worker, with none of the gateway's work "
            "(routing by the body's model, the token, admission and slots, accounting, the access log). CPU: the "
            "relay's or the gateway's own process, user + system, per request.",
            "",
            "| reply | clients | direct req/s | bare relay req/s | ratio | gateway req/s | ratio "
            "| relay / gateway added p50 ms | relay / gateway CPU ms a request | CPU ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for shape, clients in [(shape, n) for shape in SHAPES[:2] for n in (1, 8)]:
            body = shape.body()
            got: dict[str, list[tuple[float, float, float, float]]] = {"w": [], "relay": [], "gateway": []}
            cpu: dict[str, list[float]] = {"relay": [], "gateway": []}
            order = [("w", ports["w"]), ("relay", relay), ("gateway", ports["gateway"])]
            for r in range(args.rounds * 2):
                for name, port in order if r % 2 == 0 else order[::-1]:
                    before = cpu_seconds(procs[name]) if name in procs else 0.0
                    got[name].append(load(port, args.requests, clients, body))
                    if name in procs:
                        cpu[name].append((cpu_seconds(procs[name]) - before) / args.requests * 1000)
            rate = {k: statistics.median(x[0] for x in v) for k, v in got.items()}
            p50 = {k: statistics.median(x[1] for x in v) * 1000 for k, v in got.items()}
            ms = {k: statistics.median(v) for k, v in cpu.items()}
            rows.append(
                f"| {shape.label()} | {clients} | {rate['w']:.0f} | {rate['relay']:.0f} | "
                f"{rate['relay'] / rate['w']:.2f}x | "
                f"{rate['gateway']:.0f} | {rate['gateway'] / rate['w']:.2f}x | {p50['relay'] - p50['w']:.2f} / "
                f"{p50['gateway'] - p50['w']:.2f} | {ms['relay']:.3f} / {ms['gateway']:.3f} | "
                f"{ms['gateway'] / ms['relay']:.2f}x |"
            )
            print(rows[-1], flush=True)
        return "\n".join(rows)
    finally:
        proc.terminate()
        proc.wait()


def big_bodies(ports: dict[str, int], args: argparse.Namespace, run: Path) -> str:
    prompt = ('code: f([{x}]) "q" \\ ' * 60000)[: 1 << 20]
    big = json.dumps({"model": "w", "messages": [{"role": "user", "content": prompt}]}).encode()
    figures = {}
    for name in ("w", "gateway"):
        alone, beside = [], []
        for _ in range(args.rounds):
            alone.append(beside_big_bodies(ports[name], 400, None))
            beside.append(beside_big_bodies(ports[name], 400, big))
        figures[name] = [
            statistics.median(x[int(len(x) * q)] for x in runs) * 1000 for runs in (alone, beside) for q in (0.5, 0.99)
        ]
    d, g = figures["w"], figures["gateway"]
    return (
        "Large bodies: small requests one at a time, p50 / p99 ms, alone and while another connection sends "
        f"{len(big) / 2**20:.1f} MiB chat bodies (a prompt of code: quotes, backslashes, brackets) back to back; "
        f"the gateway reads each, checks its nesting and parses it for its model before routing. Straight to the "
        f"worker: {d[0]:.2f} / {d[1]:.2f} alone, {d[2]:.2f} / {d[3]:.2f} beside them; through the gateway: "
        f"{g[0]:.2f} / {g[1]:.2f} alone, {g[2]:.2f} / {g[3]:.2f} beside them."
    )


def cold(ports: dict[str, int], args: argparse.Namespace, run: Path) -> str:
    """Cold starts through the gateway against the same work done straight: each start that evicts the cold model
    before it against a swap with no cost of its own (SIGTERM the one running, wait for its exit, start the next
    straight), and starts with nothing to evict against the worker started straight."""
    from umemc.runtime.rundir import RunDir
    from umemc.runtime.supervisor import Supervisor

    firsts: list[float] = []
    exits: list[float] = []  # the victim's own exit, SIGTERM to reaped
    starts: list[float] = []  # the worker's own start, to its first byte
    held: subprocess.Popen[bytes] | None = None  # the model started straight last, left running to be swapped out
    try:
        for _ in range(args.rounds * 2):
            for name, before in (("a", "c"), ("b", "a"), ("c", "b")):  # each start evicts the one before it
                firsts.append(first_byte(ports["gateway"], name))
                # the one it evicted is free: swapped in straight for the one started straight before it, which
                # is never the model the gateway starts next
                exit_s = ended(held) if held is not None else None
                held, start_s = straight(run, before)
                if exit_s is not None and firsts[1:]:
                    exits.append(exit_s)
                    starts.append(start_s)
    finally:
        if held is not None:
            ended(held)
    swap = [e + s for e, s in zip(exits, starts, strict=True)]
    sup = Supervisor(RunDir.of_state(run / "state").socket())
    alone_gw: list[float] = []  # a cold start with nothing to evict: every cold model stopped before it
    alone: list[float] = []
    for _ in range(args.rounds * 2):
        for name in "abc":
            for other in "abc":
                sup.try_stop(other, wait=True)
            alone_gw.append(first_byte(ports["gateway"], name))
            proc, start_s = straight(run, next(m for m in "abc" if m != name))
            ended(proc)
            alone.append(start_s)
    t0 = time.time()
    interleaved(ports["gateway"], "abcabc", 0.02)
    batched = cold_starts(run, t0)
    t1 = time.time()
    for name in "abcabc":
        interleaved(ports["gateway"], name, 0)
    sequential = cold_starts(run, t1)
    med = statistics.median
    share_ms = 1000 * (med(firsts) - med(swap))
    alone_ms = 1000 * (med(alone_gw) - med(alone))
    out = [
        (
            "Cold start through the gateway (stopped cold model, memory for one cold model besides the hot "
            "one, so each start also evicts the previous cold model): time to the first byte of a streamed "
            f"reply, {len(firsts)} starts: median {med(firsts) * 1000:.1f} ms (min {min(firsts) * 1000:.1f}, "
            f"max {max(firsts) * 1000:.1f}). The same swap with no cost of its own (SIGTERM the cold model "
            "running, wait for its exit, start the next one's argv straight, its port asked every millisecond), "
            f"{len(swap)} swaps, interleaved with the gateway's: median {med(swap) * 1000:.1f} ms (the victim's "
            f"own exit {med(exits) * 1000:.1f}, the worker's own start {med(starts) * 1000:.1f}). **umemc's "
            f"share** (the difference of the medians: the gateway's decision, supervisord's calls, the exec "
            f"wrapper, the gate, the health polls, the relay): **{share_ms:.1f} ms** (goal <= 20); against the "
            f"worker's start alone, as measured before (the victim's exit counted as umemc's): "
            f"{1000 * (med(firsts) - med(starts)):.1f} ms."
        ),
        "",
        (
            f"A cold start with nothing to evict (every cold model stopped first), {len(alone_gw)} starts: median "
            f"{med(alone_gw) * 1000:.1f} ms; the worker started straight {med(alone) * 1000:.1f} ms; "
            f"**umemc's share {alone_ms:.1f} ms**."
        ),
        "",
        (
            f"Interleaved A B C A B C, sent 20 ms apart (each request 0.2 s of generation): "
            f"{len(batched)} cold starts ({' '.join(batched)}); a naive swapper starts a model per switch: 6."
        ),
        f"The same six requests one after another (nothing to batch): {len(sequential)} cold starts.",
    ]
    return "\n".join(out)


def cold_parts(ports: dict[str, int], args: argparse.Namespace, run: Path) -> str:
    """A cold start's parts, one at a time, for model "a" (stopped): its argv started straight, through the exec
    wrapper without and with its memory cgroup, through supervisord's start call; supervisord's waited stop."""
    import shlex

    from umemc.runtime.rundir import RunDir
    from umemc.runtime.supervisor import Supervisor

    spec = json.loads((run / "bundle" / "plan.json").read_text())["models"]["a"]
    env = dict(os.environ, **spec["env"])
    program = (run / "bundle" / "supervisord.conf").read_text().split("[program:a]")[1]
    line = next(x for x in program.splitlines() if x.startswith("command="))
    wrapped = shlex.split(line.removeprefix("command=").replace("%(here)s", str(run / "bundle")))
    unplaced = ["off" if w == "auto" else w for w in wrapped]
    sup = Supervisor(RunDir.of_state(run / "state").socket())
    rows: dict[str, list[float]] = {
        "its argv started straight": [],
        "through the exec wrapper, --cgroup off": [],
        "through the exec wrapper, --cgroup auto (as bundles run it)": [],
        "supervisord's start call (the wrapper in its child, cgroup, worker)": [],
    }
    stops: list[float] = []
    for _ in range(args.rounds * 2 + 1):
        for label, argv in zip(rows, (spec["argv"], unplaced, wrapped), strict=False):
            t = time.perf_counter()
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rows[label].append(until_listening(spec["port"], t))
            proc.terminate()
            proc.wait()
        t = time.perf_counter()
        sup.ensure_started("a")
        rows["supervisord's start call (the wrapper in its child, cgroup, worker)"].append(
            until_listening(spec["port"], t)
        )
        t = time.perf_counter()
        sup.try_stop("a", wait=True)
        stops.append(time.perf_counter() - t)
    out = [
        f"A cold start's parts, one at a time ({args.rounds * 2 + 1} each, medians): time until the worker's port "
        "accepts a connection (it allocates its soft quota first), and supervisord's waited stop.",
        "",
        "| part | median ms | added ms |",
        "|---|---:|---:|",
    ]
    before = None
    for label, xs in rows.items():
        ms = statistics.median(xs) * 1000
        out.append(f"| {label} | {ms:.1f} | {'-' if before is None else f'{ms - before:+.1f}'} |")
        before = ms
    out.append(f"| supervisord's stop of a running worker (waited) | {statistics.median(stops) * 1000:.1f} | - |")
    return "\n".join(out)


PARTS = {
    "throughput": throughput,
    "floor": floor,
    "bodies": big_bodies,
    "cold": cold,
    "cold_parts": cold_parts,
}


if __name__ == "__main__":
    sys.exit(main())
