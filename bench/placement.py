"""Placement (umemc/budget/placement.py) and `umemc check` of many-node stacks: speed against an anchor measured in
the same run, and distance from the optimum.

    python bench/placement.py

1. Speed: `umemc check` (TOML, estimates, placement, per-node plans, the JSON report; and the default
   terminal table) of 1000 models on 100 nodes and of 5000 on 500 (models of 1-20 GiB scaled so that demand
   is about 55% of the budgets; 10% pinned, 10% with three allowed nodes, 20% cold), median of 3, as a
   ratio to `python -c "import pydantic"` (median of 7) on the same machine. Goals: 10x and 30x. `place()`
   alone, median of 5.
2. Quality: 300 random instances (2-3 nodes, some with a GPU of 1-3 devices; 3-8 hot models with allowed
   sets and tied priorities) against an exhaustive search of every assignment: whether every model is
   placed when that is possible, and whether the placed set is the priority-lexicographic optimum.
"""

from __future__ import annotations

import itertools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import timed, write_section
from umemc.budget.placement import Bin, Item, Need, place

GiB = 2**30
PY = sys.executable


def median_run(argv: list[str], n: int) -> float:
    times = []
    for _ in range(n):
        times.append(timed(argv, ok=(0, 1)))  # 1: the stack does not fit, an answer; 2 or a crash is none
    return statistics.median(times)


def stack_text(models: int, nodes: int, rng: random.Random) -> str:
    names = [f"n{i:03d}" for i in range(nodes)]
    sizes = {n: rng.choice((64, 96, 128, 192)) for n in names}
    lines = ['version = 1\nname = "big"\n']
    lines += [f'[nodes.{n}]\nkind = "cpu"\nmemory = "{sizes[n]}GiB"\n' for n in names]
    budget_gib = sum((s - 4) * 0.85 for s in sizes.values())  # os_reserve 4 GiB, safety margin 15%
    scale = 0.55 * budget_gib / (models * 10.5 * 1.1)  # hard quota = memory x 1.1
    for i in range(models):
        r = rng.random()
        pin = f'node = "{rng.choice(names)}"\n' if r < 0.1 else ""
        if 0.1 <= r < 0.2:
            pin = "nodes = [" + ", ".join(f'"{x}"' for x in rng.sample(names, 3)) + "]\n"
        mode = "cold" if rng.random() < 0.2 else "hot"
        lines.append(
            f'[models.m{i:04d}]\nruntime = "command"\ncommand = ["true"]\nimage = "registry.example.com/serve:1.0"\n'
            f'memory = "{int(rng.uniform(1, 20) * 1024 * scale)}MiB"\npriority = {rng.randrange(101)}\n'
            f'mode = "{mode}"\n{pin}'
        )
    return "\n".join(lines)


def speed(rng: random.Random) -> list[tuple[int, int, float, float, float, int, int, float]]:
    from umemc.budget.plan import make_plan
    from umemc.stack.resolve import load_stack

    rows = []
    with tempfile.TemporaryDirectory() as d:
        for models, nodes in ((1000, 100), (5000, 500)):
            path = Path(d) / f"big{models}.toml"
            path.write_text(stack_text(models, nodes, rng))
            check = median_run([PY, "-m", "umemc", "check", str(path), "--format", "json"], 3)
            table = median_run([PY, "-m", "umemc", "check", str(path)], 3)  # the terminal report
            plan = make_plan(load_stack(path))
            assert plan.placement is not None
            hot = sum(m.hot for m in plan.models.values())
            out = Path(d) / f"k{models}"  # the manifests of the same stack (a rebuild replaces the previous one)
            kube = median_run([PY, "-m", "umemc", "build", str(path), "--target", "kubernetes", "-o", str(out)], 3)
            placed = hot - len(plan.placement.unplaced)
            rows.append((models, nodes, check, table, _place_time(path), placed, hot, kube))
    return rows


def _place_time(path: Path) -> float:
    """place() alone on the stack's own bins and items (the budget stage builds them)."""
    from umemc.budget import plan as budget
    from umemc.stack.resolve import load_stack

    captured: dict[str, tuple[list[Bin], list[Item]]] = {}
    real = budget.place

    def spy(bins: list[Bin], items: list[Item]):  # type: ignore[no-untyped-def]
        captured["args"] = (bins, items)
        return real(bins, items)

    budget.place = spy  # type: ignore[assignment]
    try:
        budget.make_plan(load_stack(path))
    finally:
        budget.place = real
    bins, items = captured["args"]
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        place(bins, items)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def brute_force(bins: list[Bin], items: list[Item]) -> tuple[int, ...]:
    best: tuple[int, ...] = ()
    for choice in itertools.product(*[(None, *i.allowed) for i in items]):
        used: dict[str, list[int]] = {b.name: [0, 0, 0] for b in bins}
        for item, node in zip(items, choice, strict=True):
            if node is not None:
                need, u = item.needs[node], used[node]
                u[0], u[1], u[2] = u[0] + need.ram, u[1] + need.gpu, u[2] + need.devices
        if all(
            u[0] <= b.budget
            and (b.gpu_budget is None or u[1] <= b.gpu_budget)
            and (b.devices is None or u[2] <= b.devices)
            for b, u in ((b, used[b.name]) for b in bins)
        ):
            chosen = [i.priority for i, n in zip(items, choice, strict=True) if n is not None]
            best = max(best, tuple(sorted(chosen, reverse=True)))
    return best


def instance(rng: random.Random) -> tuple[list[Bin], list[Item]]:
    bins = []
    for k in range(rng.choice((2, 3))):
        gpu = rng.random() < 0.5
        budget = int(rng.uniform(20, 60) * GiB)
        bins.append(Bin(f"n{k}", budget, budget if gpu else None, devices=rng.choice((1, 2, 3)) if gpu else None))
    by = {b.name: b for b in bins}
    names = tuple(by)
    items = []
    for k in range(rng.randint(3, 8)):
        size = int(rng.uniform(4, 30) * GiB)
        r = rng.random()
        allowed = (rng.choice(names),) if r < 0.2 else tuple(sorted(rng.sample(names, 2))) if r < 0.4 else names
        needs = {n: Need(size, size if by[n].gpu_budget else 0, 1 if by[n].devices else 0) for n in allowed}
        items.append(Item(f"m{k}", rng.choice((10, 30, 50, 50, 70, 90)), True, allowed, needs))
    return bins, items


def quality(rng: random.Random, n: int = 300) -> dict[str, int]:
    out = {"n": n, "feasible": 0, "placed_all": 0, "optimum": 0}
    for _ in range(n):
        bins, items = instance(rng)
        result = place(bins, items)
        want = brute_force(bins, items)
        got = tuple(sorted((i.priority for i in items if i.name in result.home), reverse=True))
        full = len(want) == len(items)
        out["feasible"] += full
        out["placed_all"] += full and result.ok
        out["optimum"] += got == want
    return out


def main() -> int:
    rng = random.Random(20261201)
    anchor = median_run([PY, "-c", "import pydantic"], 7)
    rows = speed(rng)
    q = quality(rng)
    lines = [
        f'Anchor: `python -c "import pydantic"` {anchor * 1000:.0f} ms (median of 7, this run).',
        "",
        "| stack | `umemc check --format json` (median of 3) | ratio to the anchor | goal | the table (default "
        "format) | ratio | `place()` alone | hot placed | `build --target kubernetes` (median of 3) | to check |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (models, nodes, check, table, placed_s, placed, hot, kube), goal in zip(rows, (10, 30), strict=True):
        lines.append(
            f"| {models} models, {nodes} nodes | {check:.2f} s | {check / anchor:.1f}x | {goal}x | {table:.2f} s | "
            f"{table / anchor:.1f}x | {placed_s * 1000:.0f} ms | {placed} of {hot} | {kube:.1f} s | "
            f"{kube / check:.1f}x |"
        )
    lines += [
        "",
        f"Against an exhaustive search of every assignment, {q['n']} random instances (2-3 nodes, some with a GPU "
        f"of 1-3 devices, 3-8 hot models with allowed sets and tied priorities): every model could be placed in "
        f"{q['feasible']}, and the placement placed every model in {q['placed_all']} of those (no false "
        f"'does not fit'); the placed set was the priority-lexicographic optimum in {q['optimum']} of {q['n']}.",
    ]
    text = "\n".join(lines)
    print(text)
    write_section("Placement on several nodes (bench/placement.py)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
