"""The runtime's contract: every file one umemc process writes and another reads, as typed, versioned
documents (umemc.document). Writers build them; readers load them with `read`, so a renamed field is
a type error, not a KeyError at 3 a.m., and a file from another umemc version is a clear message.

    plan.json                the bundle's compiled plan: what `umemc up`, the enforcer and the gateway run
    state/enforcer.json      the enforcer's live figures (every second)
    state/gateway.json       the gateway's requests, worker health and leases (every 0.5 s)
    state/workers/<m>.json   what a `umemc.worker` worker reserved in-process
    state/pids/<name>        `pid starttime` (text; the exec wrapper)
    state/cgroups/<name>     `version path pid` (text; the exec wrapper)
    state/gates/<model>      `until T`, then `pid starttime name` lines (text; the gateway, read by the wrapper)

Near the bottom of the package: it imports the document base (umemc.document) and the policy's Lease."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, NamedTuple

from .budget.policy import Lease
from .document import ContractError, Doc, Document, dump, parse, read, read_optional, values
from .names import sha256_hex
from .records import read_file

__all__ = [
    "CgroupRecord", "ContractError", "Doc", "Document", "PidRecord", "dump", "parse", "read", "read_optional", "values"
]  # fmt: skip

PLAN_VERSION = 1
STATUS_VERSION = 1


# -- the exec wrapper's text records, read (it writes their lines with umemc.records alone) ---------------------
class PidRecord(NamedTuple):
    """state/pids/<name>: `pid starttime` (field 22 of /proc/PID/stat: with the pid, one process)."""

    name: str
    pid: int
    start: int

    @classmethod
    def parse(cls, name: str, text: str) -> PidRecord:
        pid, start = text.split()[:2]
        return cls(name, int(pid), int(start))


class CgroupRecord(NamedTuple):
    """state/cgroups/<name>: `version path pid` of the memory cgroup the wrapper put the process in."""

    version: int
    path: Path
    pid: int

    @classmethod
    def parse(cls, text: str) -> CgroupRecord:
        version, path, pid = text.split()[:3]
        return cls(int(version), Path(path), int(pid))


# -- plan.json ------------------------------------------------------------------------------------
class PlatformDoc(Document):
    preset: str | None
    kind: str
    memory_bytes: int
    os_reserve_bytes: int
    gpu_window_bytes: int | None
    cpu_cores: int | None
    uma_carveout_bytes: int | None = None  # amd-apu: VRAM the BIOS carves out of RAM (the stack's uma_carveout)


class CapacityDoc(Document):
    usable_bytes: int
    budget_bytes: int
    gpu_budget_bytes: int | None
    hot_total_bytes: int
    hot_gpu_total_bytes: int
    fits: bool


class PolicyDoc(Document):
    safety_margin: float
    quota_headroom: float
    sample_interval_s: float
    load_below: float
    evict_above: float
    hsa_enable_sdma: bool
    kernel_enforcement: Literal["auto", "off"]
    leak_threshold_bytes: int
    leak_window_s: float
    max_kills: int
    kill_window_s: float
    # added in plan version 1's lifetime: defaults keep plans written before them readable
    max_generating: int | None = None
    max_generating_throttled: int | None = None  # while the box throttles for heat
    restart_fragmented_above: float | None = None  # a worker's allocator cache beyond its tensors, share of hard
    throttle_above_c: float | None = None  # a temperature that counts as throttling


class GatewayDoc(Document, kw_only=True):
    host: str
    port: int
    token_env: str | None
    queue: int
    queue_timeout_s: float
    start_timeout_s: float
    drain_timeout_s: float
    # added in plan version 1's lifetime: defaults keep plans written before them readable
    max_body_bytes: int = 32 * 1024 * 1024
    header_timeout_s: float = 15.0
    body_timeout_s: float = 60.0
    upstream_timeout_s: float = 600.0
    health_interval_s: float = 5.0
    memory_bytes: int = 512 * 1024 * 1024
    loading_progress: str = "comment"  # comment | reasoning | off
    capture: int = 0  # the latest requests kept for debugging (0: none)
    capture_bytes: int = 4096  # of each body
    argv: list[str]


class SupervisorDoc(Document):
    config: str
    socket: str  # as the config spells it: expanded from UMEMC_SUPERVISOR_SOCKET (runtime.rundir.RunDir.socket)
    state: str


class PartsDoc(Document):
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    overhead_bytes: int


class ModelDoc(Document):
    program: str
    runtime: str
    mode: Literal["hot", "cold"]
    priority: int
    model_file: str | None
    mmproj_file: str | None
    port: int | None
    health: str | None
    argv: list[str]
    wrap: list[str]
    env: dict[str, str]
    cwd: str | None
    estimate_bytes: int
    estimate_source: str
    estimate_parts: PartsDoc
    quota_soft_bytes: int
    quota_hard_bytes: int
    gpu_bytes: int
    gpu_quota_hard_bytes: int
    max_concurrency: int
    aliases: list[str]
    ttl_s: float | None
    mlock: bool
    # added in plan version 1's lifetime: defaults keep plans written before them readable
    needs_model_file: bool = False  # the runtime cannot start without one (llama.cpp, whisper.cpp)
    generation_weight: float = 1.0
    kv_slots: int = 0  # llama-server: slots whose KV the gateway saves before an eviction (0: none)
    kv_bytes: int = 0  # the KV cache, what those saves may take on disk at most
    pinned_flags: list[str] = []  # flags the runtime's --help must list (preflight: too old a runtime?)
    help_argv: list[str] = []  # how to ask the runtime for its --help
    reports_buffers: bool = False  # llama.cpp: its log states its buffer sizes (the enforcer's drift check)
    hub_files: list[str] = []  # keys whose file is on the Hub (hf, mmproj_hf): `umemc pull` fetches them
    kind: str = "other"  # what it serves (chat, embeddings, audio, image, other): the gateway's /v1/models
    # what clients are told of the model (Ollama's /api/show and /api/tags): its architecture and file type where
    # the estimate knew them, and the context each sequence gets
    arch: str | None = None
    quant: str | None = None
    context: int | None = None
    serves: list[str] = []  # names it shares with other models: whichever is loaded answers (the gateway)
    # a model split across nodes (llama.cpp RPC): on its main node, its helpers' RPC servers (HOST:PORT, in
    # --rpc order); on a helper node, the RPC server holding a part is `part_of` that model (served by none)
    rpc: list[str] = []
    part_of: str | None = None

    @property
    def cold(self) -> bool:
        return self.mode == "cold"


class PeerDoc(Document):
    """A model another node of the stack serves: where its gateway is (a request for it is sent on there)."""

    node: str
    url: str  # HOST:PORT of that node's gateway
    aliases: list[str] = []


class PlanDoc(Document, kw_only=True):
    format: Literal["umemc-plan"] = "umemc-plan"
    version: int = PLAN_VERSION
    generated_by: str
    stack: str
    platform: PlatformDoc
    capacity: CapacityDoc
    policy: PolicyDoc
    gateway: GatewayDoc | None
    supervisor: SupervisorDoc
    memlock: bool
    simulate: bool
    enforcer: list[str]
    models: dict[str, ModelDoc]
    scale: float = 1.0  # a scaled rehearsal (`up --simulate --scale F`): every quota and capacity times F
    stack_file: str | None = None  # the stack the bundle was built from (what preflight's fixes name)
    node: str | None = None  # a stack of several nodes: the node this bundle is
    peers: dict[str, PeerDoc] = {}  # a stack of several nodes: the models the other nodes serve

    def frame(self) -> dict[str, Any]:
        """What a running gateway and enforcer cannot take on in place (everything but the models and the hot
        totals they sum to): two plans with the same frame differ only in models, which `umemc up` on a running
        stack hands to them without a restart."""
        doc = values(self)
        doc.pop("models")
        for derived in ("hot_total_bytes", "hot_gpu_total_bytes", "fits"):
            doc["capacity"].pop(derived)
        return doc


def read_plan(path: Path) -> tuple[PlanDoc, str]:
    """The plan and its digest (the SHA-256 of its bytes, read once): the gateway and the enforcer say in their
    state files which plan they run, and `umemc up` on a running stack waits for them to say the new one."""
    try:
        text = read_file(path)
    except OSError as exc:
        raise ContractError(f"{path}: cannot read: {exc.strerror}") from None
    return parse(PlanDoc, text, path), sha256_hex(text)


# -- live state -----------------------------------------------------------------------------------
class WorkerStatus(Document):
    pid: int | None
    rss_bytes: int  # the CPU side its quota is held to: its cgroup's charge where it has one, else resident
    gpu_bytes: int
    peak_bytes: int
    restarts: int
    started: float | None
    last_event: str | None
    given_up: bool
    drift: float | None
    reserved_bytes: int
    # added in status version 1's lifetime: defaults keep older status files readable
    leak_rate_bytes_per_s: float | None = None  # the usage trend over the samples kept (None: too few yet)
    allowance_bytes: int = 0  # what live leases that name it add to its quotas (ComfyUI's workflow models)
    swapped_bytes: int | None = None  # what of it is in swap, where the platform tells per process (Linux)
    enforced_by: str | None = None  # "cgroup v1" / "cgroup v2" (the kernel and the enforcer) or "enforcer"
    resident_bytes: int | None = None  # its process tree's resident memory, as `ps` shows it
    # its caching allocator's hold beyond what tensors use (reserved - allocated), where it reports one (torch)
    allocator_unused_bytes: int | None = None
    # llama.cpp: what its process tree holds beyond the host buffers its log states and the plan's overhead
    beyond_buffers_bytes: int | None = None
    # NVIDIA: whether the driver gives a per-process GPU figure for its processes (False: gpu_bytes is not the truth,
    # e.g. nvidia-smi inside a container, or a Jetson); None where GPU memory is read otherwise
    gpu_visible: bool | None = None


class EnforcerStatus(Document, kw_only=True):
    format: Literal["umemc-enforcer-status"] = "umemc-enforcer-status"
    version: int = STATUS_VERSION
    time: float
    pid: int
    pressure: float
    events_error: str | None
    events_moved_to: str | None
    models: dict[str, WorkerStatus]
    # added in status version 1's lifetime (older files lack them): the trends over the leak window
    box_trend_bytes_per_s: float | None = None  # the machine's used memory (usable - MemAvailable)
    own_bytes: int | None = None  # umemc's own processes (supervisord, enforcer, gateway), resident
    own_trend_bytes_per_s: float | None = None
    exhaustion_s: float | None = None  # MemAvailable / the machine's trend, while it grows
    platform: str | None = None  # linux | darwin: which probes sample (umemc.runtime.probes.host)
    plan_sha256: str | None = None  # the plan it enforces (contract.read_plan)
    memory_figure: str | None = None  # rss | phys_footprint: what a worker's CPU-side bytes are
    swap_used_bytes: int | None = None
    swap_grown_bytes: int | None = None  # since the enforcer started
    pressure_level: str | None = None  # the OS's own (macOS: normal | warn | critical)
    gpu_limit_bytes: int | None = None  # the GPU's working-set limit a runtime reported (Metal)
    # heat (umemc.runtime.probes.heat): the hottest sensor, the power draw, and why the box throttles (None: it does
    # not); heat_source none where the platform reports nothing
    heat_c: float | None = None
    heat_sensor: str | None = None
    power_w: float | None = None
    throttling: str | None = None
    heat_source: str | None = None
    memory_busy: float | None = None  # the memory bus's activity, 0-1, where a driver reports it (nvidia-smi, amdgpu)
    memory_gbps: float | None = None  # the DRAM's read + write GB/s, where the firmware reports it (amdgpu APUs)
    # the kernel's memory pressure (/proc/pressure/memory, 0-1 of wall time over the last 10 s): some task stalled on
    # memory, every task did; None where the kernel has no PSI
    psi_some: float | None = None
    psi_full: float | None = None
    thermal_state: str | None = None  # macOS's thermal pressure (nominal, fair, serious, critical)


class GatewayModel(Document):
    in_flight: int
    queued: int
    ready: bool
    starting: bool
    health: Literal["ok", "unhealthy"]
    unhealthy: str | None
    tokens_per_s: float | None = None  # added in version 1's lifetime: over its last answers that said their tokens


class LeaseDoc(Document):
    id: str
    holder: str
    bytes: int
    gpu_bytes: int
    priority: int
    model: str | None
    expires: float
    expires_in_s: float
    worker: str | None = None  # the worker whose allowance it raises (absent in files of older gateways)

    def lease(self) -> Lease:
        return Lease(
            self.id, self.holder, self.bytes, self.gpu_bytes, self.priority, self.expires, self.model, self.worker
        )


class GenerationDoc(Document):
    """The stack's generation budget (policy.max_generating): units in flight and requests waiting."""

    max: int | None
    in_use: float
    waiting: int
    throttling: str | None = None  # why the budget is lowered now (the box throttles for heat)


class GatewayState(Document, kw_only=True):
    format: Literal["umemc-gateway-state"] = "umemc-gateway-state"
    version: int = STATUS_VERSION
    time: float
    pid: int
    supervisord_pid: int | None
    models: dict[str, GatewayModel]
    leases: list[LeaseDoc]
    generation: GenerationDoc | None = None  # added in version 1's lifetime: older files lack it
    plan_sha256: str | None = None  # the plan it runs (contract.read_plan); added in version 1's lifetime


class Reservation(Document):
    what: str
    bytes: int


class AllocatorFigures(Document):
    """A torch worker's caching allocator as it reports itself (umemc.worker.allocator): what it holds from the
    device (reserved), what tensors use of it (allocated), and the free pieces of split blocks (inactive split);
    reserved - allocated is what fragmentation and the cache hold."""

    device: str  # cuda (ROCm too) | mps
    reserved_bytes: int
    allocated_bytes: int
    inactive_split_bytes: int | None


class WorkerReport(Document, kw_only=True):
    format: Literal["umemc-worker-report"] = "umemc-worker-report"
    version: int = STATUS_VERSION
    model: str
    pid: int
    reserved_bytes: int
    hard_bytes: int
    reservations: list[Reservation]
    allocator: AllocatorFigures | None = None  # where torch keeps a cache (not on the CPU)


# -- reading and writing ----------------------------------------------------------------------------
# -- `umemc status --json` (printed, not a file: documented in docs/CONTRACTS.md) ----------------------------------
class StatusRequests(Document):
    in_flight: int
    queued: int


class StatusModel(Document):
    """One model. The first seven fields are the contract's from the start; the rest is what the table shows."""

    state: str  # supervisord's (ProcState), or ORPHANED: alive without its supervisord
    pid: int | None
    rss_bytes: int
    gpu_bytes: int
    quota_soft_bytes: int | None  # None: plan.json unreadable
    quota_hard_bytes: int | None
    restarts: int
    uptime_s: float | None
    last_event: str | None
    last_event_text: str | None
    priority: int | None
    mode: str | None
    drift: float | None
    reserved_bytes: int
    allowance_bytes: int
    requests: StatusRequests | None
    health: Literal["ok", "unhealthy"] | None
    tokens_per_s: float | None
    enforced_by: str | None
    swapped_bytes: int | None
    resident_bytes: int | None = None  # its process tree's resident memory as `ps` shows it (the table's RSS)
    # beyond what it uses: a torch allocator's cache beyond its tensors, a llama.cpp worker's memory beyond its buffers
    held_beyond_bytes: int | None = None
    gpu_visible: bool | None = None  # NVIDIA: False where the driver lists none of its processes (docs/PLATFORMS.md)


class StatusRehearsal(Document):
    scale: float


class StatusMachine(Document):
    platform: str | None
    memory_figure: str | None
    swap_used_bytes: int | None
    swap_grown_bytes: int | None
    pressure_level: str | None
    gpu_limit_bytes: int | None
    enforcement: str
    heat_c: float | None = None  # the hottest sensor the platform reports, and the power draw (probes.heat)
    heat_sensor: str | None = None
    power_w: float | None = None
    throttling: str | None = None  # why the box throttles for heat now; null: it does not
    psi_some: float | None = None  # the kernel's memory pressure (PSI), shares of the last 10 s; null without PSI
    psi_full: float | None = None
    thermal_state: str | None = None  # macOS's thermal pressure


class StatusDoc(Document):
    models: dict[str, StatusModel]
    stack: str
    running: bool
    pressure: float | None
    gateway: GatewayDoc | None
    leases: list[LeaseDoc]
    generation: GenerationDoc | None
    orphans: dict[str, list[int]]
    problems: list[str]
    rehearsal: StatusRehearsal | None
    machine: StatusMachine | None
    nodes: dict[str, dict[str, Any]] = {}  # a stack of several nodes: the other nodes' models, as their gateways say
