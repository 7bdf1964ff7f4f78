"""The budget stage: capacity ledgers, quotas, fit and cold-admission decisions -> one frozen Plan.
All arithmetic of the report happens here; renderers only format (docs/CONTRACTS.md, "The budget report")."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

from ..catalog.runtimes import LLAMA_RUNTIMES, NEEDS_MODEL_FILE, holds_gpu_device
from ..estimate.estimator import estimate_stack
from ..estimate.figures import Estimate
from ..stack.load import Source
from ..stack.models import Stack
from ..stack.resolved import LoadedStack, ResolvedModel, ResolvedPlatform
from ..units import MiB, gib, mul_ceil, mul_floor, round_up
from . import policy

if TYPE_CHECKING:  # placed on several nodes only: single-node stacks do not import it
    from ..estimate.gguf_file import GgufFacts
    from .placement import Bin, Item, Placement
    from .split import Split

TIGHT = 0.10  # headroom below this share of the budget counts as a tight box


class Capacity(NamedTuple):
    memory: int
    os_reserve: int
    gpu_window: int | None
    usable: int
    budget: int
    gpu_budget: int | None


class ModelPlan(NamedTuple):
    name: str
    model: ResolvedModel
    estimate: Estimate
    quota_soft: int
    quota_hard: int
    gpu_quota_hard: int
    split: Split | None = None  # a model split across nodes: its whole split (this plan is its main node's part)
    part_of: str | None = None  # an RPC server holding a part of that split model (on a helper node)

    @property
    def hot(self) -> bool:
        return self.model.spec.mode == "hot"

    @property
    def priority(self) -> int:
        return self.model.spec.priority


class Peer(NamedTuple):
    """A model another node of the stack serves, as this node's gateway finds it."""

    node: str
    url: str  # HOST:PORT of that node's gateway
    aliases: tuple[str, ...] = ()


class ColdAdmission(NamedTuple):
    fits_alongside_hot: bool
    admissible: bool
    evicts: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """The budget of one machine (or, with nodes, of the whole stack): frozen, and all the later stages
    (advice, compile, render) read. Of the loaded stack it keeps only what they need: the stack's own
    (frozen) spec, its file and position index, the platform and the nodes' labels."""

    path: Path
    source: Source
    stack: Stack
    platform: ResolvedPlatform
    capacity: Capacity
    models: dict[str, ModelPlan]
    hot_total: int
    hot_gpu_total: int
    cold_admission: dict[str, ColdAdmission]
    warnings: tuple[str, ...]
    advice: tuple[str, ...] = ()  # when it does not fit: why, and the smallest changes that fit
    # a stack with [nodes]: one ordinary plan per node (its models, its platform) and the placement;
    # the fields above are then the whole stack's (capacities summed, every model)
    nodes: dict[str, Plan] = field(default_factory=dict)
    placement: Placement | None = None
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    node_images: dict[str, dict[str, str]] = field(default_factory=dict)  # by node: container image by runtime
    node_devices: dict[str, int | None] = field(default_factory=dict)  # by node: GPU devices pods may hold at once
    # with nodes: each cold model's plan on every node it may use (its quotas, files and flags there)
    variants: dict[str, dict[str, ModelPlan]] = field(default_factory=dict)
    scale: float = 1.0  # a scaled rehearsal (`up --simulate --scale F`): every byte figure of the budget times F
    node: str | None = None  # one node's plan of a stack of several: which
    peers: dict[str, Peer] = field(default_factory=dict)  # one node's plan: the models the other nodes serve

    @property
    def name(self) -> str:
        return self.stack.name

    @property
    def headroom(self) -> int:
        return self.capacity.budget - self.hot_total

    @property
    def kernel_enforcement(self) -> Literal["auto", "off"]:
        """The policy's kernel_enforcement where the platform has memory cgroups; off on macOS, which has none (its
        hard quotas are the enforcer's alone)."""
        return "off" if self.platform.kind == "apple" else self.stack.policy.kernel_enforcement

    @property
    def enforcement(self) -> str:
        """Who applies the hard quotas, in words (the report, `umemc status`)."""
        if self.kernel_enforcement == "off":
            why = "macOS has no memory cgroups" if self.platform.kind == "apple" else "kernel_enforcement = off"
            return f"umemc's enforcer alone ({why}): a worker over its hard quota is killed at its next sample"
        return "the kernel (a memory cgroup per worker, where the machine allows) and umemc's enforcer"

    @property
    def gpu_headroom(self) -> int | None:
        return None if self.capacity.gpu_budget is None else self.capacity.gpu_budget - self.hot_gpu_total

    @property
    def fits_ram(self) -> bool:
        if self.nodes:
            return self.placement is not None and self.placement.ok and all(p.fits_ram for p in self.nodes.values())
        return self.hot_total <= self.capacity.budget

    @property
    def fits_gpu(self) -> bool:
        if self.nodes:
            return all(p.fits_gpu for p in self.nodes.values())
        return self.gpu_headroom is None or self.gpu_headroom >= 0

    def node_of(self, model: str) -> str | None:
        return None if self.placement is None else self.placement.home.get(model)

    @property
    def fits(self) -> bool:
        return self.fits_ram and self.fits_gpu


def scaled(plan: Plan, f: float) -> Plan:
    """The plan as a rehearsal at F of its size: the machine's memory, reserve, GPU window and budgets and every
    quota times F (capacities rounded down, quotas up to a whole MiB, so a scaled stack is never roomier than the
    real one), the hot totals and the cold admissions recomputed with the one policy: the same decisions as at
    full size, on a machine F times as large."""

    def down(n: int) -> int:
        return mul_floor(n, f)

    def up(n: int) -> int:
        return round_up(mul_ceil(n, f), MiB) if n else 0

    cap = plan.capacity
    capacity = Capacity(
        down(cap.memory),
        down(cap.os_reserve),
        None if cap.gpu_window is None else down(cap.gpu_window),
        down(cap.usable),
        down(cap.budget),
        None if cap.gpu_budget is None else down(cap.gpu_budget),
    )
    models = {
        n: m._replace(quota_soft=min(up(m.quota_soft), up(m.quota_hard)), quota_hard=up(m.quota_hard),
                   gpu_quota_hard=up(m.gpu_quota_hard))
        for n, m in plan.models.items()
    }  # fmt: skip
    hot = [m for m in models.values() if m.hot]
    out = replace(
        plan,
        capacity=capacity,
        models=models,
        hot_total=sum(m.quota_hard for m in hot),
        hot_gpu_total=sum(m.gpu_quota_hard for m in hot) if capacity.gpu_budget is not None else 0,
        scale=plan.scale * f,
    )
    return replace(out, cold_admission=admissions(out))


def capacity_of(loaded: LoadedStack) -> Capacity:
    p, margin = loaded.platform, loaded.stack.policy.safety_margin
    usable = p.memory - p.os_reserve
    # an APU with a BIOS carve-out: the GPU has that VRAM besides what its GTT maps of the rest
    window = None if p.gpu_window is None else p.gpu_window + (p.uma_carveout or 0)
    if p.unified and window is not None:
        usable = min(usable, window)  # the GPU window bounds the models on unified memory
    gpu_budget = None if window is None else mul_floor(window, 1 - margin)
    return Capacity(p.memory, p.os_reserve, window, usable, mul_floor(usable, 1 - margin), gpu_budget)


def hard_quota(n: int, headroom: float) -> int:
    """estimate x (1 + quota_headroom), rounded up to a whole MiB (page-aligned for cgroup limits)."""
    return round_up(mul_ceil(n, 1 + headroom), MiB)


def model_plan(loaded: LoadedStack, model: ResolvedModel, est: Estimate) -> ModelPlan:
    h = loaded.stack.policy.quota_headroom
    return ModelPlan(
        model.name,
        model,
        est,
        est.estimate_bytes,
        hard_quota(est.estimate_bytes, h),
        hard_quota(est.gpu.bytes, h) if est.gpu.bytes else 0,
    )


def make_plan(loaded: LoadedStack) -> Plan:
    if loaded.nodes:
        return make_cluster_plan(loaded)
    estimates = estimate_stack(loaded)
    return assemble(loaded, {n: model_plan(loaded, loaded.models[n], e) for n, e in estimates.items()})


def assemble(loaded: LoadedStack, models: dict[str, ModelPlan]) -> Plan:
    estimates = {n: m.estimate for n, m in models.items()}
    cap = capacity_of(loaded)
    hot = [m for m in models.values() if m.hot]
    hot_total = sum(m.quota_hard for m in hot)
    hot_gpu = sum(m.gpu_quota_hard for m in hot) if cap.gpu_budget is not None else 0
    plan = Plan(*_of(loaded), cap, models, hot_total, hot_gpu, {}, ())
    plan = replace(plan, cold_admission=admissions(plan))
    return replace(plan, warnings=tuple(_warnings(loaded, plan, estimates)))


def _placed_admission(where: dict[str, tuple[str, ...]], home: str) -> ColdAdmission:
    """A cold model's admission on its home node, from the placement's answer (each node where it may start: what
    its start stops there)."""
    if home not in where:
        return ColdAdmission(fits_alongside_hot=False, admissible=False, evicts=())
    return ColdAdmission(fits_alongside_hot=not where[home], admissible=True, evicts=where[home])


def _of(loaded: LoadedStack) -> tuple[Path, Source, Stack, ResolvedPlatform]:
    return loaded.path, loaded.source, loaded.stack, loaded.platform


def admissions(plan: Plan) -> dict[str, ColdAdmission]:
    """Can each cold model start? Alongside the hot set, or by evicting hot models: the one eviction
    policy (umemc.budget.policy) on paper, where every hot worker holds its hard quota and none has been
    used yet (lowest priority first, then file order; only as many as needed; never an equal or
    higher priority). policy.OnPaper answers as policy.decide does, once the hot set is ordered (a stack
    may have hundreds of cold models)."""
    paper = policy.OnPaper(held_on_paper(plan), policy_budget(plan))
    out = {}
    for m in plan.models.values():
        if not m.hot:
            fits, victims = paper.decide(need_of(m))
            out[m.name] = ColdAdmission(fits_alongside_hot=fits and not victims, admissible=fits, evicts=victims)
    return out


def need_of(m: ModelPlan) -> policy.Need:
    return policy.Need(m.name, ram=m.quota_hard, gpu=m.gpu_quota_hard, priority=m.priority, cold=not m.hot, drain=False)


def held_on_paper(plan: Plan) -> list[policy.Held]:
    """The hot set as the policy sees it before anything runs, in the stack's file order."""
    return [
        policy.Held.on_paper(m.name, m.priority, m.quota_hard, m.gpu_quota_hard) for m in plan.models.values() if m.hot
    ]


def policy_budget(plan: Plan) -> policy.Budget:
    """The plan's budget for the one policy, with its pressure rule: on paper, the pressure is what the hot set's
    hard quotas take of usable memory (the gateway measures it live)."""
    cap = plan.capacity
    return policy.Budget(cap.budget, cap.gpu_budget, usable=cap.usable, load_below=plan.stack.policy.load_below)


def _warnings(loaded: LoadedStack, plan: Plan, estimates: dict[str, Estimate]) -> list[str]:
    out = list(loaded.warnings)
    for est in estimates.values():
        out += est.warnings
    tight = plan.headroom < TIGHT * plan.capacity.budget
    for m in plan.models.values():
        spec = m.model.spec
        if tight and m.hot and spec.runtime in LLAMA_RUNTIMES and m.model.mmap and not spec.mlock:
            out.append(
                loaded.source.warning(
                    ("models", m.name, "mmap"),
                    "weights memory-mapped (mmap = true) without mlock on a "
                    f"tight box (headroom {gib(plan.headroom)} GiB): the OS may page them "
                    "out; set mlock = true or mmap = false",
                )
            )
    out += [w for no_key, w in missing_files(plan) if no_key]  # a missing file is already said at load
    out += _carveout_warnings(loaded, plan)
    out += _cold_warnings(plan)
    return out


def _carveout_warnings(loaded: LoadedStack, plan: Plan) -> list[str]:
    """A BIOS carve-out is memory the OS never sees: the models' CPU side (weights a CPU backend repacks,
    host buffers, the processes themselves) must fit what is left, and the setting is usually a mistake."""
    p = loaded.platform
    if not p.uma_carveout:
        return []
    host = p.memory - p.uma_carveout - p.os_reserve
    need = sum(m.quota_hard - m.gpu_quota_hard for m in plan.models.values() if m.hot)
    out = [
        loaded.source.warning(
            ("platform", "uma_carveout"),
            f"the BIOS reserves {gib(p.uma_carveout)} GiB of the {gib(p.memory)} GiB for the GPU (its UMA frame "
            f"buffer): the OS sees {gib(p.memory - p.uma_carveout)} GiB, and the models' CPU side has "
            f"{gib(host)} GiB of it. With the smallest frame buffer (BIOS setup: UMA Frame Buffer Size, or iGPU "
            "Memory Size, = 512M) the GPU maps system memory through its GTT instead (ttm.pages_limit, which "
            "`umemc apply` sets) and every GiB serves either side",
        )
    ]
    if need > host:
        out.append(
            loaded.source.warning(
                ("platform", "uma_carveout"),
                f"the hot models' CPU side needs {gib(need)} GiB (hard quotas less their GPU part), more than the "
                f"{gib(host)} GiB the carve-out leaves the OS: shrink the carve-out in the BIOS",
            )
        )
    return out


def _cold_warnings(plan: Plan) -> list[str]:
    """What a cold start will meet at run time: the budget alone, or the pressure rule too (the gateway starts a
    cold model only while pressure, less what its evictions free, is below load_below)."""
    out: list[str] = []
    if not plan.cold_admission:
        return out
    cap, load_below = plan.capacity, plan.stack.policy.load_below
    held = held_on_paper(plan)
    by_ledger = policy.OnPaper(held, policy.Budget(cap.budget, cap.gpu_budget))
    pressure = sum(h.ram for h in held) / cap.usable if cap.usable else 0.0
    for name, adm in plan.cold_admission.items():
        fits, victims = by_ledger.decide(need_of(plan.models[name]))
        calm = f"the hot set's hard quotas hold {pressure:.2f} of usable memory, not below load_below {load_below}"
        if not adm.admissible and fits:
            out.append(
                f"models.{name}: cold model can never start: it fits the budget, but {calm} and evicting every "
                "lower-priority hot model does not bring it under; lower the hot set or raise load_below"
            )
        elif not adm.admissible:
            out.append(
                f"models.{name}: cold model can never start: even evicting every lower-priority hot "
                "model leaves too little memory"
            )
        elif fits and set(adm.evicts) != set(victims):
            out.append(
                f"models.{name}: cold model fits the budget beside the hot set, but {calm}: "
                f"it starts only by evicting {', '.join(adm.evicts)}"
            )
    return out


def missing_files(plan: Plan) -> list[tuple[bool, str]]:
    """Models whose runtime needs a weights file the stack does not provide: (no model key at all, message).
    `check` and `build` refuse a model without a model key (exit 2); a named file that is not there yet is a
    warning in `check` and needs --files-later in `build`."""
    out = []
    for m in plan.models.values():
        spec = m.model.spec
        if spec.runtime not in NEEDS_MODEL_FILE or m.model.model_present:
            continue
        if spec.model is None and spec.hf is None:
            message = (
                f'no model file: {spec.runtime} cannot start without one (the estimate used arch = "{spec.arch}"); '
                'give model = "path/to/file.gguf"'
            )
            out.append((True, plan.source.warning(("models", m.name), message, what="table")))
        elif spec.model is None:
            out.append((False, _not_yet(plan, m.name, "hf", str(m.model.model_path))))
        else:
            out.append((False, _not_yet(plan, m.name, "model", spec.model, hub=spec.hf is not None)))
    for m in plan.models.values():  # a named projector follows the same rule as the model file
        spec = m.model.spec
        if (spec.mmproj is not None or spec.mmproj_hf is not None) and not m.model.mmproj_present:
            key = "mmproj" if spec.mmproj is not None else "mmproj_hf"
            shown = spec.mmproj or str(m.model.mmproj_path)
            out.append((False, _not_yet(plan, m.name, key, shown, hub=spec.mmproj_hf is not None)))
    return out


def _not_yet(plan: Plan, name: str, key: str, shown: str, *, hub: bool = True) -> str:
    pull = f"`umemc pull {plan.source.file}` downloads it; " if hub else ""
    message = f"{shown} does not exist yet: {pull}`umemc build` needs --files-later, `umemc up` needs the file"
    return plan.source.warning(("models", name, key), message)


ModelPlans = dict[str, ModelPlan]


def _items(loaded: LoadedStack, by_kind: dict[str, ModelPlans]) -> list[Item]:
    """What the placement places: each model's allowed nodes and its quotas there. One Need per (kind, model):
    nodes of one kind share it (the placement compares them by identity)."""
    from .placement import Item, PerKind
    from .placement import Need as PlaceNeed

    every = tuple(loaded.nodes)
    kinds = list(by_kind)
    kind_of = {n: kinds.index(node.platform.kind) for n, node in loaded.nodes.items()}
    shared = [
        {
            name: PlaceNeed(
                mp.quota_hard, mp.gpu_quota_hard, int(holds_gpu_device(mp.model.spec.runtime, kind, mp.model.spec.gpu))
            )
            for name, mp in mplans.items()
        }
        for kind, mplans in by_kind.items()
    ]
    items = []
    for name, spec in loaded.stack.models.items():
        if spec.node:
            allowed: tuple[str, ...] = (spec.node,)
        elif spec.nodes:
            chosen = set(spec.nodes)
            allowed = tuple(n for n in every if n in chosen)
        else:
            allowed = every
        per_kind = tuple(s[name] for s in shared)
        needs = PerKind(kind_of if allowed is every else {n: kind_of[n] for n in allowed}, per_kind)
        items.append(Item(name, spec.priority, spec.mode == "hot", allowed, needs))
    return items


def make_cluster_plan(loaded: LoadedStack) -> Plan:
    """Several nodes: estimate each model once per node kind (a model resolves and estimates alike on every
    platform of a kind: a node's memory sizes its budget, not its models), place them (umemc.budget.placement),
    then one ordinary plan per node with the models it holds."""
    from .placement import Bin, place

    by_kind: dict[str, tuple[LoadedStack, ModelPlans]] = {}
    by_platform: dict[ResolvedPlatform, tuple[LoadedStack, ModelPlans]] = {}
    for name, node in loaded.nodes.items():
        kind = node.platform.kind
        if kind not in by_kind:
            view = loaded.for_node(name)
            est = estimate_stack(view)
            by_kind[kind] = (view, {n: model_plan(view, view.models[n], e) for n, e in est.items()})
        if node.platform not in by_platform:  # the kind's models, on this platform
            view, plans = by_kind[kind]
            by_platform[node.platform] = (replace(view, platform=node.platform), plans)
    node_view = {name: by_platform[node.platform] for name, node in loaded.nodes.items()}
    bins = []
    for name, (view, _) in node_view.items():
        cap = capacity_of(view)  # the view of this node's platform
        devices = loaded.nodes[name].gpu_devices
        bins.append(Bin(name, cap.budget, cap.gpu_budget, cap.usable, loaded.stack.policy.load_below, devices))
    items = _items(loaded, {kind: plans for kind, (_, plans) in by_kind.items()})
    placement = place(bins, items)
    by_node: dict[str, list[str]] = {n: [] for n in loaded.nodes}
    for m in loaded.stack.models:
        if m in placement.home and m not in placement.unplaced:
            by_node[placement.home[m]].append(m)
    node_plans = {name: dict(mplans) for name, (_, mplans) in node_view.items()}
    split_warnings: list[str] = []
    splits = _split_models(loaded, placement, bins, items, by_node, node_plans, split_warnings)
    nodes: dict[str, Plan] = {}
    served = _served_by_node(loaded, by_node, node_plans)
    for name, (view, _) in node_view.items():
        here = by_node[name]
        mplans = node_plans[name]
        sub = replace(view, models={m: mplans[m].model for m in here}, warnings=())
        port = loaded.nodes[name].gateway_port
        if name not in served:  # it serves nothing itself: no gateway of its own
            gateway = view.stack.gateway.model_copy(update={"enabled": False})
            sub = replace(sub, stack=view.stack.model_copy(update={"gateway": gateway}))
        elif port is not None:
            gateway = view.stack.gateway.model_copy(update={"port": port})
            sub = replace(sub, stack=view.stack.model_copy(update={"gateway": gateway}))
        peers = {m: peer for other, models in served.items() if other != name for m, peer in models.items()}
        nodes[name] = replace(assemble(sub, {m: mplans[m] for m in here}), node=name, peers=peers)
    models: dict[str, ModelPlan] = {}
    for item in items:
        home = placement.home.get(item.name)
        if item.name in splits:  # the whole model's figures; each node's plan has its part
            whole = node_view[home or item.allowed[0]][1][item.name]
            models[item.name] = whole._replace(split=splits[item.name])
        elif home is not None and item.name in nodes[home].models:
            models[item.name] = nodes[home].models[item.name]
        else:  # a hot model that fits nowhere: its figures on the first node it may use
            models[item.name] = node_view[item.allowed[0]][1][item.name]
    caps = [p.capacity for p in nodes.values()]
    gpu = [c.gpu_window for c in caps if c.gpu_window is not None]
    gpu_budget = [c.gpu_budget for c in caps if c.gpu_budget is not None]
    capacity = Capacity(
        sum(c.memory for c in caps),
        sum(c.os_reserve for c in caps),
        sum(gpu) if gpu else None,
        sum(c.usable for c in caps),
        sum(c.budget for c in caps),
        sum(gpu_budget) if gpu_budget else None,
    )
    hot_total = sum(p.hot_total for p in nodes.values())  # a split model's parts on every node it spans
    hot_gpu_total = sum(p.hot_gpu_total for p in nodes.values())
    cold = _cold_admissions(placement, nodes, models, splits)
    said = dict.fromkeys([*loaded.warnings, *split_warnings])  # each warning once, in the order first said
    for p in nodes.values():
        said.update(dict.fromkeys(p.warnings))
    for name in [*placement.unplaced, *splits]:  # their figures are in no node's plan whole: their warnings here
        said.update(dict.fromkeys(models[name].estimate.warnings))
    warnings = list(said)
    return Plan(
        *_of(loaded),
        capacity,
        models,
        hot_total + sum(m.quota_hard for n, m in models.items() if m.hot and n in placement.unplaced),
        hot_gpu_total + sum(m.gpu_quota_hard for n, m in models.items() if m.hot and n in placement.unplaced)
        if capacity.gpu_budget is not None
        else 0,
        cold,
        tuple(warnings),
        nodes=nodes,
        placement=placement,
        node_labels={name: dict(node.labels) for name, node in loaded.nodes.items()},
        node_images={name: dict(node.images) for name, node in loaded.nodes.items()},
        node_devices={name: node.gpu_devices for name, node in loaded.nodes.items()},
        variants={i.name: {n: node_view[n][1][i.name] for n in i.allowed} for i in items if not i.hot},
    )


def _cold_admissions(
    placement: Placement, nodes: dict[str, Plan], models: dict[str, ModelPlan], splits: dict[str, Split]
) -> dict[str, ColdAdmission]:
    """Each cold model's admission as the placement answers it on its home node: its memory and the node's GPU
    devices (a start that needs the node's only device stops its holder), one answer in the report, explain and
    the page. Where a split's part took room after the placement answered, the node's own ledger answers. Each
    node's plan is given the same answers."""
    cold = {n: _placed_admission(placement.cold.get(n, {}), placement.home[n]) for n in models if not models[n].hot}
    spanned = {p.node for sp in splits.values() for p in sp.parts}
    for name in spanned:
        for n, adm in nodes[name].cold_admission.items():
            if n in cold and placement.home.get(n) == name:
                cold[n] = adm
    for name, node_plan in nodes.items():
        nodes[name] = replace(node_plan, cold_admission={n: cold[n] for n in node_plan.cold_admission if n in cold})
    return cold


def _served_by_node(
    loaded: LoadedStack, by_node: dict[str, list[str]], node_plans: dict[str, ModelPlans]
) -> dict[str, dict[str, Peer]]:
    """By node that serves models (a node holding only parts of split models serves none): each model it serves,
    as the other nodes' gateways find it (its gateway at the node's address and its gateway port)."""
    out: dict[str, dict[str, Peer]] = {}
    gateway = loaded.stack.gateway
    if not gateway.enabled:
        return out
    for node, names in by_node.items():
        mine = [m for m in names if node_plans[node][m].part_of is None]
        if not mine:
            continue
        n = loaded.nodes[node]
        host = f"[{n.address}]" if ":" in n.address else n.address
        url = f"{host}:{n.gateway_port or gateway.port}"
        out[node] = {m: Peer(node, url, tuple(node_plans[node][m].model.spec.aliases)) for m in mine}
    return out


def _split_models(
    loaded: LoadedStack,
    placement: Placement,
    bins: list[Bin],
    items: list[Item],
    by_node: dict[str, list[str]],
    node_plans: dict[str, ModelPlans],
    warnings: list[str],
) -> dict[str, Split]:
    """Hot models with split = true that no one node holds: split by layers over the room the whole models leave
    (umemc.budget.split). Each split's main node gets the model with its part's figures, each helper node an RPC
    server program NAME-rpc with its part's; the placement says where."""
    from ..estimate.gguf_file import NotGguf
    from ..estimate.gguf_file import read as read_gguf
    from .split import Room, Serving, plan_split

    out: dict[str, Split] = {}
    wanted = [i for i in items if i.name in placement.unplaced and loaded.stack.models[i.name].split]
    if not wanted:
        return out
    left = {b.name: b.budget for b in bins}
    gpu_left = {b.name: b.gpu_budget for b in bins}
    devices_left = {b.name: b.devices for b in bins}  # GPU devices pods may still hold (None: not counted)
    for node, names in by_node.items():
        kind = loaded.nodes[node].platform.kind
        for n in names:
            mp = node_plans[node][n]
            if mp.hot:
                left[node] -= mp.quota_hard
                gpu = gpu_left[node]
                gpu_left[node] = None if gpu is None else gpu - mp.gpu_quota_hard
                held = devices_left[node]
                if held is not None and holds_gpu_device(mp.model.spec.runtime, kind, mp.model.spec.gpu):
                    devices_left[node] = held - 1
    ports = {n: loaded.nodes[n].rpc_port for n in loaded.nodes}
    headroom = loaded.stack.policy.quota_headroom

    def quota(n: int) -> int:
        return hard_quota(n, headroom)

    for item in wanted:
        name, spec = item.name, loaded.stack.models[item.name]
        at = ("models", name, "split")
        whole = node_plans[item.allowed[0]][name]
        if whole.model.model_path is None or not whole.model.model_present:
            raise loaded.source.error(
                at,
                "a split is sized block by block from the model's GGUF header, and the file is not there",
                "give model = a GGUF file that exists (`umemc pull` fetches one named by hf)",
            )
        try:
            facts = read_gguf(whole.model.model_path)
        except NotGguf as exc:
            raise loaded.source.error(at, str(exc)) from None
        rooms = [
            Room(n, left[n], gpu_left[n], loaded.nodes[n].platform.kind, loaded.nodes[n].address, ports[n],
                 devices_left[n])
            for n in item.allowed
        ]  # fmt: skip
        serving = Serving(spec.context, spec.parallel, spec.ubatch, spec.kv_cache, spec.flash_attn,
                          whole.model.mmap, spec.gpu)  # fmt: skip
        got = plan_split(
            name, whole.estimate, facts, rooms, quota, serving,
            on_node={n: node_plans[n][name].estimate for n in item.allowed},
            measured=_split_measured(loaded, whole.model, facts, warnings),
        )  # fmt: skip
        if got is None:
            placement.unplaced[name] += "; split across its nodes, it fits no more (the rooms left are too small)"
            continue
        out[name] = got
        del placement.unplaced[name]
        placement.home[name] = got.main
        placement.why[name] = f"split by layers across {len(got.parts)} nodes (llama.cpp RPC): {got.said()}"
        for part in got.parts:
            plan = node_plans[part.node][name]
            est = part.estimate
            hard = quota(est.estimate_bytes)
            gpu_hard = quota(est.gpu.bytes) if est.gpu.bytes else 0
            left[part.node] -= hard
            if gpu_left[part.node] is not None:
                gpu_left[part.node] = (gpu_left[part.node] or 0) - gpu_hard
            held = devices_left[part.node]
            if held is not None and holds_gpu_device("llama-server", loaded.nodes[part.node].platform.kind, spec.gpu):
                devices_left[part.node] = held - 1
            if part.endpoint is None:
                node_plans[part.node][name] = ModelPlan(name, plan.model, est, est.estimate_bytes, hard, gpu_hard, got)
                by_node[part.node].append(name)
            else:
                rpc = _rpc_part(loaded, plan.model, part.node, ports[part.node])
                ports[part.node] += 1
                node_plans[part.node][rpc.name] = ModelPlan(
                    rpc.name, rpc, est, est.estimate_bytes, hard, gpu_hard, None, name
                )
                by_node[part.node].append(rpc.name)
    _check_rpc_endpoints(loaded, node_plans, out, warnings)
    return out


def _check_rpc_endpoints(
    loaded: LoadedStack, node_plans: dict[str, ModelPlans], splits: dict[str, Split], warnings: list[str]
) -> None:
    """Where each helper's RPC server listens: never where another listens on the same host (two RPC servers, or a
    model's port, or the gateway's, which every node runs); and said at the node's address when it listens beyond
    loopback, for llama.cpp's RPC protocol has no authentication."""
    import ipaddress

    src = loaded.source
    gateway = loaded.stack.gateway
    taken: dict[tuple[str, int], str] = {}
    for node, plans in node_plans.items():
        host = loaded.nodes[node].address
        if gateway.enabled:
            taken[(host, loaded.nodes[node].gateway_port or gateway.port)] = "the gateway (every node runs one)"
        for mp in plans.values():
            if mp.part_of is None and mp.model.port is not None:
                taken[(host, mp.model.port)] = f"model {mp.name} on node {node}"
    for split in splits.values():
        for part in split.helpers:
            host, port = loaded.nodes[part.node].address, int(str(part.endpoint).rsplit(":", 1)[1])
            said = f"the RPC server of {split.model}'s part on node {part.node}"
            other = taken.get((host, port))
            if other is not None:
                raise src.error(
                    ("nodes", part.node, "rpc_port"),
                    f"{said} would listen on {host}:{port}, where {other} listens",
                    f"give nodes.{part.node}.rpc_port a port nothing else on {host} uses (each RPC server of a node "
                    "takes the next port up)",
                )
            taken[(host, port)] = said
            if not ipaddress.ip_address(_resolved(host)).is_loopback:
                warnings.append(
                    src.warning(
                        ("nodes", part.node, "address"),
                        f"{said} listens on {host}:{port} beyond this machine, and llama.cpp's RPC protocol has no "
                        "authentication (whoever reaches it can read and write its memory): keep that address on a "
                        "private network, or a firewall's list of the other nodes",
                    )
                )


def _resolved(host: str) -> str:
    """An IP address as is; a host name: 127.0.0.1 for localhost, else a name that is not loopback (never looked
    up: a check is the same on every machine)."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return "127.0.0.1" if host == "localhost" else "192.0.2.1"


def _split_measured(loaded: LoadedStack, rm: ResolvedModel, facts: GgufFacts, warnings: list[str]) -> dict[str, int]:
    """The compute buffers per device of llama.cpp's dry run of this split (the lock's split_dry_run, `umemc check
    --measure` with the helpers up): by the helper's endpoint, and "main" for the main node's own (its compute and
    output buffers); nothing where none is recorded for this file and these settings, or the llama.cpp that answered
    changed. The lock is input, and a forged figure must not make a part fit: where the llama.cpp that answered is
    here and unchanged, its figure is held only to what no real one is under (the main node's output buffer holds a
    row of logits, a helper's compute buffer one token's hidden state), never to umemc's model of the compute buffer,
    which is the guess; where that llama.cpp is not here, to half of that model's figure."""
    from .. import lockfile
    from ..document import values
    from ..estimate import keys
    from ..estimate.dryrun import still_answers
    from ..estimate.llm import compute_figure

    entry = loaded.calibration.get(rm.name)
    run = None if entry is None else entry.split_dry_run
    shape = facts.shape
    if run is None or rm.model_path is None or not rm.model_present or shape is None:
        return {}
    wanted = keys.dry_run(loaded, rm) | {"file": values(lockfile.identity(rm.model_path))}
    if {k: v for k, v in run.flags.items() if k != "rpc"} != wanted:
        return {}
    spec, at = rm.spec, ("models", rm.name, "split")
    current = still_answers(run, spec.runtime, spec.bin)
    if current is False:
        warnings.append(
            loaded.source.warning(
                at,
                f"the llama.cpp that sized this split changed or is not the one it would run now "
                f"({run.identity.path}): estimating; `umemc check --measure` asks it again",
            )
        )
        return {}
    out: dict[str, int] = {}
    for device, sizes in run.buffers.items():
        key = device[device.index("[") + 1 : -1] if device.endswith("]") and "[" in device else "main"
        out[key] = out.get(key, 0) + sizes.get("compute", 0) + (sizes.get("output", 0) if key == "main" else 0)
    if current:
        floors = {k: (shape.n_vocab * 4 if k == "main" else shape.n_embd * 4) for k in out}
        said = {k: "a row of logits" if k == "main" else "one token's hidden state" for k in out}
    else:
        hand = compute_figure(
            shape, spec.context, spec.parallel, spec.ubatch, flash_attn=spec.flash_attn, kv_type=spec.kv_cache,
            outputs=spec.parallel if shape.causal else None,
        ).bytes  # fmt: skip
        floors = dict.fromkeys(out, hand // 2)
        said = dict.fromkeys(out, "half of what the model's own shape needs")
    low = {k: v for k, v in out.items() if v < floors[k]}
    for key, value in low.items():
        where = "its main node" if key == "main" else f"the RPC server at {key}"
        warnings.append(
            loaded.source.warning(
                at,
                f"{lockfile.path_for(loaded.path).name}: llama.cpp's recorded compute buffer for {where} "
                f"({value} bytes) is below {said[key]} ({floors[key]} bytes): not used (a stale or forged record); "
                "`umemc check --measure` asks again",
            )
        )
    return {k: v for k, v in out.items() if k not in low}


def _rpc_part(loaded: LoadedStack, rm: ResolvedModel, node: str, port: int) -> ResolvedModel:
    """The program that holds a split model's part on a helper node: llama.cpp's RPC server beside the model's
    llama-server (`bin`'s directory) or on PATH, listening at the node's address."""
    from .split import RPC_PROGRAM

    name = f"{rm.name}-rpc"
    if name in loaded.stack.models:
        raise loaded.source.error(
            ("models", rm.name, "split"),
            f"its part on node {node} runs as a program named {name}, which is another model's name",
            f"rename the model {name}",
        )
    binary = RPC_PROGRAM if rm.spec.bin is None else str(Path(rm.spec.bin).with_name(RPC_PROGRAM))
    address = loaded.nodes[node].address
    spec = rm.spec.model_copy(
        update={
            "runtime": "command",
            "command": [binary, "--host", address, "--port", str(port)],
            "model": None, "hf": None, "mmproj": None, "mmproj_hf": None, "args": [], "aliases": [],
            "serves": [], "split": False, "port": port, "health": None, "kind": "other", "memory": None,
            "node": node, "nodes": None, "chat_template": None, "ttl": None,
        }
    )  # fmt: skip
    return ResolvedModel(
        name, spec, family="command", quant=None, model_path=None, model_present=False, mmproj_path=None,
        mmproj_present=False, mmap=False, max_concurrency=1, port=port,
    )  # fmt: skip
