"""`umemc explain`: every figure of one model's estimate with its formula and inputs."""

from __future__ import annotations

from ..budget.plan import ModelPlan, Plan
from ..estimate.figures import Figure
from ..units import human


def explain_text(plan: Plan, m: ModelPlan) -> str:
    spec, e = m.model.spec, m.estimate
    lines = [f"models.{m.name}: runtime {spec.runtime}, {spec.mode}, priority {spec.priority}, source {e.source}"]
    facts = ", ".join(f"{k} {v}" for k, v in e.facts.items() if v not in (None, ""))
    if facts:
        lines.append(f"  {facts}")
    if plan.placement is not None:
        where = plan.placement.unplaced.get(m.name) or plan.placement.why.get(m.name, "")
        lines.append(f"  node: {where}")
        could = plan.placement.cold.get(m.name, {})
        for node in plan.variants.get(m.name, {}):  # a cold model's allowed nodes
            evicts = could.get(node)
            fate = (
                "cannot start"
                if evicts is None
                else f"starts by evicting {', '.join(evicts)}"
                if evicts
                else "fits alongside the hot models"
            )
            lines.append(f"    on {node}: {fate}")
    lines.append("")
    for fig in (e.weights, e.kv, e.compute, e.overhead):
        _figure(fig, lines, depth=1)
    h = plan.stack.policy.quota_headroom
    total = e.sum_bytes
    lines.append("")
    lines.append(f"  estimate = weights + kv + compute + overhead = {human(total)} ({total} bytes)")
    repack = next((p.bytes for p in e.weights.parts if p.name == "repacked copy"), 0)
    if repack and e.explicit is None:
        lines.append(
            f"  load peak = the estimate; steady once the kernel reclaims the file pages of the repacked tensors "
            f"= {human(total - repack)} ({total - repack} bytes): quotas are sized on the peak"
        )
    if e.explicit is not None:
        lines.append(f"  memory = {human(e.explicit)} ({e.explicit} bytes) given explicitly: it replaces the sum")
    lines.append(f"  quota soft = estimate = {m.quota_soft} bytes ({human(m.quota_soft)})")
    lines.append(
        f"  quota hard = estimate x (1 + quota_headroom {h}), rounded up to a MiB = {m.quota_hard} bytes "
        f"({human(m.quota_hard)})"
    )
    lines.append(f"  gpu = {e.gpu.formula} = {human(e.gpu.bytes)} ({e.gpu.bytes} bytes)")
    if m.model.spec.mode == "cold" and m.name in plan.cold_admission:
        a = plan.cold_admission[m.name]
        lines.append(
            f"  cold start: fits alongside hot set {a.fits_alongside_hot}, admissible {a.admissible}, "
            f"evicts {list(a.evicts)}"
        )
    if e.warnings:
        lines.append("")
        lines += [f"  warning: {w}" for w in e.warnings]
    return "\n".join(lines) + "\n"


def _figure(fig: Figure, lines: list[str], depth: int) -> None:
    pad = "  " * depth
    lines.append(f"{pad}{fig.name} = {human(fig.bytes)} ({fig.bytes} bytes)")
    lines.append(f"{pad}  = {fig.formula}")
    for key, value in fig.inputs.items():
        lines.append(f"{pad}    {key}: {value}")
    for part in fig.parts:
        _figure(part, lines, depth + 1)
