"""A model's process as the gateway drives it: one owner for what makes a model ready and what stops it (as
llama-swap's process is): a start (the victims drained, stopped behind a gate while it starts, its health awaited,
its KV slots restored), where a start stands in words, a stop (its KV slots saved first, the reason said), and a
client's keep_alive, which lasts while it runs. The scheduler decides (admission under its lock, the pump, leases,
pressure) and asks this part to act; it is given the scheduler's parts (core.Parts), never the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ...budget.policy import Decision
from ...names import RUN_MARK, run_mark
from ...records import gate_text, write_atomic
from .. import pagecache
from ..members import same_process
from ..probes import sockets
from ..probes.host import processes
from ..supervisor import STARTED
from . import kvslots
from .core import Evicted
from .lifecycle import Phase
from .model import ANSWERING, CONNECT_ERRORS, Model, ProcState, Refused
from .progress import load_step, log_size

if TYPE_CHECKING:
    from .core import Parts

HEALTH_POLL_S = 0.1
# a starting worker is asked every 2 ms in its first half second (a refused connection costs ~0.1 ms of the loop),
# every 10 ms to the end of its first second, then every HEALTH_POLL_S (a model loading for minutes)
FIRST_POLLS = ((0.5, 0.002), (1.0, 0.01))
# The runs of a worker one start waits for: supervisord restarts a worker that dies after its startsecs for good
# (autorestart), which one that fails later in its own start (a refused setting, a model it cannot load) does at
# every try; its third death ends the start, rather than start_timeout
START_RUNS = 3
EXITED_GRACE_S = 3.0  # supervisord restarts an exited autorestart program at once
# how long a gated start waits for the processes of its victims (their KV slots saved, their stop), after which its
# wrapper refuses to start the worker beside them; the gateway removes the gate long before, unless it died
GATE_S = 600.0
# a stop's event kind, as the reason of its change of phase
STOPPED_FOR = {
    "evict": "evicted",
    "ttl_unload": "idle past its ttl",
    "unload": "unloaded on request",
    "defragment": "restarted for its fragmentation",
}


def poll_interval(waited: float) -> float:
    """How long a start waits before it asks the worker again, after `waited` seconds."""
    return next((every for until, every in FIRST_POLLS if waited < until), HEALTH_POLL_S)


def _remove_tree(path: Path) -> None:
    """Whatever is at `path` in umemc's own state dir goes, a directory with all it holds too (never followed: a
    link is removed, not what it points to)."""
    import shutil

    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


class Process:
    def __init__(self, parts: Parts):
        self.parts = parts
        self.metrics: Any = None  # the HTTP side's metrics, once it has them (cold starts, evictions)
        # a restarted gateway's models: how long their last start on demand took (the event log's cold_start)
        for name, event in parts.events.latest(parts.events.last_id("up"), "cold_start").items():
            if name in parts.models and isinstance(event.detail.get("seconds"), (int, float)):
                parts.models[name].last_cold_start_s = event.detail["seconds"]

    def ensure_ready(self, m: Model) -> None:
        """What a model that requests wait for needs, read from where it stands (llama-swap's EnsureReady):
        nothing while it is ready, starting or being stopped (it is started afresh once down); where supervisord
        runs it already (a restart after a crash, or started outside the gateway), its start awaited; else a start,
        once the admission admits it (evicting what the policy names)."""
        if m.ready or m.starting is not None or m.evicting:
            return
        if m.live:
            self.begin_start(m, Decision(fits=True))
            return
        decision = self.parts.admission.decide_model(m)
        if decision.fits:
            self.launch(m, decision)

    def launch(self, m: Model, decision: Decision) -> None:
        """Start an admitted model: its idle victims marked for stopping, its busy ones draining, then the start."""
        for v in decision.evict:
            self.parts.models[v].life.to(Phase.STOPPING, f"evicted for {m.name}")
        for v in decision.drain:
            self.drain(self.parts.models[v], f"evicted for {m.name} once its requests are done")
        self.begin_start(m, decision)

    def drain(self, m: Model, why: str) -> None:
        """It serves the requests queued before now, takes none after."""
        m.life.to(Phase.DRAINING, why)
        self.parts.slots.drain(m)

    def asked(self, m: Model) -> None:
        """A person asked for it: an eviction it had is over (housekeeping's restore no longer waits for room)."""
        m.evicted = False

    def begin_start(self, m: Model, decision: Decision) -> None:
        m.life.to(Phase.STARTING)
        m.draining_for, m.victims = decision.drain, decision.victims
        m.log_mark = log_size(self.parts.run.log(m.name))
        m.starting = asyncio.create_task(self._start(m, decision))

    def stage(self, m: Model) -> str:
        """Where a start stands, in words (what a waiting streamed request is told): the victims it waits for,
        the worker starting, its load as the runtime says it, ready."""
        if m.ready:
            return "ready"
        draining = [v for v in m.draining_for if self.parts.models[v].life.phase is Phase.DRAINING]
        if draining:
            return f"waiting for {', '.join(draining)} to finish their requests"
        stopping = [v for v in m.victims if self.parts.models[v].live]
        if stopping:
            return f"evicting {', '.join(stopping)} to make room"
        if m.starting is None:
            return "queued"
        if m.state not in ANSWERING:
            return "starting"
        step = load_step(self.parts.run.log(m.name), m.log_mark) or "starting"
        weights = m.plan.estimate_parts.weights_bytes
        if step == "loading weights" and weights and m.usage:  # the enforcer's figure: what of them is in memory
            return f"loading weights: {min(m.usage, weights) / 2**20:.0f} of {weights / 2**20:.0f} MiB in memory"
        return step

    async def _start(self, m: Model, decision: Decision) -> None:
        t0 = time.monotonic()
        try:
            if decision.drain and not await self.parts.slots.wait_drained(
                decision.drain, self.parts.gw.drain_timeout_s
            ):
                self.parts.undrainable.update(decision.drain)
                self.parts.events.add(
                    "drain_timeout", m.name, victims=decision.drain, drain_timeout_s=self.parts.gw.drain_timeout_s
                )
                return
            await self._evict_and_start(m, decision.victims)
            await self._release_cache(m, others=True)  # the victims' files, and every stopped model's
            await self._wait_healthy(m)
            await self._release_cache(m, others=False)  # its own, its weights in the GPU's buffers now
            if m.saved_slots and m.port is not None:
                prompt = self.parts.traffic[m.name].prompt_speed
                await kvslots.restore(m.port, m.name, m.saved_slots, self.parts.events, prompt)
                m.saved_slots = []
            self._ready(m, decision, time.monotonic() - t0)
        except Refused as exc:
            m.failure = exc.message
            private = {"detail": exc.private} if exc.private else {}
            self.parts.events.add("cold_start_failed", m.name, reason=exc.message, **private)
            self.parts.slots.fail_waiters(m, exc)
        except CONNECT_ERRORS as exc:
            m.failure = f"supervisord did not answer: {exc}"
            self.parts.slots.fail_waiters(m, Refused(f"model {m.name} could not start: {m.failure}", "start_failed", 5))
        finally:
            for v in decision.victims:  # a drain that timed out, a start abandoned: the victims serve on
                victim = self.parts.models[v]
                if victim.life.phase in (Phase.DRAINING, Phase.STOPPING):
                    victim.life.to(Phase.READY, "its eviction was abandoned")
                self.parts.slots.undrain(victim)
            if m.life.phase is Phase.STARTING:
                m.life.to(Phase.DOWN, m.failure or "the start was abandoned")
            m.starting, m.draining_for, m.victims = None, [], []
            self.parts.slots.dispatch(m)
            self.parts.kick()

    async def _release_cache(self, m: Model, *, others: bool) -> None:
        """Where the GPU allocates from system memory through its driver (nvidia-unified), the cached pages of model
        files nobody maps are released (umemc.runtime.pagecache): the kernel's reclaim would not give them to a CUDA
        allocation in time. `others`: every model's files but this one's (before its load goes far); else this
        one's. Said in a page_cache_released event where any were."""
        if self.parts.platform_kind != "nvidia-unified":
            return
        files = pagecache.model_files(x.plan for x in self.parts.models.values() if (x is not m) == others)
        if not files:
            return
        freed = await asyncio.to_thread(pagecache.release, files)
        if freed:
            self.parts.events.add(
                "page_cache_released",
                m.name,
                bytes=freed,
                files=[str(f) for f in files],
                before="load" if others else "serving",
            )

    def _ready(self, m: Model, decision: Decision, seconds: float) -> None:
        m.life.to(Phase.READY)
        m.failure, m.evicted = None, False
        self.parts.slots.touch(m)
        self.parts.sync.mark_healthy(m)
        m.cold_starts += 1
        m.last_cold_start_s = round(seconds, 3)
        waiting = self.parts.slots[m.name].queued
        self.parts.events.add(
            "cold_start", m.name, seconds=m.last_cold_start_s, evicted=decision.victims, waiting=waiting
        )
        if self.metrics is not None:
            self.metrics.cold_start(m.name, m.last_cold_start_s)

    async def _evict_and_start(self, m: Model, victims: list[str]) -> None:
        """Stop the victims and start the model. Where every victim's process is on record (the wrapper's
        `pid starttime`, naming a live process: a record the wrapper could not rewrite names an older one), the
        model starts while they stop, behind a gate (RunDir.gate): its exec wrapper starts,
        enters its cgroup and waits for their processes to exit before the worker runs, so the memory is never
        held twice and the wrapper's own start (~20-50 ms) is off the cold start's path. The gate goes once they
        are stopped; when a stop fails, the model is stopped first (the gate stays if it cannot be)."""
        stops = [
            self.stop(
                self.parts.models[v],
                "evict",
                for_model=m.name,
                **self.parts.admission.eviction_detail(self.parts.models[v], m.plan.priority),
            )
            for v in victims
        ]
        gate = self._open_gate(m, victims)
        if gate is None:  # one after the other
            await asyncio.gather(*stops)
            await self._ensure_started(m)
            return
        results = await asyncio.gather(*stops, self._ensure_started(m), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            if await asyncio.to_thread(self.parts.supervisor.try_stop, m.name, wait=True) not in (None, "not running"):
                raise failed  # it may still run: its wrapper must keep waiting at the gate
            self.parts.sync.stopped(m)
        with contextlib.suppress(OSError):
            gate.unlink(missing_ok=True)
        if failed is not None:
            raise failed

    def _open_gate(self, m: Model, victims: list[str]) -> Path | None:
        """The gate the model's start waits at, written; None where there is to be none: no victims, a victim's
        record missing or naming a gone process, or a gate that cannot be written (a full disk). A gate a lost
        gateway left goes then: it must not hold this start."""
        gate = self.parts.run.gate(m.name)
        if gate.is_symlink() or (gate.exists() and not gate.is_file()):
            _remove_tree(gate)  # a directory (or any non-file) there would keep the wrapper from ever passing
        records = [self.parts.run.record(v) for v in victims]
        live = [r for r in records if r is not None and same_process(r)]
        if victims and len(live) == len(victims):
            try:
                gate.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                write_atomic(gate, gate_text(time.time() + GATE_S, [(r.pid, r.start, r.name) for r in live]))
                return gate
            except OSError:
                pass
        with contextlib.suppress(OSError):
            gate.unlink(missing_ok=True)
        return None

    async def processes(self) -> dict[str, dict[str, Any]]:
        """supervisord's table, asked now (a start or a stop in progress); the next round asks it afresh too."""
        self.parts.sync.look_again()
        return await asyncio.to_thread(self.parts.supervisor.processes)

    async def _ensure_started(self, m: Model) -> None:
        """Start it unless supervisord already runs it; one being stopped is started once it is down."""
        deadline = time.monotonic() + 60
        while m.state is ProcState.STOPPING and time.monotonic() < deadline:
            await asyncio.sleep(HEALTH_POLL_S)
            self.parts.sync.observe(m, (await self.processes()).get(m.name))
        if m.state not in STARTED:
            # spawns now (STARTING on return), or supervisord's own restart after a crash already does
            await asyncio.to_thread(self.parts.supervisor.ensure_started, m.name)
            self.parts.sync.observe(m, {"statename": ProcState.STARTING})
            self.parts.sync.look_again()

    async def _wait_healthy(self, m: Model) -> None:
        """Until supervisord runs it and its health URL answers. The worker is asked often in its first second (a
        small worker answers within tens of ms; a fixed 100 ms poll was most of its cold start: a refused
        connection costs next to nothing), then every HEALTH_POLL_S (a model loading for a minute); supervisord,
        whose answer is a process table over XML-RPC, every HEALTH_POLL_S throughout (asked every 10 ms it kept a
        core of a 2-core machine busy while the wrapper and the worker were starting)."""
        began = time.monotonic()
        deadline = began + self.parts.gw.start_timeout_s
        exited_since: float | None = None
        state, asked = m.state, -HEALTH_POLL_S
        runs: set[int] = set()  # the worker's processes seen in this start: one that dies after startsecs comes back
        while time.monotonic() < deadline:
            if time.monotonic() - asked >= HEALTH_POLL_S or state not in ANSWERING:
                info = (await self.processes()).get(m.name, {})
                state, asked = self.parts.sync.observe(m, info), time.monotonic()
                if info.get("pid") and state is ProcState.RUNNING:  # past startsecs (a quick death is BACKOFF's)
                    runs.add(int(info["pid"]))
                if len(runs) > START_RUNS:  # a worker that dies at every start (vLLM refusing its flags after 45 s)
                    raise Refused(
                        f"worker {m.name} failed to start: it exited {len(runs) - 1} times before it answered; "
                        f"`umemc logs {m.name}` shows why",
                        "start_failed",
                        10,
                        private=f"log: {self.parts.run.log(m.name)}",
                    )
                # EXITED is where a crashed worker waits for supervisord's autorestart (a moment): not a failure
                # unless it stays there
                exited_since = (exited_since or time.monotonic()) if state is ProcState.EXITED else None
                lingering = exited_since is not None and time.monotonic() - exited_since > EXITED_GRACE_S
                # BACKOFF after "Exited too quickly" is supervisord retrying (startretries): wait for it; another
                # spawn error (a missing command) does not heal
                retrying = "Exited too quickly" in str(info.get("spawnerr") or "")
                failed = (
                    state in (ProcState.FATAL, ProcState.STOPPED, ProcState.UNKNOWN)
                    or lingering
                    or (state is ProcState.BACKOFF and bool(info.get("spawnerr")) and not retrying)
                )
                if failed:  # supervisord's spawn error may name paths: the event log has it, the client not
                    raise Refused(
                        f"worker {m.name} failed to start: it is {state}; `umemc logs {m.name}` shows why",
                        "start_failed",
                        10,
                        private=f"{info.get('spawnerr') or ''} (log: {self.parts.run.log(m.name)})".lstrip(),
                    )
            if state in ANSWERING and self.parts.sync.probe is not None and await self.parts.sync.probe(m):
                await self._own_answer(m, info)
                return
            await asyncio.sleep(poll_interval(time.monotonic() - began))
        raise Refused(
            f"worker {m.name} did not become healthy within {self.parts.gw.start_timeout_s:g} s", "start_timeout", 10
        )

    async def _own_answer(self, m: Model, info: dict[str, Any]) -> None:
        """The health answer came from the worker: its process (or one it started) listens on its port. A port
        taken by another program between `up` and this start (a cold model's port is free when `up` checks it,
        not reserved) would otherwise have the gateway relay this model's requests to a stranger."""
        pid, port = info.get("pid"), m.port
        if not pid or port is None:
            return
        mark = run_mark(self.parts.run.state)
        if await asyncio.to_thread(listens_on, int(pid), port, mark=mark, model=m.name) is not False:
            return
        raise Refused(
            f"worker {m.name} could not listen on its port {port}: another program answers there; stop it "
            "(ss -ltnp) or give the model another port",
            "start_failed",
            10,
        )

    async def stop(self, m: Model, why: str, evicted: Evicted = Evicted.RESTORE, **detail: Any) -> None:
        """Stop a worker (eviction, TTL unload, a restart for fragmentation). A hot worker evicted to admit another
        (or restarted) comes back when it fits again (Evicted.RESTORE); one evicted for pressure stays down, or it
        would oscillate. A
        llama-server that was serving has its slots' KV saved first (umemc.runtime.gateway.kvslots)."""
        if m.state in ANSWERING and m.plan.kv_slots and m.port is not None:  # (already marked STOPPING)
            m.saved_slots = await kvslots.save(m.port, m.name, m.plan.kv_slots, self.parts.events)
        # the reason it was marked STOPPING with (evicted for X), else the stop's own
        m.life.to(Phase.STOPPING, m.life.why if m.life.phase is Phase.STOPPING else STOPPED_FOR.get(why, why))
        try:
            usage = m.usage
            failed = await asyncio.to_thread(self.parts.supervisor.try_stop, m.name, wait=True)
            if failed is not None and failed != "not running":
                self.parts.events.add(f"{why}_failed", m.name, by="gateway", reason=failed, **detail)
                raise Refused(f"could not stop {m.name} to make room: {failed}", "stop_failed", 5)
            m.life.to(Phase.DOWN, m.life.why)
            self.parts.sync.stopped(m)
            m.evicted = why in ("evict", "defragment") and evicted is Evicted.RESTORE
            m.keep_alive_s = None  # a client's keep_alive lasts while the model runs
            self.parts.events.add(why, m.name, by="gateway", usage_bytes=usage, priority=m.plan.priority, **detail)
            if self.metrics is not None:
                self.metrics.eviction(m.name, why)
        finally:
            if m.life.phase is Phase.STOPPING:  # the stop failed: it still runs
                m.life.to(Phase.READY, "the stop failed")
            self.parts.kick()  # requests that arrived for it meanwhile start it again

    def keep_alive(self, m: Model, seconds: float | None) -> None:
        """A client's keep_alive, as Ollama means it: how long the model stays loaded once idle (math.inf: until
        evicted, 0: unloaded as soon as it is idle); None leaves what was asked before. It holds until the model
        stops. It never shields a model: admission, priority and pressure treat it as before."""
        if seconds is not None:
            m.keep_alive_s = seconds


def listens_on(pid: int, port: int, *, mark: str, model: str) -> bool | None:
    """Whether the model's worker listens on TCP `port`: the process `pid` or one of its descendants, or a process
    that left the tree (a double-forked daemon) but carries the run's mark for this model (UMEMC_RUN, UMEMC_MODEL,
    set by the exec wrapper and inherited). None where it cannot be told (the process gone, sockets not ours to
    read). On Linux the listening sockets come from the kernel's socket diagnostics (umemc.runtime.probes.sockets,
    ~0.05 ms: this is on a cold start's path); elsewhere from psutil."""
    inodes = sockets.listening(port)
    if inodes is None:
        return _listens_on_psutil(pid, port, mark=mark, model=model)
    try:
        if sockets.holds(pid, inodes):  # the worker's own process: llama-server, vLLM, a command
            return True
        if not inodes:  # it lives, and nothing listens there (any more)
            return False
        tree = {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except (OSError, psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    procs = processes()
    for other in sorted(tree) + [x for x in procs.pids() if x != pid and x not in tree]:
        try:
            held = sockets.holds(other, inodes)
        except OSError:  # gone, or not ours to read
            continue
        if held and (other in tree or _marked(procs.run_environ(other), mark, model)):
            return True
    return False


def _marked(env: dict[str, str], mark: str, model: str) -> bool:
    return env.get(RUN_MARK) == mark and env.get("UMEMC_MODEL") == model


def _listens_on_psutil(pid: int, port: int, *, mark: str, model: str) -> bool | None:
    def listening(c: Any) -> bool:
        return bool(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port)

    try:
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            conns = proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else proc.connections()
            if any(listening(c) for c in conns):
                return True
        holders = {c.pid for c in psutil.net_connections(kind="inet") if listening(c) and c.pid}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    procs = processes()
    return any(_marked(procs.run_environ(holder), mark, model) for holder in holders)
