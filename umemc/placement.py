"""Placing a stack's models on several machines: pure arithmetic on hard quotas, no I/O.

Hot models go first, higher priority first, then larger first (first-fit decreasing is the classic
bin-packing heuristic); each goes to the allowed node where it fits both ledgers (all memory and the
GPU window, each within its safety margin) and leaves the least room: best fit, which keeps large holes
for the large models still to come. Ties break on the node's file order, so the same stack always gets
the same placement. A model that fits nowhere is reported with the node that came closest and by how
much. Cold models are not placed: for each allowed node the eviction policy (umemc.policy) says whether
they could start there and what they would stop; their home is the node where that costs least.

bench/placement.py measures it against an exhaustive search on small instances.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass, field

from . import policy
from .units import gib

NO_WINDOW = 1 << 62
SHOWN = 3  # other nodes named in a model's explanation
SEARCH_MAX_MODELS = 64  # when the greedy placement leaves a hot model out, search exhaustively up to this many
SEARCH_STEPS = 200_000  # ... and this many node visits (about a second of Python)


@dataclass(frozen=True)
class Bin:
    name: str
    budget: int  # all-memory budget (bytes)
    gpu_budget: int | None  # None: no GPU window ledger (kind = cpu)
    usable: int = 0  # for the pressure rule of cold starts (umemc.policy.Budget)
    load_below: float = 1.0

    def policy_budget(self) -> policy.Budget:
        return policy.Budget(self.budget, self.gpu_budget, usable=self.usable, load_below=self.load_below)


@dataclass(frozen=True)
class Need:
    ram: int  # hard quota
    gpu: int  # hard quota in the GPU window


@dataclass(frozen=True)
class Item:
    name: str
    priority: int
    hot: bool
    allowed: tuple[str, ...]  # node names, in the stack's node order
    needs: dict[str, Need]  # per allowed node: its quotas there (estimates depend on the node's platform)


@dataclass(frozen=True)
class ColdPlace:
    node: str
    fits_alongside_hot: bool
    admissible: bool
    evicts: tuple[str, ...]


@dataclass
class Placement:
    home: dict[str, str] = field(default_factory=dict)  # model -> node (hot: placed; cold: cheapest admission)
    why: dict[str, str] = field(default_factory=dict)  # model -> a sentence for `umemc explain`
    unplaced: dict[str, str] = field(default_factory=dict)  # hot model -> why it fits nowhere
    cold: dict[str, list[ColdPlace]] = field(default_factory=dict)  # cold model -> per allowed node

    @property
    def ok(self) -> bool:
        return not self.unplaced


def place(bins: list[Bin], items: list[Item]) -> Placement:
    order = {b.name: i for i, b in enumerate(bins)}
    free, gfree = room(bins)
    by_name = {b.name: b for b in bins}
    out = Placement()
    hot = sorted((i for i in items if i.hot), key=lambda i: (-i.priority, -max_need(i), i.name))
    for item in hot:
        needs = item.needs
        fits = [  # (room left, node order, node): one comprehension, the hot path of a 1000-model stack
            (free[n] - needs[n].ram, order[n], n)
            for n in item.allowed
            if free[n] >= needs[n].ram and gfree[n] >= needs[n].gpu
        ]
        misses = (
            [(max(needs[n].ram - free[n], needs[n].gpu - gfree[n]), order[n], n) for n in item.allowed]
            if len(fits) <= SHOWN
            else []
        )
        misses = [m for m in misses if m[0] > 0]
        if not fits:
            short, _, node = min(misses)
            b, need = by_name[node], item.needs[node]
            out.unplaced[item.name] = (
                f"fits no node: the closest is {node}, {gib(short)} GiB short ({gib(need.ram)} GiB hard quota, "
                f"{gib(free[node])} GiB of its {gib(b.budget)} GiB budget still free"
                + (f"; GPU window {gib(gfree[node])} GiB free" if b.gpu_budget is not None else "")
                + ")"
            )
            continue
        first = heapq.nsmallest(1 + SHOWN, fits)
        left, _, node = first[0]
        free[node] -= needs[node].ram
        gfree[node] -= needs[node].gpu
        out.home[item.name] = node
        others = [f"{n} would leave {gib(room)} GiB" for room, _, n in first[1:]]
        others += [f"{n} is {gib(short)} GiB short" for short, _, n in heapq.nsmallest(SHOWN - len(others), misses)]
        rest = len(item.allowed) - 1 - len(others)
        out.why[item.name] = (
            f"placed on {node}, which it fits with the least room left ({gib(left)} GiB of the budget free after "
            f"it; best fit, hot models in priority order, larger first)"
            + (f"; {', '.join(others)}" if others else "; the only node allowed")
            + (f" (and {rest} other nodes)" if rest > 0 else "")
        )
    if out.unplaced and len(hot) <= SEARCH_MAX_MODELS:
        found = search(bins, hot, SEARCH_STEPS)
        if found is not None:  # every hot model has a node after all: use that assignment
            left_out = ", ".join(out.unplaced)
            out.unplaced.clear()
            free, gfree = room(bins)
            for item in hot:
                node = found[item.name]
                free[node] -= item.needs[node].ram
                gfree[node] -= item.needs[node].gpu
                out.home[item.name] = node
            for item in hot:
                node = found[item.name]
                out.why[item.name] = (
                    f"placed on {node} by an exhaustive search ({gib(free[node])} GiB of its budget left): the greedy "
                    f"placement (priority first, best fit) left {left_out} without a node"
                )
    held: dict[str, list[policy.Held]] = {b.name: [] for b in bins}  # each node's hot set, on paper
    for h in hot:
        home = out.home.get(h.name)
        if home is not None:
            need = h.needs[home]
            held[home].append(policy.Held(h.name, h.priority, False, need.ram, need.gpu, False, True, last_used=0.0))
    lower: dict[str, tuple[list[int], list[int], list[int]]] = {}  # per node: priorities, prefix sums
    for node, hs in held.items():
        ranked = sorted(hs, key=lambda h: h.priority)
        lower[node] = (
            [h.priority for h in ranked],
            list(itertools.accumulate((h.ram for h in ranked), initial=0)),
            list(itertools.accumulate((h.gpu for h in ranked), initial=0)),
        )
    for item in (i for i in items if not i.hot):
        places = []
        for node in item.allowed:
            b, need = by_name[node], item.needs[node]
            calm = not b.usable or (b.budget - free[node]) / b.usable < b.load_below  # the pressure rule, on paper
            if need.ram <= free[node] and need.gpu <= gfree[node] and calm:
                places.append(ColdPlace(node, True, True, ()))  # fits as things are: nothing to decide
                continue
            prios, ram_upto, gpu_upto = lower[node]
            k = bisect.bisect_left(prios, item.priority)  # the policy only ever stops lower priorities
            if need.ram > free[node] + ram_upto[k] or need.gpu > gfree[node] + gpu_upto[k]:
                places.append(ColdPlace(node, False, False, ()))
                continue
            want = policy.Need(item.name, need.ram, need.gpu, item.priority, True, False)
            d = policy.decide(want, held[node], [], b.policy_budget())
            places.append(ColdPlace(node, d.fits and not d.victims, d.fits, tuple(d.victims) if d.fits else ()))
        out.cold[item.name] = places
        admissible = [p for p in places if p.admissible]
        if admissible:
            cheapest = min(admissible, key=lambda p: (len(p.evicts), order[p.node]))
            out.home[item.name] = cheapest.node
            out.why[item.name] = (
                f"cold; starts on {cheapest.node} "
                + (
                    "alongside the hot models there"
                    if cheapest.fits_alongside_hot
                    else f"by evicting {', '.join(cheapest.evicts)}"
                )
                + f"; admissible on {', '.join(p.node for p in admissible)}"
            )
        else:
            out.home[item.name] = item.allowed[0]
            out.why[item.name] = "cold; admissible on no allowed node (even evicting every lower-priority model)"
    return out


def search(bins: list[Bin], hot: list[Item], steps: int) -> dict[str, str] | None:
    """Depth-first search for an assignment that gives every hot model a node (largest first, each node
    tried in file order; interchangeable nodes with the same room left are one choice). Bounded by `steps` node
    visits, so a large stack that the greedy placement cannot fit is reported rather than searched for
    minutes. Deterministic: the first assignment in this order."""
    order = sorted(hot, key=lambda i: (-max_need(i), i.name))
    free, gfree = room(bins)
    chosen: dict[str, str] = {}
    budget = [steps]
    # nodes that every model sees alike (same allowed-ness, same quotas) and with the same room left are
    # one choice: trying the second one would only repeat the first one's subtree
    sig = {b.name: tuple((b.name in i.allowed, i.needs.get(b.name)) for i in order) for b in bins}

    def go(k: int) -> bool:
        if k == len(order):
            return True
        item, seen = order[k], set()
        for node in item.allowed:
            need = item.needs[node]
            state = (sig[node], free[node], gfree[node])
            if need.ram > free[node] or need.gpu > gfree[node] or state in seen:
                continue
            seen.add(state)
            budget[0] -= 1
            if budget[0] < 0:
                return False
            free[node] -= need.ram
            gfree[node] -= need.gpu
            chosen[item.name] = node
            if go(k + 1):
                return True
            free[node] += need.ram
            gfree[node] += need.gpu
            del chosen[item.name]
        return False

    return dict(chosen) if go(0) else None


def room(bins: list[Bin]) -> tuple[dict[str, int], dict[str, int]]:
    """Each empty node's budget on both ledgers (a node without a GPU window is never short there)."""
    return {b.name: b.budget for b in bins}, {b.name: NO_WINDOW if b.gpu_budget is None else b.gpu_budget for b in bins}


def max_need(item: Item) -> int:
    return max(n.ram for n in item.needs.values())
