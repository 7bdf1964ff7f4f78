"""Several machines: the [nodes] language, placement (deterministic, priority first, best fit, both
ledgers), the closest node's shortfall when a hot model fits nowhere, cold admission per node, one
bundle per node, and explain saying why. Sizes are explicit (`runtime = "command"`, `memory`), so every
hard quota is memory x 1.1 rounded up to a MiB, computed by hand in each test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umemc.budget.plan import make_plan
from umemc.stack.resolve import load_stack

GiB, MiB = 2**30, 2**20


def cpu_node(name: str, gib: int, extra: str = "") -> str:
    # budget = (gib - 1) GiB x 0.85 (os_reserve 1 GiB, safety_margin 0.15)
    return f'\n[nodes.{name}]\nkind = "cpu"\nmemory = "{gib}GiB"\nos_reserve = "1GiB"\n{extra}'


def worker(name: str, mib: int, priority: int = 50, mode: str = "hot", extra: str = "") -> str:
    return (
        f'\n[models.{name}]\nruntime = "command"\ncommand = ["true"]\nmemory = "{mib}MiB"\n'
        f'priority = {priority}\nmode = "{mode}"\n{extra}'
    )


def hard(mib: int) -> int:
    """memory x 1.1, rounded up to a whole MiB (what a hard quota is)."""
    return -(-mib * 11 // 10) * MiB


HEAD = 'version = 1\nname = "multi"\n'


def plan_of(write_stack, text: str):  # type: ignore[no-untyped-def]
    return make_plan(load_stack(write_stack(HEAD + text)))


def test_priority_first_then_best_fit_and_the_same_every_time(write_stack) -> None:
    # a and b: budget (11 - 1) x 0.85 = 8.5 GiB each. hot, by priority: big (6000 MiB -> 6600), mid (3000 -> 3300),
    # small (1800 -> 1980). big goes to a (both empty: file order). mid fits only b (a has 2104 MiB left).
    # small fits a (2104 left -> 124) and b (5404 -> 3424): best fit is a.
    text = cpu_node("a", 11) + cpu_node("b", 11) + worker("small", 1800, 10) + worker("mid", 3000, 50)
    text += worker("big", 6000, 90)
    plans = [plan_of(write_stack, text) for _ in range(2)]
    for plan in plans:
        assert plan.fits
        assert plan.placement.home == {"big": "a", "mid": "b", "small": "a"}
        assert {n: list(p.models) for n, p in plan.nodes.items()} == {"a": ["small", "big"], "b": ["mid"]}
        assert plan.nodes["a"].hot_total == hard(6000) + hard(1800)
        assert plan.nodes["b"].hot_total == hard(3000)
    assert plans[0].placement.why["small"] == (
        "placed on a, which it fits with the least room left (0.1 GiB of the budget free after it; best fit, hot "
        "models in priority order, larger first); b would leave 3.3 GiB"
    )


def test_pins_and_allowed_sets_are_respected(write_stack) -> None:
    text = cpu_node("a", 11) + cpu_node("b", 11) + cpu_node("c", 11)
    text += worker("x", 1000, 90, extra='node = "c"\n') + worker("y", 1000, 80, extra='nodes = ["b", "c"]\n')
    plan = plan_of(write_stack, text)
    # x pinned to c; y may use b or c: best fit is c (less room left after x)
    assert plan.placement.home == {"x": "c", "y": "c"}
    assert plan.placement.why["x"].endswith("; the only node allowed")


def test_a_model_that_fits_nowhere_names_the_closest_node(write_stack, run_cli, tmp_path: Path) -> None:
    # a: 8.5 GiB budget, b: (7 - 1) x 0.85 = 5.1 GiB. huge needs 10000 x 1.1 = 11000 MiB = 10.74 GiB:
    # 2.2 GiB short on a (8704 MiB budget), 5.6 GiB short on b (5222 MiB).
    write_stack(HEAD + cpu_node("a", 11) + cpu_node("b", 7) + worker("huge", 10000, 90) + worker("ok", 100, 10))
    code, out, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    report = json.loads(out)
    assert code == 1 and report["fits"] is False
    why = (
        "fits no node: the closest is a, 2.2 GiB short (10.7 GiB hard quota, 8.5 GiB of its 8.5 GiB budget still free)"
    )
    assert report["placement"]["unplaced"] == {"huge": why}
    assert report["advice"] == [f"models.huge: {why}"]
    # ok (110 MiB) fits both: best fit is b (5222 - 110 MiB left) rather than a (8704 - 110)
    assert report["models"]["huge"]["node"] is None and report["models"]["ok"]["node"] == "b"
    assert err == f"models.huge: {why}\n"


def test_sixteen_nodes_every_ledger_holds(write_stack) -> None:
    """16 nodes of 4-19 GiB, 60 models of 200-2600 MiB at mixed priorities: every hot model placed, and
    each node's hard quotas within its own budget (recomputed here from the quotas)."""
    text = "".join(cpu_node(f"n{i:02d}", 4 + i) for i in range(16))
    sizes = [200 + (i * 373) % 2400 for i in range(60)]
    text += "".join(worker(f"m{i:02d}", size, priority=(i * 7) % 100) for i, size in enumerate(sizes))
    plan = plan_of(write_stack, text)
    assert plan.fits and not plan.placement.unplaced
    for i in range(16):
        node = f"n{i:02d}"
        budget = int((4 + i - 1) * GiB * 0.85)
        held = sum(hard(sizes[int(m[1:])]) for m, n in plan.placement.home.items() if n == node)
        assert held <= budget, node
    assert sorted(plan.placement.home) == sorted(f"m{i:02d}" for i in range(60))


def test_two_nodes_gpu_window_is_a_second_ledger(write_stack) -> None:
    # two amd-apu nodes of 32 GiB, os_reserve 8, gpu_window 12 GiB: budget (32 - 8) capped by the window:
    # usable min(24, 12) = 12 GiB, budget 10.2 GiB on both ledgers. Two 6000 MiB models (6600 MiB each)
    # cannot share a node: one per node.
    node = 'kind = "amd-apu"\nmemory = "32GiB"\nos_reserve = "8GiB"\ngpu_window = "12GiB"\n'
    text = f"\n[nodes.a]\n{node}\n[nodes.b]\n{node}" + worker("p", 6000, 60) + worker("q", 6000, 50)
    plan = plan_of(write_stack, text)
    assert plan.placement.home == {"p": "a", "q": "b"} and plan.fits


def test_cold_models_list_where_they_could_start(write_stack, run_cli, tmp_path: Path) -> None:
    # a holds big (6600 of 8704 MiB), b holds low (3300). lazy (3000 -> 3300 MiB, priority 40): on a it
    # must evict big? No: big has priority 90 > 40, so a cannot take it; on b it fits beside low only if
    # 3300 + 3300 <= 8704: yes, alongside.
    text = cpu_node("a", 11) + cpu_node("b", 11) + worker("big", 6000, 90) + worker("low", 3000, 10)
    text += worker("lazy", 3000, 40, mode="cold")
    write_stack(HEAD + text)
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    report = json.loads(out)
    assert code == 0
    assert report["placement"]["cold"]["lazy"] == {"b": []}  # admissible on b alone, alongside (evicting nobody)
    assert report["models"]["lazy"]["node"] == "b"
    assert report["cold_admission"]["lazy"] == {"fits_alongside_hot": True, "admissible": True, "evicts": []}
    budget_a = int(10 * GiB * 0.85)
    assert report["nodes"]["a"]["capacity"]["budget_bytes"] == budget_a
    assert report["nodes"]["a"]["hot_total_bytes"] == hard(6000)
    assert report["nodes"]["a"]["headroom_bytes"] == budget_a - hard(6000)
    assert report["capacity"]["budget_bytes"] == 2 * budget_a
    code, out, _ = run_cli("explain", "stack.toml", "lazy", cwd=tmp_path)
    assert out.splitlines()[2:5] == [
        "  node: cold; starts on b alongside the hot models there; admissible on b",
        "    on a: cannot start",
        "    on b: fits alongside the hot models",
    ]


BAD = {
    "unknown node": (
        cpu_node("alpha", 8) + worker("w", 100, extra='node = "alpah"\n'),
        "stack.toml:15:8: models.w.node: no node \"alpah\" in [nodes]\n  hint: did you mean 'alpha'?",
    ),
    "node and nodes": (
        cpu_node("a", 8) + worker("w", 100, extra='node = "a"\nnodes = ["a"]\n'),
        "stack.toml:16:9: models.w.nodes: give node (a pin) or nodes (an allowed set), not both",
    ),
    "pin without nodes": (
        '[platform]\nkind = "cpu"\nmemory = "8GiB"\n' + worker("w", 100, extra='node = "a"\n'),
        "stack.toml:13:8: models.w.node: the stack has no [nodes]: a single machine runs every model\n"
        "  hint: remove it",
    ),
    "platform and nodes": (
        '[platform]\nkind = "cpu"\nmemory = "8GiB"\n' + cpu_node("a", 8) + worker("w", 100),
        "stack.toml:3:1: platform: a stack with [nodes] describes its machines there\n"
        "  hint: move [platform]'s keys into the [nodes.NAME] tables, or remove [nodes]",
    ),
    "bad label": (
        cpu_node("a", 8, 'labels = { "umemc.io/node" = "-bad" }\n') + worker("w", 100),
        "stack.toml:8:30: nodes.a.labels.\"umemc.io/node\": label value '-bad': at most 63 letters, digits, '-', "
        "'_', '.', starting and ending alphanumeric\n  hint: Kubernetes label syntax: [prefix/]name = value",
    ),
    "no platform, no nodes": (
        worker("w", 100),
        "stack.toml:1:1: platform: required key is missing\n"
        "  hint: describe the machine in [platform] (a preset, or kind + memory), or several in [nodes.NAME]",
    ),
    "empty allowed set": (
        cpu_node("a", 8) + worker("w", 100, extra="nodes = []\n"),
        "stack.toml:15:9: models.w.nodes: empty: give at least one node, or remove the key for any node",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_invalid_node_stacks_are_located(case: str, write_stack, run_cli, tmp_path: Path) -> None:
    text, message = BAD[case]
    write_stack(HEAD + text)
    for command in ("check", "build"):
        assert run_cli(command, "stack.toml", cwd=tmp_path) == (2, "", message + "\n"), command
    assert not (tmp_path / "build").exists()


def test_one_runnable_bundle_per_node(write_stack, run_cli, tmp_path: Path) -> None:
    write_stack(HEAD + cpu_node("a", 11) + cpu_node("b", 11) + worker("big", 6000, 90) + worker("mid", 3000, 50))
    code, out, _ = run_cli("build", "stack.toml", "-o", "out", cwd=tmp_path)
    assert code == 0
    out_dir = tmp_path / "out"
    for node, models in (("a", ["big"]), ("b", ["mid"])):
        plan = json.loads((out_dir / f"nodes/{node}/plan.json").read_text())
        assert list(plan["models"]) == models
        assert (out_dir / f"nodes/{node}/.umemc-bundle").exists()
        assert "[program:" + models[0] + "]" in (out_dir / f"nodes/{node}/supervisord.conf").read_text()
    top = json.loads((out_dir / "budget.json").read_text())
    assert top["placement"]["hot"] == {"big": "a", "mid": "b"}
    assert run_cli("up", "stack.toml", "--run-dir", "run", cwd=tmp_path) == (
        2,
        "",
        "stack.toml places its models on 2 nodes: say which one this machine is with --node (a, b)\n",
    )
    assert run_cli("up", "out", "--run-dir", "run", cwd=tmp_path) == (
        2,
        "",
        "out holds one bundle per node: run the one for this machine, out/nodes/a or out/nodes/b\n",
    )


def test_a_constrained_first_pass_places_what_priority_order_leaves_out(write_stack) -> None:
    # budgets (14600 - 1024) MiB x 0.85 = 11539.6 MiB. By priority: x 6600, b 3300, c 3300, d 4400, e 4400
    # (hard quotas). Priority first: x -> a, b -> a (best fit, 1639.6 left), c -> b, d -> b (3839.6 left), and
    # e fits neither. Constrained first (every model may use both nodes), then larger first: x -> a, d -> a
    # (539.6 left), e -> b (7139.6 = 7.0 GiB left), b -> b, c -> b: a = {x, d}, b = {e, b, c}; e misses a by
    # 4400 - 539.6 = 3860.4 MiB = 3.8 GiB.
    node = 'kind = "cpu"\nmemory = "14600MiB"\nos_reserve = "1GiB"\n'
    text = f"\n[nodes.a]\n{node}\n[nodes.b]\n{node}"
    text += worker("x", 6000, 90) + worker("b", 3000, 80) + worker("c", 3000, 70)
    text += worker("d", 4000, 60) + worker("e", 4000, 50)
    plan = plan_of(write_stack, text)
    assert plan.fits and plan.placement.home == {"x": "a", "d": "a", "e": "b", "b": "b", "c": "b"}
    assert plan.placement.why["e"] == (
        "placed on b, which it fits with the least room left (7.0 GiB of the budget free after it; the models "
        "with the fewest possible nodes first, then larger first, best fit; priority order alone left a hot model "
        "without a node); a is 3.8 GiB short"
    )


def test_nodes_of_one_kind_share_estimates_and_keep_their_own_budgets(write_stack, tmp_path: Path) -> None:
    """The budget estimates a model once per node kind (a memory size changes the budget, not the model): each
    node's figures must be what a one-machine stack of that node's platform says, for an estimated model
    (llama-server by arch: GPU window, compute and overhead depend on the kind) and an explicit one."""
    apu = 'kind = "amd-apu"\nmemory = "{}GiB"\nos_reserve = "4GiB"\ngpu_window = "{}GiB"\n'
    platforms = {
        "small": apu.format(64, 48),
        "big": apu.format(128, 110),
        "cpu": 'kind = "cpu"\nmemory = "96GiB"\nos_reserve = "4GiB"\n',
    }
    models = (
        '\n[models.chat]\nruntime = "llama-server"\narch = "qwen2.5-7b"\ncontext = 16384\nmode = "cold"\n'
        + worker("tool", 2000, 40, mode="cold")
        + worker("base", 8000, 90)
    )
    text = "".join(f"\n[nodes.{n}]\n{p}" for n, p in platforms.items()) + models
    plan = plan_of(write_stack, text)
    for node, platform in platforms.items():
        alone = make_plan(load_stack(write_stack(f"{HEAD}\n[platform]\n{platform}{models}")))
        assert plan.nodes[node].capacity == alone.capacity, node
        for name in ("chat", "tool"):
            mine, theirs = plan.variants[name][node], alone.models[name]
            assert (mine.quota_soft, mine.quota_hard, mine.gpu_quota_hard) == (
                theirs.quota_soft,
                theirs.quota_hard,
                theirs.gpu_quota_hard,
            ), (node, name)
            assert mine.estimate == theirs.estimate, (node, name)
    # the two APU nodes hold one figure (one estimate), the CPU node its own: nothing in a GPU window
    assert plan.variants["chat"]["small"] is plan.variants["chat"]["big"]
    assert plan.variants["chat"]["cpu"].gpu_quota_hard == 0 < plan.variants["chat"]["big"].gpu_quota_hard


def test_a_stack_of_many_nodes_prints_one_row_per_node(write_stack, run_cli, tmp_path: Path) -> None:
    """Above 12 nodes the terminal report is one row per node (its tables would run to thousands of lines):
    hot and cold models there, the hot set against the budget on each ledger. n00-n12: budget (11 - 1) x 0.85
    = 8.5 GiB. pinned (1000 MiB -> 1100 MiB = 1.1 GiB) on n05; lazy (cold, 500 MiB) starts alongside on
    every node, cheapest on the first."""
    text = "".join(cpu_node(f"n{i:02d}", 11) for i in range(13))
    text += worker("pinned", 1000, 60, extra='node = "n05"\n') + worker("lazy", 500, 40, mode="cold")
    write_stack(HEAD + text)
    code, out, _ = run_cli("check", "stack.toml", cwd=tmp_path)
    assert code == 0
    lines = [line.split() for line in out.splitlines() if line.strip()]
    # headroom: 13 x 8.5 GiB - 1100 MiB = 110.5 - 1.07 = 109.4 GiB
    assert lines[0] == ["umemc", "multi", "FITS", "headroom", "109.4", "GiB", "on", "13", "nodes"]
    assert lines[1] == ["GiB", "per", "node", "(hard", "quotas)"]
    assert lines[2] == ["node", "platform", "hot", "cold", "hot", "set", "budget", "GPU", "set", "GPU", "budget"]
    rows = {r[0]: r for r in lines[4:17]}
    assert sorted(rows) == [f"n{i:02d}" for i in range(13)]
    assert rows["n05"] == ["n05", "cpu", "1", "0", "1.1", "8.5", "-", "-", "ok"]
    assert rows["n00"] == ["n00", "cpu", "0", "1", "0.0", "8.5", "-", "-", "ok"]
    assert rows["n12"] == ["n12", "cpu", "0", "0", "0.0", "8.5", "-", "-", "ok"]
    assert " ".join(lines[17]) == (
        "every model's figures: --format markdown or json; one model's, where it goes and why: umemc explain "
        "STACK MODEL"
    )
    assert len(lines) == 18  # no node's own tables


def test_every_model_is_resolved_once_per_node_kind(write_stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack of four nodes of two kinds that does not fit: load resolves (validates) each model once per kind,
    and the budget and the advice after it (every node's view) only read what load resolved."""
    from dataclasses import FrozenInstanceError

    from umemc.budget.advice import advise
    from umemc.stack import resolve

    calls: list[tuple[str, str]] = []
    real = resolve._model

    def counting(doc, name, spec, platform, *args, **kw):  # type: ignore[no-untyped-def]
        calls.append((name, platform.kind))
        return real(doc, name, spec, platform, *args, **kw)

    monkeypatch.setattr(resolve, "_model", counting)
    nodes = "".join(f'[nodes.{n}]\nkind = "cpu"\nmemory = "{m}GiB"\n' for n, m in (("a", 16), ("b", 32)))
    nodes += "".join(f'[nodes.{n}]\npreset = "strix-halo-64"\n' for n in ("c", "d"))
    models = "".join(
        f'[models.m{i}]\nruntime = "command"\ncommand = ["serve"]\nmemory = "40GiB"\npriority = {i}\n' for i in range(3)
    )
    loaded = load_stack(write_stack(f'version = 1\nname = "k"\n{nodes}{models}'))
    plan = make_plan(loaded)
    assert not plan.fits
    advised = advise(loaded, plan)
    assert advised.advice and sorted(calls) == sorted((f"m{i}", k) for i in range(3) for k in ("cpu", "amd-apu"))
    with pytest.raises(FrozenInstanceError):
        loaded.models = {}  # type: ignore[misc]
