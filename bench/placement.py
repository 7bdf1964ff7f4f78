"""Placement (umemc/placement.py): speed at scale and distance from an optimal packing.

    python bench/placement.py

1. Speed: 1000 models (random sizes 1-20 GiB, random priorities, 10% pinned, 10% with an allowed set of
   3 nodes, 20% cold) on 100 nodes of 64-192 GiB; median of 15 runs of `place()`, and one `umemc check`
   of the same stack written as TOML (estimates, per-node plans, the report). Goal: placement well
   under a second.
2. Quality: on small random instances (3 nodes, 7 hot models) an exhaustive search over every
   assignment (each model on a node or left out, 4^7 = 16384) finds (a) whether all models can be
   placed and (b) the most bytes that can be placed; umemc's greedy placement is compared with both.
"""

from __future__ import annotations

import itertools
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_section
from umemc.placement import Bin, Item, Need, place

GiB = 2**30


def big_instance(rng: random.Random) -> tuple[list[Bin], list[Item]]:
    bins = [Bin(f"n{i:03d}", int(rng.choice((64, 96, 128, 192)) * GiB * 0.8), None) for i in range(100)]
    names = [b.name for b in bins]
    items = []
    for i in range(1000):
        size = int(rng.uniform(1, 20) * GiB)
        r = rng.random()
        allowed = (rng.choice(names),) if r < 0.1 else tuple(rng.sample(names, 3)) if r < 0.2 else tuple(names)
        items.append(
            Item(f"m{i:04d}", rng.randrange(101), rng.random() >= 0.2, allowed, {n: Need(size, 0) for n in allowed})
        )
    return bins, items


def speed(rng: random.Random) -> tuple[float, int, int]:
    bins, items = big_instance(rng)
    times, result = [], None
    for _ in range(15):
        t0 = time.perf_counter()
        result = place(bins, items)
        times.append(time.perf_counter() - t0)
    assert result is not None
    hot = sum(i.hot for i in items)
    return statistics.median(times), hot - len(result.unplaced), hot


def check_speed(rng: random.Random) -> float:
    """`umemc check` of a 100-node, 1000-model stack (command models with explicit memory)."""
    lines = ['version = 1\nname = "big"\n']
    for i in range(100):
        lines.append(f'[nodes.n{i:03d}]\nkind = "cpu"\nmemory = "{rng.choice((64, 96, 128, 192))}GiB"\n')
    for i in range(1000):
        mode = "cold" if rng.random() < 0.2 else "hot"
        lines.append(
            f'[models.m{i:04d}]\nruntime = "command"\ncommand = ["true"]\nmemory = "{rng.randint(1, 20)}GiB"\n'
            f'priority = {rng.randrange(101)}\nmode = "{mode}"\n'
        )
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.toml"
        path.write_text("\n".join(lines))
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "umemc", "check", str(path), "--format", "json"], capture_output=True)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def optimal(bins: list[Bin], items: list[Item]) -> tuple[bool, int]:
    """Exhaustive: can every item be placed, and the most bytes any assignment places."""
    best, all_fit = 0, False
    for choice in itertools.product(range(len(bins) + 1), repeat=len(items)):  # len(bins): left out
        used = [0] * len(bins)
        ok = True
        for item, c in zip(items, choice, strict=True):
            if c < len(bins):
                used[c] += item.needs[bins[c].name].ram
                if used[c] > bins[c].budget:
                    ok = False
                    break
        if not ok:
            continue
        placed = sum(i.needs[bins[0].name].ram for i, c in zip(items, choice, strict=True) if c < len(bins))
        best = max(best, placed)
        all_fit = all_fit or all(c < len(bins) for c in choice)
    return all_fit, best


def quality(rng: random.Random, n: int = 300) -> dict[str, float]:
    feasible = greedy_all = placed_all = same_bytes = 0
    ratios = []
    for _ in range(n):
        bins = [Bin(f"b{i}", int(rng.uniform(40, 100) * GiB), None) for i in range(3)]
        names = tuple(b.name for b in bins)
        items = []
        for k in range(7):
            size = int(rng.uniform(5, 60) * GiB)
            items.append(Item(f"i{k}", rng.randrange(101), True, names, {b: Need(size, 0) for b in names}))
        all_fit, best = optimal(bins, items)
        result = place(bins, items)
        got = sum(i.needs["b0"].ram for i in items if i.name in result.home)
        feasible += all_fit
        searched = any("exhaustive search" in w for w in result.why.values())
        greedy_all += all_fit and result.ok and not searched
        placed_all += all_fit and result.ok
        same_bytes += got == best
        ratios.append(got / best if best else 1.0)
    return {
        "n": n,
        "feasible": feasible,
        "greedy_all": greedy_all,
        "placed_all": placed_all,
        "same_bytes": same_bytes,
        "median": statistics.median(ratios),
        "worst": min(ratios),
    }


def main() -> int:
    rng = random.Random(20261201)
    t, placed, hot = speed(rng)
    print(f"place(): 1000 models on 100 nodes, median of 15: {t * 1000:.1f} ms ({placed} of {hot} hot placed)")
    c = check_speed(rng)
    print(f"umemc check on the same scale (TOML, estimates, per-node plans): median of 3: {c:.2f} s")
    q = quality(rng)
    print(q)
    text = "\n".join(
        [
            f"- `place()`: 1000 models (800 hot) on 100 nodes: **{t * 1000:.1f} ms** median of 15 "
            f"({placed} of {hot} hot models placed; the rest exceed what is left). Goal: well under 1 s.",
            f"- `umemc check` of a 100-node, 1000-model stack end to end (TOML, estimates, per-node plans, "
            f"JSON report): {c:.2f} s median of 3.",
            f"- Against an exhaustive search, {q['n']} random instances of 7 hot models on 3 nodes (5-60 GiB "
            f"models, 40-100 GiB budgets): an assignment placing every model existed in {q['feasible']}; the "
            f"greedy placement alone found one in {q['greedy_all']} of those, and with the bounded exhaustive "
            f"search it runs when the greedy one leaves a model out, in {q['placed_all']}. It placed as many "
            "bytes as the "
            f"optimum in {q['same_bytes']} of {q['n']}; placed bytes / optimum: median {q['median']:.3f}, worst "
            f"{q['worst']:.3f}. (The greedy places by priority first, so where not everything fits it keeps the "
            "high-priority models even when leaving them out would pack more bytes.)",
        ]
    )
    print(text)
    write_section("Placement on several nodes (bench/placement.py)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
