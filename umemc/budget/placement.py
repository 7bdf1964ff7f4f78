"""Placing a stack's models on several machines: pure arithmetic on hard quotas, no I/O.

Three ledgers per node: all memory and the GPU window (each within its safety margin), and GPU devices:
under Kubernetes each GPU model's pod holds one device of the node's device plugin (`gpu_devices`, 1 per
GPU unless the plugin shares it, e.g. NVIDIA time-slicing). Hot models are placed in passes, the first
that gives every hot model a node wins:

1. priority first (then larger first), each on the node it fits whose GPU is largest (a high-priority
   model gets the strongest machine, never a CPU node while a GPU node has room), then with the least
   room left (best fit, which keeps large holes for the large models still to come);
2. constrained first: the models with the fewest nodes they could use first (a pinned model before one
   that may go anywhere), then larger first;
3. larger first.

Every pass keeps the GPU preference (of the nodes a model fits, the largest GPU window first, then best fit).
When none places them all, on up to FEASIBLE_MAX hot models an exact search looks for a placement of them all
(so no false "does not fit" there); when there is none, the placement keeps the highest priorities: on up to
EXACT_MAX hot models the
priority-lexicographic optimum (the placed set whose priorities, sorted, are largest, found by trying every
subset against an exact search); above that, the priority pass, then each model it left out retried by
repacking with it (constrained first). Ties break on the stack's file order, so the same stack always gets
the same placement. A model that fits nowhere is reported with the node that came closest and by how much.
Cold models are not placed: for each allowed node the eviction policy (umemc.budget.policy) says whether they could
start there and what they would stop; their home is the node where that costs least.

bench/placement.py measures it against exhaustive search and at scale.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..units import gib
from . import policy

NO_LIMIT = 1 << 62
SHOWN = 3  # other nodes named in a model's explanation
EXACT_MAX = 8  # hot models up to which a stack that cannot place them all gets the exact optimum
FEASIBLE_MAX = 16  # hot models up to which an exact search looks for a placement of them all before giving up
SEARCH_STEPS = 200_000  # node visits of one exact feasibility search (about a second of Python)
REPACKS = 32  # above EXACT_MAX: models left out by the priority pass retried by a repack


class Bin(NamedTuple):
    name: str
    budget: int  # all-memory budget (bytes)
    gpu_budget: int | None  # None: no GPU window ledger (kind = cpu)
    usable: int = 0  # for the pressure rule of cold starts (umemc.budget.policy.Budget)
    load_below: float = 1.0
    devices: int | None = None  # GPU devices pods may hold at once (None: not counted)

    def policy_budget(self) -> policy.Budget:
        return policy.Budget(self.budget, self.gpu_budget, usable=self.usable, load_below=self.load_below)


class Need(NamedTuple):
    ram: int  # hard quota
    gpu: int  # hard quota in the GPU window
    devices: int = 0  # GPU devices its pod holds there


class Item(NamedTuple):
    name: str
    priority: int
    hot: bool
    allowed: tuple[str, ...]  # node names, in the stack's node order
    needs: Mapping[str, Need]  # per allowed node: its quotas there (estimates depend on the node's kind)


class PerKind(Mapping[str, Need]):
    """A model's needs when they depend only on each node's kind: the node -> kind index (one mapping shared
    by every model of the same allowed nodes) and a need per kind, instead of a dict per model of every
    node (5000 models on 500 nodes would hold 2.5 million entries)."""

    __slots__ = ("kind_of", "per_kind")

    def __init__(self, kind_of: Mapping[str, int], per_kind: tuple[Need, ...]):
        self.kind_of, self.per_kind = kind_of, per_kind

    def __getitem__(self, node: str) -> Need:
        return self.per_kind[self.kind_of[node]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.kind_of)

    def __len__(self) -> int:
        return len(self.kind_of)


@dataclass
class Placement:
    home: dict[str, str] = field(default_factory=dict)  # model -> node (hot: placed; cold: cheapest admission)
    why: dict[str, str] = field(default_factory=dict)  # model -> a sentence for `umemc explain`
    unplaced: dict[str, str] = field(default_factory=dict)  # hot model -> why it fits nowhere
    # cold model -> {each allowed node where it could start: what it would evict there (nothing: alongside)}
    cold: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.unplaced


class Room:
    """What is left on every node, on the three ledgers."""

    def __init__(self, bins: list[Bin]):
        self.ram = {b.name: b.budget for b in bins}
        self.gpu = {b.name: NO_LIMIT if b.gpu_budget is None else b.gpu_budget for b in bins}
        self.dev = {b.name: NO_LIMIT if b.devices is None else b.devices for b in bins}

    def fits(self, need: Need, node: str) -> bool:
        return need.ram <= self.ram[node] and need.gpu <= self.gpu[node] and need.devices <= self.dev[node]

    def take(self, need: Need, node: str, sign: int = 1) -> None:
        self.ram[node] -= sign * need.ram
        self.gpu[node] -= sign * need.gpu
        self.dev[node] -= sign * need.devices

    def short(self, need: Need, node: str) -> int:
        """By how many bytes it misses the node (a missing device counts as its whole quota)."""
        lack = max(need.ram - self.ram[node], need.gpu - self.gpu[node])
        return max(lack, need.ram if need.devices > self.dev[node] else 0)


Assignment = dict[str, str]


def place(bins: list[Bin], items: list[Item]) -> Placement:
    order = {b.name: i for i, b in enumerate(bins)}
    by_name = {b.name: b for b in bins}
    hot = [i for i in items if i.hot]
    out = Placement()
    facts = Facts(bins, hot)
    home, how, winner = _place_hot(bins, hot, order, facts)
    room = Room(bins)
    ranked = sorted(hot, key=lambda i: (-i.priority, -facts.size[i.name], i.name))
    for item in ranked:
        if item.name in home:
            room.take(item.needs[home[item.name]], home[item.name])
    explained = {} if winner is None else _explain(bins, winner, home)
    for item in ranked:
        node = home.get(item.name)
        if node is None:
            out.unplaced[item.name] = _unplaced_why(item, room, by_name, order)
        else:
            out.home[item.name] = node
            out.why[item.name] = explained.get(item.name) or _generic_why(node, how, room)
    _cold(bins, items, hot, out, room, order)
    return out


# -- the hot models -------------------------------------------------------------------------------------
class Pass:
    """One greedy pass: the order of the models, and a class per node (lower first); within a class a model
    goes where it leaves the least room (best fit), ties in file order."""

    def __init__(self, how: str, ranked: list[Item], klass: dict[str, int], order: dict[str, int], f: Facts):
        self.how, self.ranked, self.klass, self.order, self.facts = how, ranked, klass, order, f

    def key(self, node: str, left: int) -> tuple[int, int, int]:
        return (self.klass[node], left, self.order[node])


class Index:
    """The nodes by (class, room left, file order), for a model that may use every node with the same
    quotas on each (most of a large stack): the best node is a bisection, not a scan."""

    def __init__(self, bins: list[Bin], p: Pass, room: Room):
        self.p, self.room = p, room
        self.classes = sorted(set(p.klass.values()))
        self.rows: dict[int, list[tuple[int, int, str]]] = {c: [] for c in self.classes}
        for b in bins:
            self.rows[p.klass[b.name]].append((room.ram[b.name], p.order[b.name], b.name))
        for rows in self.rows.values():
            rows.sort()

    def candidates(self, need: Need) -> Iterator[str]:
        """Every node the need fits, best first."""
        room = self.room
        for c in self.classes:
            rows = self.rows[c]
            for _, _, node in rows[bisect.bisect_left(rows, (need.ram, -1, "")) :]:
                if need.gpu <= room.gpu[node] and need.devices <= room.dev[node]:
                    yield node

    def take(self, need: Need, node: str) -> None:
        rows = self.rows[self.p.klass[node]]
        rows.pop(bisect.bisect_left(rows, (self.room.ram[node], self.p.order[node], node)))
        self.room.take(need, node)
        bisect.insort(rows, (self.room.ram[node], self.p.order[node], node))


def _uniform(item: Item, every: int) -> Need | None:
    """Its one need when it may use every node and needs the same on each (the same object, as the budget
    builds them per platform, or equal)."""
    if len(item.allowed) != every:
        return None
    needs = item.needs
    kinds = needs.per_kind if isinstance(needs, PerKind) else needs.values()
    distinct = list(dict(zip(map(id, kinds), kinds, strict=True)).values())
    return distinct[0] if all(n == distinct[0] for n in distinct) else None


class Facts:
    """What the passes ask of every hot model, computed once: its uniform need, its size, and on how
    many nodes it could go at all (for a uniform one: how many are large enough)."""

    def __init__(self, bins: list[Bin], hot: list[Item]):
        every = len(bins)
        empty = Room(bins)
        budgets = sorted(b.budget for b in bins)
        self.uniform = {i.name: _uniform(i, every) for i in hot}
        self.size = {}
        for i in hot:
            u = self.uniform[i.name]
            self.size[i.name] = max_need(i) if u is None else u.ram
        self.options = {}
        for i in hot:
            u = self.uniform[i.name]
            self.options[i.name] = (
                every - bisect.bisect_left(budgets, u.ram)
                if u is not None
                else sum(empty.fits(i.needs[n], n) for n in i.allowed)
            )


def _passes(bins: list[Bin], hot: list[Item], order: dict[str, int], f: Facts) -> tuple[Pass, Pass, Pass]:
    strongest = {b.name: 1 if b.gpu_budget is None else -b.gpu_budget for b in bins}  # the largest GPU first
    size, options = f.size, f.options
    by_options = sorted(hot, key=lambda i: (options[i.name], -size[i.name], -i.priority, i.name))
    # every pass keeps the GPU preference: a model goes to a CPU node only where no GPU node takes it
    return (
        Pass("priority", sorted(hot, key=lambda i: (-i.priority, -size[i.name], i.name)), strongest, order, f),
        Pass("constrained", by_options, strongest, order, f),
        Pass("size", sorted(hot, key=lambda i: (-size[i.name], i.name)), strongest, order, f),
    )


def _place_hot(
    bins: list[Bin], hot: list[Item], order: dict[str, int], facts: Facts
) -> tuple[Assignment, str, Pass | None]:
    passes = _passes(bins, hot, order, facts)
    first = _greedy(bins, passes[0])
    if len(first) == len(hot):
        return first, "priority", passes[0]
    for p in passes[1:]:
        found = _greedy(bins, p)
        if len(found) == len(hot):
            return found, p.how, p
    if EXACT_MAX < len(hot) <= FEASIBLE_MAX:
        every = _feasible(bins, _gpu_first(bins, hot))
        if every is not None:
            return every, "exact", None
    if len(hot) <= EXACT_MAX:
        best = _optimum(bins, hot)
        for p in passes:  # the optimum's models, placed the way a pass would if it can
            found = _greedy(bins, p, [i for i in p.ranked if i.name in best])
            if len(found) == len(best):
                return found, "optimum", p
        return best, "optimum", None
    return _repacked(bins, passes[0].ranked, first, passes[1]), "repacked", None


def _best(p: Pass, index: Index, room: Room, item: Item) -> str | None:
    uniform = p.facts.uniform[item.name]
    if uniform is not None:
        return next(index.candidates(uniform), None)
    needs = item.needs
    fits = [p.key(n, room.ram[n] - needs[n].ram) + (k,) for k, n in enumerate(item.allowed) if room.fits(needs[n], n)]
    return item.allowed[min(fits)[-1]] if fits else None


def _greedy(bins: list[Bin], p: Pass, items: Iterable[Item] | None = None) -> Assignment:
    room, out = Room(bins), {}
    index = Index(bins, p, room)
    for item in p.ranked if items is None else items:
        node = _best(p, index, room, item)
        if node is not None:
            index.take(item.needs[node], node)
            out[item.name] = node
    return out


def _explain(bins: list[Bin], p: Pass, home: Assignment) -> dict[str, str]:
    """The winning pass again, saying at each model where it went and what the other nodes would have left."""
    room, out = Room(bins), {}
    index = Index(bins, p, room)
    window = {b.name: b.gpu_budget for b in bins}
    for item in (i for i in p.ranked if i.name in home):
        node = home[item.name]
        needs = item.needs
        uniform = p.facts.uniform[item.name]
        if uniform is not None:
            first = itertools.islice(index.candidates(uniform), SHOWN + 1)
            fits = [(p.key(n, room.ram[n] - uniform.ram), n) for n in first]
        else:
            fits = sorted((p.key(n, room.ram[n] - needs[n].ram), n) for n in item.allowed if room.fits(needs[n], n))
        left = room.ram[node] - needs[node].ram
        others = [f"{n} would leave {gib(room.ram[n] - needs[n].ram)} GiB" for _, n in fits if n != node][:SHOWN]
        if len(fits) <= SHOWN and len(item.allowed) <= 4 * SHOWN:
            misses = sorted((room.short(needs[n], n), n) for n in item.allowed if not room.fits(needs[n], n))
            others += [f"{n} is {gib(short)} GiB short" for short, n in misses[: SHOWN - len(others)]]
        rest = len(item.allowed) - 1 - len(others)
        tail = ("; " + ", ".join(others) if others else "; the only node allowed") + (
            f" (and {rest} other nodes)" if rest > 0 else ""
        )
        stronger = any((window[n] or -1) != (window[node] or -1) for _, n in fits)
        out[item.name] = _why(p.how, node, left, stronger=stronger) + tail
        index.take(needs[node], node)
    return out


def _why(how: str, node: str, left: int, *, stronger: bool) -> str:
    if how != "priority":
        reason = {
            "constrained": "the models with the fewest possible nodes first, then larger first, best fit",
            "size": "larger first, best fit",
        }[how]
        where = "of the nodes it fits, the largest GPU window first, then" if stronger else "which it fits with"
        return (
            f"placed on {node}, {where} the least room left ({gib(left)} GiB of the budget free after "
            f"it; {reason}; priority order alone left a hot model without a node)"
        )
    if stronger:
        return (
            f"placed on {node}: of the nodes it fits, those with the largest GPU window come first, then the "
            f"least room left ({gib(left)} GiB of the budget free after it; hot models in priority order, "
            "larger first)"
        )
    return (
        f"placed on {node}, which it fits with the least room left ({gib(left)} GiB of the budget free "
        "after it; best fit, hot models in priority order, larger first)"
    )


def _feasible(bins: list[Bin], chosen: list[Item], steps: int = SEARCH_STEPS) -> Assignment | None:
    """An assignment of every chosen model, by exact depth-first search (largest first, nodes in file order;
    nodes that every model sees alike and that have the same room left are one choice). None when there is
    none, or none within `steps` node visits."""
    ranked = sorted(chosen, key=lambda i: (-max_need(i), i.name))
    room = Room(bins)
    out: Assignment = {}
    left = [steps]
    sig = {b.name: tuple((b.name in i.allowed, i.needs.get(b.name)) for i in ranked) for b in bins}

    def go(k: int) -> bool:
        if k == len(ranked):
            return True
        item, seen = ranked[k], set()
        for node in item.allowed:
            need = item.needs[node]
            state = (sig[node], room.ram[node], room.gpu[node], room.dev[node])
            if state in seen or not room.fits(need, node):
                continue
            seen.add(state)
            left[0] -= 1
            if left[0] < 0:
                return False
            room.take(need, node)
            out[item.name] = node
            if go(k + 1):
                return True
            room.take(need, node, -1)
            del out[item.name]
        return False

    return dict(out) if go(0) else None


def _gpu_first(bins: list[Bin], hot: list[Item]) -> list[Item]:
    """The models with their allowed nodes largest GPU first (the exact search tries nodes in that order)."""
    strength = {b.name: -1 if b.gpu_budget is None else b.gpu_budget for b in bins}
    return [Item(i.name, i.priority, i.hot, tuple(sorted(i.allowed, key=lambda n: -strength[n])), i.needs) for i in hot]


def _optimum(bins: list[Bin], hot: list[Item]) -> Assignment:
    """The priority-lexicographic optimum: of every subset of the hot models, the one whose priorities
    sorted from the highest are largest (then more bytes, then earlier in the file) that can be placed."""
    file_order = {i.name: k for k, i in enumerate(hot)}

    def rank(subset: tuple[Item, ...]) -> tuple[object, ...]:
        prios = tuple(sorted((i.priority for i in subset), reverse=True))
        return (prios, sum(max_need(i) for i in subset), [-file_order[i.name] for i in subset])

    subsets = [s for r in range(len(hot), 0, -1) for s in itertools.combinations(hot, r)]
    for subset in sorted(subsets, key=rank, reverse=True):
        found = _feasible(bins, list(subset))
        if found is not None:
            return found
    return {}


def _repacked(bins: list[Bin], by_priority: list[Item], first: Assignment, constrained: Pass) -> Assignment:
    """Many hot models, not all placeable: the priority pass's set, then each model it left out (highest
    priority first, up to REPACKS of them) kept if a constrained-first repack places it with the others."""
    placed = set(first)
    best = first
    for item in [i for i in by_priority if i.name not in placed][:REPACKS]:
        trial = [i for i in constrained.ranked if i.name in placed or i is item]
        found = _greedy(bins, constrained, trial)
        if len(found) == len(trial):
            placed.add(item.name)
            best = found
    return best


def _unplaced_why(item: Item, room: Room, by_name: dict[str, Bin], order: dict[str, int]) -> str:
    short, _, node = min((room.short(item.needs[n], n), order[n], n) for n in item.allowed)
    b, need = by_name[node], item.needs[node]
    if need.devices > room.dev[node] and need.ram <= room.ram[node] and need.gpu <= room.gpu[node]:
        return (
            f"fits no node: {node} has the memory but none of its {b.devices} GPU device(s) is free "
            "(each GPU model's pod holds one; raise nodes.NAME.gpu_devices where the device plugin shares the GPU)"
        )
    return (
        f"fits no node: the closest is {node}, {gib(short)} GiB short ({gib(need.ram)} GiB hard quota, "
        f"{gib(room.ram[node])} GiB of its {gib(b.budget)} GiB budget still free"
        + (f"; GPU window {gib(room.gpu[node])} GiB free" if b.gpu_budget is not None else "")
        + ")"
    )


def _generic_why(node: str, how: str, room: Room) -> str:
    reason = {
        "optimum": "not every hot model fits: of all the placements, the one that keeps the highest priorities",
        "repacked": "not every hot model fits: the highest priorities kept, repacked with the constrained first",
        "exact": "no pass of the usual orders placed every hot model; an exact search found a placement of them all",
    }[how]
    return f"placed on {node} ({gib(room.ram[node])} GiB of its budget left with every hot model placed): {reason}"


# -- the cold models ------------------------------------------------------------------------------------
def _cold(
    bins: list[Bin], items: list[Item], hot: list[Item], out: Placement, room: Room, order: dict[str, int]
) -> None:
    """For every cold model, each allowed node where it could start and what it would stop there (umemc.budget.policy
    on paper); its home is where that costs least (fewest evictions, then the earliest node)."""
    cold = [i for i in items if not i.hot]
    held: dict[str, list[policy.Held]] = {b.name: [] for b in bins}  # each node's hot set, on paper
    devices: dict[str, dict[str, int]] = {b.name: {} for b in bins}  # the GPU devices they hold
    for h in hot:
        home = out.home.get(h.name)
        if home is not None:
            need = h.needs[home]
            devices[home][h.name] = need.devices
            held[home].append(policy.Held.on_paper(h.name, h.priority, need.ram, need.gpu))
    starts = {b.name: ColdStarts(held[b.name], b.policy_budget(), room.dev[b.name], devices[b.name]) for b in bins}
    for item in cold:
        where: dict[str, tuple[str, ...]] = {}
        cheapest = (NO_LIMIT, NO_LIMIT)  # (evictions, node order)
        needs, priority = item.needs, item.priority
        for node in item.allowed:
            victims = starts[node].victims(needs[node], priority)
            if victims is None:
                continue
            where[node] = victims
            if (len(victims), order[node]) < cheapest:
                cheapest = (len(victims), order[node])
        out.cold[item.name] = where
        if not where:
            out.home[item.name] = item.allowed[0]
            out.why[item.name] = "cold; admissible on no allowed node (even evicting every lower-priority model)"
            continue
        out.home[item.name] = home = bins[cheapest[1]].name
        evicts = where[home]
        out.why[item.name] = (
            f"cold; starts on {home} "
            + (f"by evicting {', '.join(evicts)}" if evicts else "alongside the hot models there")
            + f"; admissible on {', '.join(itertools.islice(where, SHOWN))}"
            + (f" (and {len(where) - SHOWN} other nodes)" if len(where) > SHOWN else "")
        )


class ColdStarts:
    """What a start on one node stops, for any need (a cold model, a lease): the one eviction policy on paper
    (umemc.budget.policy.OnPaper over the node's hot set) for memory and the GPU window, then, where the start
    needs a GPU device and none is free, further along the same eviction order until one is (the scheduler preempts a
    lower-priority pod for its device as for its memory), as long as every model stopped is of a lower priority."""

    def __init__(self, held: list[policy.Held], budget: policy.Budget, free_devices: int, devices: Mapping[str, int]):
        self.paper = policy.OnPaper(held, budget)
        names = self.paper.names
        self.prefixes = [names[:j] for j in range(len(names) + 1)]  # one tuple per answer, shared
        self.freed = list(itertools.accumulate((devices.get(v, 0) for v in names), initial=free_devices))

    def victims(self, need: Need, priority: int) -> tuple[str, ...] | None:
        """The models a start of this need stops here, in eviction order (empty: it fits alongside); None when it
        cannot start here even so."""
        j = self.paper.evictions(need.ram, need.gpu, priority)
        if j >= 0 and need.devices > self.freed[j]:
            j = bisect.bisect_left(self.freed, need.devices, lo=j)
            if j >= len(self.freed) or self.paper.prios[j - 1] >= priority:
                j = -1
        return None if j < 0 else self.prefixes[j]


def max_need(item: Item) -> int:
    return max(n.ram for n in item.needs.values())
