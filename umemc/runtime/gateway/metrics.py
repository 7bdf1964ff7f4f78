"""/metrics in the Prometheus text format (prometheus-client): counters and histograms of the requests (kept in plain
numbers by the request path, handed over at each scrape), of cold starts and evictions, plus live gauges read from
the scheduler at scrape time (custom collectors, so a scrape always shows the current state)."""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..probes.host import Processes, processes
from ..supervisor import ProcState
from .usage import Usage

if TYPE_CHECKING:
    from .scheduler import Scheduler

# model servers answer in milliseconds (embeddings) to minutes (long generations)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
START_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STATES = tuple(ProcState)


class Metrics:
    def __init__(self, sched: Scheduler):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.cold_starts = Counter(
            "umemc_cold_starts", "Workers started on demand by the gateway.", ["model"], registry=r
        )
        self.cold_start_seconds = Histogram(
            "umemc_cold_start_seconds",
            "From the decision to start to the worker's first healthy answer.",
            ["model"],
            buckets=START_BUCKETS,
            registry=r,
        )
        self.evictions = Counter(
            "umemc_evictions",
            "Workers stopped by the gateway: evict (to make room) or ttl_unload (idle).",
            ["model", "reason"],
            registry=r,
        )
        self.sched = sched
        self.answers = Answers(sched.models)
        r.register(self.answers)
        r.register(_Live(sched))
        self.sched_has_budget = sched.generation.capacity is not None

    def adopt(self, models: dict[str, Any]) -> None:
        """The latency series of models added to a running gateway (a removed model's series stay: counters only
        grow)."""
        for name in models:
            self.answers.latency.series(name)

    def request(self, model: str, code: int, seconds: float, usage: Usage | None = None) -> None:
        a = self.answers
        key = (model, str(code))
        a.requests[key] = a.requests.get(key, 0) + 1
        if model not in a.latency.by_model:  # a request for no model of the stack's: counted, not timed
            return
        a.latency.observe(model, seconds)
        if usage is not None:
            if usage.tokens_in:
                a.tokens[(model, "in")] = a.tokens.get((model, "in"), 0) + usage.tokens_in
            if usage.tokens_out:
                a.tokens[(model, "out")] = a.tokens.get((model, "out"), 0) + usage.tokens_out

    def queue_wait(self, model: str, seconds: float) -> None:
        self.answers.queue_wait.observe(model, seconds)

    def generation_wait(self, model: str, seconds: float) -> None:
        if self.sched_has_budget:
            self.answers.generation_wait.observe(model, seconds)

    def cold_start(self, model: str, seconds: float) -> None:
        self.cold_starts.labels(model).inc()
        self.cold_start_seconds.labels(model).observe(seconds)

    def eviction(self, model: str, reason: str) -> None:
        self.evictions.labels(model, reason).inc()

    def render(self) -> bytes:
        self.sched.ledger.settle()  # every request that ended before the scrape is in it
        return generate_latest(self.registry)


class Buckets:
    """A histogram by model in plain numbers: each series its count per bucket (a value goes in the first bucket
    whose bound it does not exceed, Prometheus's `le`; the last is +Inf) and its sum."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.les = [floatToGoString(b) for b in bounds]  # type: ignore[no-untyped-call]  # as the library writes them
        self.by_model: dict[str, list[float]] = {}  # counts per bucket, then the sum

    def series(self, model: str) -> list[float]:
        counts = self.by_model.get(model)
        if counts is None:
            counts = self.by_model[model] = [0] * (len(self.bounds) + 2)
        return counts

    def observe(self, model: str, seconds: float) -> None:
        counts = self.series(model)
        counts[bisect.bisect_left(self.bounds, seconds)] += 1
        counts[-1] += seconds

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=["model"])
        for model, counts in self.by_model.items():
            cumulative = list(itertools.accumulate(counts[:-1]))
            buckets = list(zip(self.les, cumulative, strict=False))
            family.add_metric([model], buckets + [("+Inf", cumulative[-1])], counts[-1])
        return family


class Answers(Collector):
    """The requests' figures, kept by the request path in plain numbers (a dict update, a bucket's count: on every
    request prometheus-client's locked series cost several times the rest of the accounting) and handed to the
    registry at each scrape."""

    def __init__(self, models: dict[str, Any]):
        self.requests: dict[tuple[str, str], int] = {}  # (model, code)
        self.tokens: dict[tuple[str, str], int] = {}  # (model, in|out)
        self.latency = Buckets(LATENCY_BUCKETS)
        self.queue_wait = Buckets(LATENCY_BUCKETS)
        self.generation_wait = Buckets(LATENCY_BUCKETS)
        for name in models:
            self.latency.series(name)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("umemc_requests", "Requests answered, by model and HTTP status.",
                                       labels=["model", "code"])  # fmt: skip
        for labels, n in self.requests.items():
            requests.add_metric(list(labels), n)
        yield requests
        yield self.latency.family(
            "umemc_request_duration_seconds",
            "Time from request to the end of the response, queueing and cold starts included.",
        )
        yield self.queue_wait.family(
            "umemc_queue_wait_seconds",
            "Time a request waited for a slot of its model (a cold start included), apart from its latency.",
        )
        yield self.generation_wait.family(
            "umemc_generation_wait_seconds",
            "Time a request waited for the stack's generation budget (policy.max_generating), apart from its latency.",
        )
        tokens = CounterMetricFamily("umemc_tokens", "Tokens the workers' answers said they read (in) and generated "
                                     "(out).", labels=["model", "direction"])  # fmt: skip
        for labels, n in self.tokens.items():
            tokens.add_metric(list(labels), n)
        yield tokens


class _Live(Collector):
    def __init__(self, sched: Scheduler):
        self.sched = sched
        self.proc = processes()  # umemc's own processes, for what they hold

    def describe(self) -> list[Metric]:
        return []  # scraped live; nothing to check for name clashes at registration

    def collect(self) -> Iterator[Metric]:
        s = self.sched
        g = {
            name: GaugeMetricFamily(f"umemc_{name}", doc, labels=labels)
            for name, doc, labels in (
                ("model_usage_bytes", "Live memory of the worker (CPU side + GPU side), from the enforcer.", ["model"]),
                ("model_quota_bytes", "The worker's quotas.", ["model", "kind"]),
                ("model_state", "1 for the worker's current supervisord state.", ["model", "state"]),
                ("model_ready", "1 when the worker is running and healthy.", ["model"]),
                ("model_restarts", "Restarts after a crash or a kill (not cold starts), from the enforcer.", ["model"]),
                ("model_in_flight", "Requests in flight.", ["model"]),
                ("model_queue_depth", "Requests waiting for a slot or a cold start.", ["model"]),
                ("model_max_concurrency", "Requests the worker may have in flight.", ["model"]),
                ("model_priority", "Eviction priority (higher survives longer).", ["model"]),
                (
                    "model_tokens_per_second",
                    "Tokens generated per second over the model's last answers that said their tokens.",
                    ["model"],
                ),
            )
        }
        for m in s.models.values():
            g["model_usage_bytes"].add_metric([m.name], m.usage)
            g["model_quota_bytes"].add_metric([m.name, "soft"], m.plan.quota_soft_bytes)
            g["model_quota_bytes"].add_metric([m.name, "hard"], m.plan.quota_hard_bytes)
            for state in STATES:
                g["model_state"].add_metric([m.name, state], 1 if m.state == state else 0)
            g["model_ready"].add_metric([m.name], 1 if m.ready else 0)
            g["model_restarts"].add_metric([m.name], m.restarts)
            g["model_in_flight"].add_metric([m.name], s.slots[m.name].in_flight)
            g["model_queue_depth"].add_metric([m.name], s.slots[m.name].queued)
            g["model_max_concurrency"].add_metric([m.name], m.max_concurrency)
            g["model_priority"].add_metric([m.name], m.plan.priority)
            speed = s.traffic[m.name].tokens_per_s
            if speed is not None:
                g["model_tokens_per_second"].add_metric([m.name], speed)
        yield from g.values()
        ram, gpu = s.admission.committed()
        leases = list(s.book.leases.values())
        yield GaugeMetricFamily("umemc_budget_bytes", "The plan's memory budget.", value=s.budget.ram)
        yield GaugeMetricFamily(
            "umemc_committed_bytes",
            "Budget committed: running or starting workers (max of live usage and hard quota) plus leases.",
            value=ram,
        )
        if s.budget.gpu is not None:
            yield GaugeMetricFamily("umemc_gpu_budget_bytes", "The plan's GPU-window budget.", value=s.budget.gpu)
            yield GaugeMetricFamily("umemc_gpu_committed_bytes", "GPU-window budget committed.", value=gpu)
        yield GaugeMetricFamily("umemc_leases", "Leases granted and not yet released or expired.", value=len(leases))
        yield GaugeMetricFamily("umemc_leased_bytes", "Bytes held by leases.", value=sum(x.ram for x in leases))
        if s.generation.capacity is not None:
            yield GaugeMetricFamily("umemc_generation_max", "policy.max_generating.", value=s.generation.capacity)
            yield GaugeMetricFamily(
                "umemc_generation_in_use", "Generation units held by requests in flight.", value=s.generation.in_use
            )
            yield GaugeMetricFamily(
                "umemc_generation_waiting", "Requests waiting for the generation budget.", value=s.generation.waiting
            )
        yield from _from_events(s)
        yield from _from_enforcer(s, self.proc)
        yield from _heat(s)
        yield GaugeMetricFamily(
            "umemc_pressure",
            "System memory pressure as the enforcer measures it (NaN when its status is stale).",
            value=float("nan") if s.sync.pressure is None else s.sync.pressure,
        )


def _heat(s: Scheduler) -> Iterator[Metric]:
    """The box's heat as the enforcer last read it (umemc.runtime.probes.heat): only what the platform reports."""
    status = s.sync.enforcer
    if status is None:
        return
    if status.psi_some is not None:
        psi = GaugeMetricFamily(
            "umemc_box_memory_stall_ratio",
            "Share of the last 10 s in which some task (or every task: full) stalled on memory (the kernel's PSI).",
            labels=["tasks"],
        )
        psi.add_metric(["some"], status.psi_some)
        psi.add_metric(["full"], status.psi_full or 0.0)
        yield psi
    if status.heat_source in (None, "none"):
        return
    if status.heat_c is not None:
        temp = GaugeMetricFamily(
            "umemc_box_temperature_celsius", "The hottest temperature the platform reports.", labels=["sensor"]
        )
        temp.add_metric([status.heat_sensor or ""], status.heat_c)
        yield temp
    if status.power_w is not None:
        yield GaugeMetricFamily("umemc_box_power_watts", "Power draw the platform reports.", value=status.power_w)
    if status.memory_busy is not None:
        yield GaugeMetricFamily(
            "umemc_box_memory_busy_ratio",
            "Share of the last sample period the memory bus was read or written (the busiest GPU's: nvidia-smi, "
            "amdgpu's memory controller activity).",
            value=status.memory_busy,
        )
    if status.memory_gbps is not None:
        yield GaugeMetricFamily(
            "umemc_box_memory_bandwidth_bytes_per_second",
            "The DRAM's read and write bandwidth the firmware reports (amdgpu APUs' gpu_metrics).",
            value=status.memory_gbps * 1e9,
        )
    yield GaugeMetricFamily(
        "umemc_box_throttling",
        "1 while the box throttles for heat (the GPU driver says so, a sensor is at its limit or throttle_above).",
        value=1 if status.throttling else 0,
    )


def _from_events(s: Scheduler) -> Iterator[Metric]:
    """Counters of what the runtime did this run, from the event log (one grouped query per scrape): the
    enforcer's and the kernel's kills happen outside the gateway, so the log is their one account."""
    kills = CounterMetricFamily(
        "umemc_hard_limit_kills",
        "Workers killed over their hard quota, by the enforcer or the kernel.",
        labels=["model", "by"],
    )
    evictions = CounterMetricFamily(
        "umemc_evictions_by_cause",
        "Workers stopped to make room: by whom (gateway, enforcer) and why (cold start, lease, pressure, ttl).",
        labels=["model", "by", "cause"],
    )
    give_ups = CounterMetricFamily(
        "umemc_give_ups", "Workers left stopped after repeated hard-limit kills.", labels=["model"]
    )
    failed = CounterMetricFamily("umemc_cold_start_failures", "Cold starts that failed.", labels=["model"])
    drift = CounterMetricFamily(
        "umemc_estimate_drift_events", "Settled workers found more than 5% over their estimate.", labels=["model"]
    )
    leaks = CounterMetricFamily("umemc_leaks_suspected", "Steady climbs reported as suspected leaks.", labels=["model"])
    for kind, model, cause, n in s.events.tallies(s.run_start):
        name = model or ""
        by, _, why = cause.partition("/")
        if kind == "hard_limit_kill":
            kills.add_metric([name, by or "enforcer"], n)
        elif kind in ("evict", "ttl_unload"):
            evictions.add_metric([name, by or "gateway", "ttl" if kind == "ttl_unload" else why or "make room"], n)
        elif kind == "give_up":
            give_ups.add_metric([name], n)
        elif kind == "cold_start_failed":
            failed.add_metric([name], n)
        elif kind == "estimate_drift":
            drift.add_metric([name], n)
        elif kind == "leak_suspected":
            leaks.add_metric([name], n)
    yield from (kills, evictions, give_ups, failed, drift, leaks)


def _from_enforcer(s: Scheduler, proc: Processes) -> Iterator[Metric]:
    """Per-model gauges from the enforcer's status (drift ratio, leak rate), and umemc's own memory."""
    drift = GaugeMetricFamily(
        "umemc_model_estimate_drift_ratio", "Measured / estimate - 1, once the worker has settled.", labels=["model"]
    )
    leak = GaugeMetricFamily(
        "umemc_model_leak_rate_bytes_per_second", "The worker's usage trend over its last minute.", labels=["model"]
    )
    own = GaugeMetricFamily(
        "umemc_process_resident_bytes", "Resident memory of umemc's own processes.", labels=["process"]
    )
    unused = GaugeMetricFamily(
        "umemc_model_allocator_unused_bytes",
        "What a torch worker's caching allocator holds beyond what its tensors use (fragmentation and cache).",
        labels=["model"],
    )
    beyond = GaugeMetricFamily(
        "umemc_model_beyond_buffers_bytes",
        "What a llama.cpp worker's processes hold beyond the host buffers its log states and its overhead (drift).",
        labels=["model"],
    )
    st = s.sync.enforcer
    if st is not None:
        for name, w in st.models.items():
            if w.beyond_buffers_bytes is not None:
                beyond.add_metric([name], w.beyond_buffers_bytes)
            if w.drift is not None:
                drift.add_metric([name], w.drift)
            if w.leak_rate_bytes_per_s is not None:
                leak.add_metric([name], w.leak_rate_bytes_per_s)
            if w.allocator_unused_bytes is not None:
                unused.add_metric([name], w.allocator_unused_bytes)
        enforcer = proc.memory(st.pid)  # 0 once it has gone: left out
        if enforcer:
            own.add_metric(["enforcer"], enforcer)
    own.add_metric(["gateway"], proc.memory(os.getpid()))
    yield from (drift, leak, own, unused, beyond)
    yield from _trends(st)


def _trends(st: Any) -> Iterator[Metric]:
    """The trends over the leak window (NaN until the enforcer has a minute of samples, or while the machine's
    memory does not grow): a slow leak of the whole box or of umemc itself, and how long until it runs out."""

    def value(name: str) -> float:
        got = None if st is None else getattr(st, name)
        return float("nan") if got is None else float(got)

    yield GaugeMetricFamily(
        "umemc_box_memory_trend_bytes_per_second",
        "The machine's used memory trend over the leak window (least squares).",
        value=value("box_trend_bytes_per_s"),
    )
    yield GaugeMetricFamily(
        "umemc_own_memory_trend_bytes_per_second",
        "umemc's own processes' (supervisord, enforcer, gateway) resident memory trend over the leak window.",
        value=value("own_trend_bytes_per_s"),
    )
    yield GaugeMetricFamily(
        "umemc_memory_exhaustion_seconds",
        "Seconds until MemAvailable is gone at the machine's trend (NaN while it does not grow).",
        value=value("exhaustion_s"),
    )
