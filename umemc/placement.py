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

from dataclasses import dataclass, field

from . import policy
from .units import gib


@dataclass(frozen=True)
class Bin:
    name: str
    budget: int  # all-memory budget (bytes)
    gpu_budget: int | None  # None: no GPU window ledger (kind = cpu)


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
    used = {b.name: [0, 0] for b in bins}  # ram, gpu
    by_name = {b.name: b for b in bins}
    out = Placement()
    hot = sorted((i for i in items if i.hot), key=lambda i: (-i.priority, -max_need(i), i.name))
    for item in hot:
        fits: list[tuple[int, int, str]] = []  # (room left, node order, node)
        misses: list[tuple[int, int, str]] = []  # (shortfall, node order, node)
        for node in item.allowed:
            b, need = by_name[node], item.needs[node]
            left = b.budget - used[node][0] - need.ram
            gleft = None if b.gpu_budget is None else b.gpu_budget - used[node][1] - need.gpu
            if left >= 0 and (gleft is None or gleft >= 0):
                fits.append((left, order[node], node))
            else:
                misses.append((max(-left, -(gleft if gleft is not None else 0)), order[node], node))
        misses.sort()
        if not fits:
            short, _, node = misses[0]
            b, need = by_name[node], item.needs[node]
            free = b.budget - used[node][0]
            out.unplaced[item.name] = (
                f"fits no node: the closest is {node}, {gib(short)} GiB short ({gib(need.ram)} GiB hard quota, "
                f"{gib(free)} GiB of its {gib(b.budget)} GiB budget still free"
                + (f"; GPU window {gib(b.gpu_budget - used[node][1])} GiB free" if b.gpu_budget is not None else "")
                + ")"
            )
            continue
        fits.sort()
        left, _, node = fits[0]
        used[node][0] += item.needs[node].ram
        used[node][1] += item.needs[node].gpu
        out.home[item.name] = node
        others = [f"{n} would leave {gib(room)} GiB" for room, _, n in fits[1:]]
        others += [f"{n} is {gib(short)} GiB short" for short, _, n in misses]
        out.why[item.name] = (
            f"placed on {node}, which it fits with the least room left ({gib(left)} GiB of the budget free after "
            f"it; best fit, hot models in priority order, larger first)"
            + (f"; {', '.join(others)}" if others else "; the only node allowed")
        )
    for item in (i for i in items if not i.hot):
        places = []
        for node in item.allowed:
            b = by_name[node]
            held = [
                policy.Held(h.name, h.priority, False, h.needs[node].ram, h.needs[node].gpu, False, True, last_used=0.0)
                for h in hot
                if out.home.get(h.name) == node
            ]
            want = policy.Need(item.name, item.needs[node].ram, item.needs[node].gpu, item.priority, True, False)
            d = policy.decide(want, held, [], policy.Budget(b.budget, b.gpu_budget))
            places.append(ColdPlace(node, d.fits and not d.victims, d.fits, tuple(d.victims) if d.fits else ()))
        out.cold[item.name] = places
        admissible = [p for p in places if p.admissible]
        if admissible:
            home = min(admissible, key=lambda p: (len(p.evicts), order[p.node]))
            out.home[item.name] = home.node
            out.why[item.name] = (
                f"cold; starts on {home.node} "
                + (
                    "alongside the hot models there"
                    if home.fits_alongside_hot
                    else f"by evicting {', '.join(home.evicts)}"
                )
                + f"; admissible on {', '.join(p.node for p in admissible)}"
            )
        else:
            out.home[item.name] = item.allowed[0]
            out.why[item.name] = "cold; admissible on no allowed node (even evicting every lower-priority model)"
    return out


def max_need(item: Item) -> int:
    return max(n.ram for n in item.needs.values())
