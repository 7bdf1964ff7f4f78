"""umemc.budget.placement on its own (pure arithmetic): against a brute force of every assignment on small random
instances (the priority-lexicographic optimum, and never a false "does not fit"), the passes on hand-made
instances, GPU devices as a third ledger, and a large random instance at half its capacity."""

from __future__ import annotations

import itertools
import random

import pytest

from umemc.budget.placement import Bin, Item, Need, place

GiB = 2**30


def brute_force(bins: list[Bin], items: list[Item]) -> tuple[int, ...]:
    """The largest sorted priority vector of any assignment (each hot model on an allowed node or left out)
    that keeps every node within its three ledgers."""
    best: tuple[int, ...] = ()
    hot = [i for i in items if i.hot]
    for choice in itertools.product(*[(None, *i.allowed) for i in hot]):
        ram = {b.name: 0 for b in bins}
        gpu = {b.name: 0 for b in bins}
        dev = {b.name: 0 for b in bins}
        for item, node in zip(hot, choice, strict=True):
            if node is not None:
                need = item.needs[node]
                ram[node] += need.ram
                gpu[node] += need.gpu
                dev[node] += need.devices
        if all(
            ram[b.name] <= b.budget
            and (b.gpu_budget is None or gpu[b.name] <= b.gpu_budget)
            and (b.devices is None or dev[b.name] <= b.devices)
            for b in bins
        ):
            prios = tuple(sorted((i.priority for i, n in zip(hot, choice, strict=True) if n is not None), reverse=True))
            best = max(best, prios)
    return best


def valid(bins: list[Bin], items: list[Item], home: dict[str, str]) -> bool:
    by = {b.name: b for b in bins}
    used: dict[str, list[int]] = {b.name: [0, 0, 0] for b in bins}
    for i in items:
        if i.hot and i.name in home:
            assert home[i.name] in i.allowed
            need = i.needs[home[i.name]]
            u = used[home[i.name]]
            u[0], u[1], u[2] = u[0] + need.ram, u[1] + need.gpu, u[2] + need.devices
    return all(
        u[0] <= by[n].budget
        and (by[n].gpu_budget is None or u[1] <= (by[n].gpu_budget or 0))
        and (by[n].devices is None or u[2] <= (by[n].devices or 0))
        for n, u in used.items()
    )


def random_instance(rng: random.Random) -> tuple[list[Bin], list[Item]]:
    bins = []
    for k in range(rng.choice((2, 3))):
        gpu = rng.random() < 0.5
        budget = int(rng.uniform(20, 60) * GiB)
        bins.append(Bin(f"n{k}", budget, budget if gpu else None, devices=rng.choice((1, 2, 3)) if gpu else None))
    names = tuple(b.name for b in bins)
    items = []
    for k in range(rng.randint(3, 8)):
        size = int(rng.uniform(4, 30) * GiB)
        r = rng.random()
        allowed = (rng.choice(names),) if r < 0.2 else tuple(sorted(rng.sample(names, 2))) if r < 0.4 else names
        by = {b.name: b for b in bins}
        needs = {n: Need(size, size if by[n].gpu_budget else 0, 1 if by[n].devices else 0) for n in allowed}
        items.append(Item(f"m{k}", rng.choice((10, 30, 50, 50, 70, 90)), True, allowed, needs))
    return bins, items


def test_the_priority_lexicographic_optimum_on_300_random_instances() -> None:
    rng = random.Random(20261201)
    full = 0
    for _ in range(300):
        bins, items = random_instance(rng)
        result = place(bins, items)
        assert valid(bins, items, result.home)
        got = tuple(sorted((i.priority for i in items if i.name in result.home), reverse=True))
        want = brute_force(bins, items)
        assert got == want, (bins, items, result.home)
        full += len(want) == len(items)
        assert result.ok == (len(want) == len(items))  # never a false "does not fit"
    assert 60 < full < 240  # both kinds of instance were met (hand-checked count: 141)


def test_a_pinned_model_is_placed_before_one_that_may_go_anywhere() -> None:
    # a and b: 10 GiB each. big (6 GiB, priority 90) may use both; pinned (6 GiB, priority 10) only a. Priority
    # first puts big on a (empty nodes: file order) and leaves pinned out; constrained first places both.
    bins = [Bin("a", 10 * GiB, None), Bin("b", 10 * GiB, None)]
    items = [
        Item("big", 90, True, ("a", "b"), {"a": Need(6 * GiB, 0), "b": Need(6 * GiB, 0)}),
        Item("pinned", 10, True, ("a",), {"a": Need(6 * GiB, 0)}),
    ]
    result = place(bins, items)
    assert result.ok and result.home == {"big": "b", "pinned": "a"}


def test_a_gpu_device_is_held_by_one_model() -> None:
    # one device per GPU node: two GPU models that would fit one node's memory go one per node
    bins = [Bin("a", 100 * GiB, 100 * GiB, devices=1), Bin("b", 100 * GiB, 100 * GiB, devices=1)]
    needs = {"a": Need(10 * GiB, 10 * GiB, 1), "b": Need(10 * GiB, 10 * GiB, 1)}
    items = [Item("p", 60, True, ("a", "b"), needs), Item("q", 50, True, ("a", "b"), needs)]
    assert place(bins, items).home == {"p": "a", "q": "b"}
    third = place(bins, [*items, Item("r", 40, True, ("a", "b"), needs)])
    assert third.unplaced == {
        "r": "fits no node: a has the memory but none of its 1 GPU device(s) is free (each GPU model's pod holds "
        "one; raise nodes.NAME.gpu_devices where the device plugin shares the GPU)"
    }


def test_high_priority_goes_to_the_largest_gpu_not_the_tightest_fit() -> None:
    # a Jetson-sized node (32 GiB window) and a Spark-sized one (100 GiB), and a CPU node: the 30 GiB
    # priority-95 model fits all three; best fit alone would pick the Jetson
    bins = [Bin("cpu", 40 * GiB, None), Bin("jetson", 32 * GiB, 32 * GiB), Bin("spark", 100 * GiB, 100 * GiB)]
    needs = {"cpu": Need(30 * GiB, 0), "jetson": Need(30 * GiB, 30 * GiB), "spark": Need(30 * GiB, 30 * GiB)}
    small = {"cpu": Need(2 * GiB, 0), "jetson": Need(2 * GiB, 2 * GiB), "spark": Need(2 * GiB, 2 * GiB)}
    items = [Item("big", 95, True, tuple(needs), needs), Item("tiny", 10, True, tuple(small), small)]
    result = place(bins, items)
    assert result.home == {"big": "spark", "tiny": "spark"}
    assert result.why["big"] == (
        "placed on spark: of the nodes it fits, those with the largest GPU window come first, then the least room "
        "left (70.0 GiB of the budget free after it; hot models in priority order, larger first); jetson would "
        "leave 2.0 GiB, cpu would leave 10.0 GiB"
    )


@pytest.mark.parametrize(("models", "nodes"), [(1000, 100), (5000, 500)])
def test_no_false_does_not_fit_at_scale(models: int, nodes: int) -> None:
    """Demand at about 55% of capacity, 10% of the models pinned and 10% with three allowed nodes: every
    model fits (a pinned model alone never exceeds its node), and the placement says so."""
    rng = random.Random(models)
    bins = [Bin(f"n{i:03d}", int(rng.choice((64, 96, 128, 192)) * GiB * 0.8), None) for i in range(nodes)]
    names = [b.name for b in bins]
    capacity = sum(b.budget for b in bins)
    scale = 0.55 * capacity / (models * 10.5 * GiB)  # uniform(1, 20) GiB averages 10.5 GiB
    items = []
    for i in range(models):
        size = int(rng.uniform(1, 20) * GiB * scale)
        r = rng.random()
        allowed = (rng.choice(names),) if r < 0.1 else tuple(rng.sample(names, 3)) if r < 0.2 else tuple(names)
        need = Need(size, 0)  # one object for every node, as the budget builds them per platform
        items.append(Item(f"m{i:04d}", rng.randrange(101), True, allowed, dict.fromkeys(allowed, need)))
    demand = sum(next(iter(i.needs.values())).ram for i in items) / capacity
    assert 0.5 < demand < 0.6
    result = place(bins, items)
    assert result.ok and valid(bins, items, result.home)


def feasible(bins: list[Bin], items: list[Item]) -> bool:
    """Whether every hot model can be placed: a plain depth-first search of this test's own (largest first,
    every allowed node), independent of the placement's."""
    room = {b.name: [b.budget, NO if b.gpu_budget is None else b.gpu_budget, NO if b.devices is None else b.devices]
            for b in bins}  # fmt: skip
    ranked = sorted((i for i in items if i.hot), key=lambda i: -max(n.ram for n in i.needs.values()))

    def go(k: int) -> bool:
        if k == len(ranked):
            return True
        tried = set()
        for node in ranked[k].allowed:
            need, left = ranked[k].needs[node], room[node]
            if (node_state := (tuple(left), need)) in tried:
                continue
            tried.add(node_state)
            if need.ram <= left[0] and need.gpu <= left[1] and need.devices <= left[2]:
                left[0], left[1], left[2] = left[0] - need.ram, left[1] - need.gpu, left[2] - need.devices
                if go(k + 1):
                    return True
                left[0], left[1], left[2] = left[0] + need.ram, left[1] + need.gpu, left[2] + need.devices
        return False

    return go(0)


NO = 1 << 62


def test_no_false_does_not_fit_up_to_16_hot_models() -> None:
    """9 to 16 hot models on 2-3 nodes (some with a GPU of 1-3 devices... and a device budget that binds),
    demand near capacity: wherever this test's own search finds a placement of them all, the placement places
    them all (the greedy passes, then an exact search)."""
    rng = random.Random(16)
    feasible_seen = 0
    for _ in range(160):
        bins = []
        for k in range(rng.choice((2, 3))):
            gpu = rng.random() < 0.5
            budget = int(rng.uniform(40, 100) * GiB)
            bins.append(Bin(f"n{k}", budget, budget if gpu else None, devices=rng.choice((4, 8, 16)) if gpu else None))
        by = {b.name: b for b in bins}
        names = tuple(by)
        count = rng.randint(9, 16)
        capacity = sum(b.budget for b in bins)
        items = []
        for k in range(count):
            size = int(rng.uniform(0.3, 1.7) * capacity * rng.uniform(0.85, 1.0) / count)
            r = rng.random()
            allowed = (rng.choice(names),) if r < 0.15 else tuple(sorted(rng.sample(names, 2))) if r < 0.35 else names
            needs = {n: Need(size, size if by[n].gpu_budget else 0, 1 if by[n].devices else 0) for n in allowed}
            items.append(Item(f"m{k}", rng.choice((10, 30, 50, 70, 90)), True, allowed, needs))
        result = place(bins, items)
        assert valid(bins, items, result.home)
        if feasible(bins, items):
            feasible_seen += 1
            assert result.ok, (bins, items, result.unplaced)
        else:
            assert not result.ok
    assert 40 < feasible_seen < 140  # both kinds were met


def test_every_pass_keeps_the_gpu_preference() -> None:
    """Where the priority pass cannot place every hot model and another pass wins, a model that pass put on a CPU
    node had no GPU node left for it: at the end, none of its allowed GPU nodes has the room it takes (on 400
    random instances of 4-10 models on a CPU node and two GPU nodes)."""
    rng = random.Random(95)
    checked = 0
    for _ in range(400):
        gpu_budget = int(rng.uniform(60, 120) * GiB)
        bins = [Bin("cpu", int(rng.uniform(60, 160) * GiB), None)]
        bins += [Bin(f"spark{k}", gpu_budget, gpu_budget) for k in (1, 2)]
        names = tuple(b.name for b in bins)
        items = []
        for k in range(rng.randint(4, 10)):
            size = int(rng.uniform(10, 70) * GiB)
            r = rng.random()
            allowed = (rng.choice(names),) if r < 0.3 else tuple(sorted(rng.sample(names, 2))) if r < 0.5 else names
            needs = {n: Need(size, 0 if n == "cpu" else size) for n in allowed}
            items.append(Item(f"m{k}", rng.choice((10, 50, 90, 95)), True, allowed, needs))
        result = place(bins, items)
        left = {b.name: [b.budget, b.gpu_budget or 0] for b in bins}
        for i in items:
            if i.name in result.home:
                need = i.needs[result.home[i.name]]
                left[result.home[i.name]][0] -= need.ram
                left[result.home[i.name]][1] -= need.gpu
        for i in items:
            node = result.home.get(i.name)
            if node != "cpu" or "priority order alone left a hot model without a node" not in result.why[i.name]:
                continue
            checked += 1
            for n in i.allowed:
                if n != "cpu":
                    assert not (i.needs[n].ram <= left[n][0] and i.needs[n].gpu <= left[n][1]), (i.name, n, result.why)
    assert checked > 10  # the case was met


def test_a_cold_gpu_model_preempts_the_lower_priority_holder_of_the_only_device() -> None:
    """A node with one GPU device held by a priority-20 model and memory to spare: a priority-80 cold GPU model is
    admissible there by stopping the holder (the scheduler preempts it for its device), not 'admissible on no
    node'; a priority-10 one is not (it may stop only lower priorities)."""
    bins = [Bin("gpu", 100 * GiB, 100 * GiB, devices=1)]
    needs = {"gpu": Need(10 * GiB, 10 * GiB, 1)}
    small = {"gpu": Need(2 * GiB, 0, 0)}  # a CPU-side model: holds no device
    hot = [Item("holder", 20, True, ("gpu",), needs), Item("cpu-side", 5, True, ("gpu",), small)]
    result = place(bins, [*hot, Item("cold", 80, False, ("gpu",), needs), Item("low", 10, False, ("gpu",), needs)])
    # the eviction order is by priority: cpu-side (5) first, holder (20) next; the device frees with the second
    assert result.cold == {"cold": {"gpu": ("cpu-side", "holder")}, "low": {}}
    assert result.why["cold"] == "cold; starts on gpu by evicting cpu-side, holder; admissible on gpu"


def independent_cold_answer(
    b: Bin, hot: list[tuple[str, int, Need]], need: Need, priority: int
) -> tuple[str, ...] | None:
    """The single-machine policy's answer on the same figures, with the device as one more resource: walk the
    policy's eviction order (lowest priority first) and stop at the first prefix after which the need fits
    beside what is left (umemc.budget.policy.decide says so with no victim) and a device is free; every pod stopped must
    be of a lower priority. None: it cannot start there."""
    from umemc.budget import policy

    held = [policy.Held.on_paper(n, p, x.ram, x.gpu) for n, p, x in hot]
    order = policy.eviction_order(held)
    devices = {n: x.devices for n, _, x in hot}
    free_devices = (b.devices if b.devices is not None else 10**9) - sum(devices.values())
    want = policy.Need("cold", ram=need.ram, gpu=need.gpu, priority=priority, cold=True, drain=False)
    for k in range(len(order) + 1):
        stopped = order[:k]
        if any(h.priority >= priority for h in stopped):
            return None
        left = [h for h in held if h not in stopped]
        fits = policy.decide(want, left, [], b.policy_budget())
        if fits.fits and not fits.victims and free_devices + sum(devices[h.name] for h in stopped) >= need.devices:
            return tuple(h.name for h in stopped)
    return None


def test_cold_admission_with_devices_matches_the_single_machine_policy_on_400_instances() -> None:
    rng = random.Random(33)
    for _ in range(400):
        devices = rng.choice((1, 2, 3))
        b = Bin("n", 64 * GiB, 64 * GiB, usable=80 * GiB, load_below=rng.choice((0.7, 1.0)), devices=devices)
        hot, used, dev = [], 0, 0
        for i in range(rng.randrange(1, 7)):
            size = rng.randrange(1, 16) * GiB
            gpu = rng.random() < 0.7 and dev < devices
            if used + size > b.budget:
                break
            used, dev = used + size, dev + gpu
            hot.append((f"h{i}", rng.randrange(0, 100, 10), Need(size, size if gpu else 0, int(gpu))))
        size = rng.randrange(1, 40) * GiB
        need, priority = Need(size, size, 1), rng.randrange(0, 101, 10)
        items = [Item(n, p, True, ("n",), {"n": x}) for n, p, x in hot]
        result = place([b], [*items, Item("c", priority, False, ("n",), {"n": need})])
        assert set(result.home) >= {n for n, _, _ in hot}  # the hot set fits as drawn
        expected = independent_cold_answer(b, hot, need, priority)
        assert result.cold["c"] == ({} if expected is None else {"n": expected}), (hot, need, priority)
