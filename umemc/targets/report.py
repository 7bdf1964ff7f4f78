"""The budget report: JSON (the contract in docs/CONTRACTS.md), Markdown (pull-request comments). Pure: Plan -> text."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..budget.plan import Capacity, ColdAdmission, Plan
from ..units import gib, in_unit, unit_for

if TYPE_CHECKING:
    from ..budget.split import Split


def budget_dict(plan: Plan) -> dict[str, Any]:
    cap = plan.capacity
    out: dict[str, Any] = {
        "stack": plan.name,
        "fits": plan.fits,
        "capacity": capacity_dict(cap),
        "models": {
            m.name: {
                "mode": m.model.spec.mode,
                "priority": m.priority,
                "weights_bytes": m.estimate.weights.bytes,
                "kv_bytes": m.estimate.kv.bytes,
                "compute_bytes": m.estimate.compute.bytes,
                "overhead_bytes": m.estimate.overhead.bytes,
                "estimate_bytes": m.estimate.estimate_bytes,
                "gpu_bytes": m.estimate.gpu.bytes,
                "quota_soft_bytes": m.quota_soft,
                "quota_hard_bytes": m.quota_hard,
                "source": m.estimate.source,
            }
            for m in plan.models.values()
        },
        "hot_total_bytes": plan.hot_total,
        "hot_gpu_total_bytes": plan.hot_gpu_total,
        "headroom_bytes": plan.headroom,
        "cold_admission": {
            name: {"fits_alongside_hot": a.fits_alongside_hot, "admissible": a.admissible, "evicts": list(a.evicts)}
            for name, a in plan.cold_admission.items()
        },
        "warnings": list(plan.warnings),
        "advice": list(plan.advice),
        "enforcement": plan.enforcement,
    }
    if plan.nodes:
        assert plan.placement is not None
        for name, m in out["models"].items():
            m["node"] = plan.node_of(name) if name not in plan.placement.unplaced else None
        for name, mp in plan.models.items():
            if mp.split is not None:
                out["models"][name]["split"] = split_dict(mp.split)
        out["nodes"] = {name: node_dict(p) for name, p in plan.nodes.items()}
        out["placement"] = {
            "hot": {n: plan.placement.home[n] for n, m in plan.models.items() if m.hot and n in plan.placement.home},
            "unplaced": dict(plan.placement.unplaced),
            # per cold model, the nodes where it could start and what it would evict there ([]: alongside)
            "cold": plan.placement.cold,
        }
    return out


def split_dict(split: Split) -> list[dict[str, Any]]:
    """A split model's parts in llama.cpp's layer order: where each is, its blocks, its figures."""
    return [
        {
            "node": p.node,
            "first_block": p.first,
            "blocks": p.blocks,
            "token_embeddings": p.input,
            "output_layer": p.output,
            "weights_bytes": p.estimate.weights.bytes,
            "kv_bytes": p.estimate.kv.bytes,
            "compute_bytes": p.estimate.compute.bytes,
            "overhead_bytes": p.estimate.overhead.bytes,
            "estimate_bytes": p.estimate.estimate_bytes,
            "gpu_bytes": p.estimate.gpu.bytes,
            "quota_hard_bytes": p.quota_hard,
            "rpc_endpoint": p.endpoint,
        }
        for p in split.parts
    ]


def split_text(split: Split) -> str:
    return f"split by layers across {len(split.parts)} nodes (llama.cpp RPC): {split.said()}"


def node_dict(p: Plan) -> dict[str, Any]:
    """One node of a stack with [nodes]: the same capacity and ledger fields as a single machine's."""
    cap, plat = p.capacity, p.platform
    return {
        "platform": {"preset": plat.preset, "kind": plat.kind},
        "fits": p.fits,
        "capacity": capacity_dict(cap),
        "models": list(p.models),
        # the RPC servers holding parts of models split across nodes: program -> the model
        "parts_of": {n: m.part_of for n, m in p.models.items() if m.part_of is not None},
        "hot_total_bytes": p.hot_total,
        "hot_gpu_total_bytes": p.hot_gpu_total,
        "headroom_bytes": p.headroom,
        "enforcement": p.enforcement,
    }


def capacity_dict(cap: Capacity) -> dict[str, int | None]:
    return {
        "memory_bytes": cap.memory,
        "os_reserve_bytes": cap.os_reserve,
        "gpu_window_bytes": cap.gpu_window,
        "usable_bytes": cap.usable,
        "budget_bytes": cap.budget,
        "gpu_budget_bytes": cap.gpu_budget,
    }


COMPACT_ABOVE = 200  # models: a larger report is written on one line (json's C encoder; `jq .` indents it)


def budget_json(plan: Plan) -> str:
    indent = None if len(plan.models) > COMPACT_ABOVE else 2
    return json.dumps(budget_dict(plan), indent=indent) + "\n"


def ledger_lines(plan: Plan) -> list[tuple[str, int, int, int | None, bool]]:
    """(ledger, used, budget, capacity, ok) for each ledger the platform has."""
    cap = plan.capacity
    rows: list[tuple[str, int, int, int | None, bool]] = [
        ("all memory", plan.hot_total, cap.budget, cap.usable, plan.fits_ram)
    ]
    if cap.gpu_budget is not None:
        rows.append(("GPU window", plan.hot_gpu_total, cap.gpu_budget, cap.gpu_window, plan.fits_gpu))
    return rows


def budget_markdown(plan: Plan) -> str:
    verdict = "✅ fits" if plan.fits else "❌ does not fit"
    if plan.nodes:
        out = [f"### umemc: `{plan.name}` {verdict} on {len(plan.nodes)} nodes", ""]
        if plan.advice:
            out += ["**Why it does not fit:**", ""] + [f"- {a.strip()}" for a in plan.advice] + [""]
        splits = [f"- `{m.name}`: {split_text(m.split)}" for m in plan.models.values() if m.split is not None]
        out += [*splits, ""] if splits else []
        for name, node in plan.nodes.items():
            body = budget_markdown(replace(node, warnings=())).splitlines()[2:]  # its own heading dropped
            out += [f"#### node `{name}` {'✅' if node.fits else '❌'}", "", *body, ""]
        if plan.warnings:
            out += [f"<details><summary>{len(plan.warnings)} warning(s)</summary>", ""]
            out += [f"- {w}" for w in plan.warnings] + ["", "</details>"]
        return "\n".join(out).rstrip() + "\n"
    out = [f"### umemc: `{plan.name}` {verdict}", ""]
    p = plan.platform
    out.append(
        f"Platform: {p.preset or p.kind} ({p.kind}), {gib(p.memory)} GiB RAM, "
        f"{gib(p.os_reserve)} GiB OS reserve, safety margin {plan.stack.policy.safety_margin:.0%}. "
        f"Hard quotas enforced by {plan.enforcement}."
    )
    out += ["", "| ledger | hot set (hard quotas) | budget | usable | |", "|---|---:|---:|---:|---|"]
    for name, used, budget, usable, ok in ledger_lines(plan):
        out.append(f"| {name} | {gib(used)} GiB | {gib(budget)} GiB | {gib(usable)} GiB | {'✅' if ok else '❌'} |")
    if plan.advice:
        out += ["", "**Why it does not fit, and what would:**", ""]
        out += [f"- {a.strip()}" if not a.startswith("  ") else f"  - {a.strip()}" for a in plan.advice]
    out += [
        "",
        "| model | mode | prio | weights | KV | compute | overhead | estimate | hard quota | GPU | source |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    unit, size = unit_for(plan.hot_total, *(m.quota_hard for m in plan.models.values()))
    for m in plan.models.values():
        e = m.estimate
        figures = (e.weights.bytes, e.kv.bytes, e.compute.bytes, e.overhead.bytes, e.estimate_bytes, m.quota_hard)
        cells = " | ".join(in_unit(b, size) for b in (*figures, e.gpu.bytes))
        out.append(f"| {m.name} | {m.model.spec.mode} | {m.priority} | {cells} | {e.source} |")
    out.append("")
    out.append(f"Sizes in {unit}. Headroom: {gib(plan.headroom)} GiB.")
    if plan.cold_admission:
        out += ["", "Cold models:", ""]
        for name, a in plan.cold_admission.items():
            out.append(f"- `{name}`: {admission_text(a)}")
    if plan.warnings:
        out += ["", f"<details><summary>{len(plan.warnings)} warning(s)</summary>", ""]
        out += [f"- {w}" for w in plan.warnings]
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


def admission_text(a: ColdAdmission) -> str:
    if a.fits_alongside_hot:
        return "fits alongside the hot set"
    if a.admissible:
        return "starts by evicting " + ", ".join(a.evicts)
    return "cannot start: evicting every lower-priority hot model is not enough"
