"""budget.svg: one stacked bar per ledger (weights / KV / compute / overhead per hot model) against
the budget and the usable capacity. Geometry is computed here; the template only draws it."""

from __future__ import annotations

from dataclasses import dataclass

from ..budget.plan import Plan
from ..units import gib

WIDTH, LEFT, RIGHT, BAR_H, ROW_H, TOP = 880, 150, 30, 34, 92, 58
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#bab0ac"]
SHADES = (("weights", 1.0), ("KV", 0.72), ("compute", 0.5), ("overhead", 0.3))


@dataclass(frozen=True)
class Rect:
    x: float
    w: float
    fill: str
    opacity: float
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    text: str


@dataclass(frozen=True)
class LedgerView:
    name: str
    y: float
    rects: tuple[Rect, ...]
    labels: tuple[Label, ...]
    budget_x: float
    end_x: float
    caption: str
    over: bool


def _ledger(plan: Plan, name: str, y: float, capacity: int, budget: int, *, gpu: bool) -> LedgerView:
    span = WIDTH - LEFT - RIGHT
    scale = span / max(capacity, sum(m.quota_hard for m in plan.models.values() if m.hot), 1)
    x, rects, labels = float(LEFT), [], []
    for i, m in enumerate(p for p in plan.models.values() if p.hot):
        color = PALETTE[i % len(PALETTE)]
        e = m.estimate
        parts = [e.weights.bytes, e.kv.bytes, e.compute.bytes, 0 if gpu else e.overhead.bytes]
        if e.explicit is not None or sum(parts) == 0:
            parts = [(e.gpu.bytes if gpu else e.estimate_bytes), 0, 0, 0]
        start = x
        for (label, opacity), size in zip(SHADES, parts, strict=True):
            if size:
                rects.append(
                    Rect(round(x, 2), round(size * scale, 2), color, opacity, f"{m.name} {label}: {gib(size)} GiB")
                )
                x += size * scale
        quota = m.gpu_quota_hard if gpu else m.quota_hard
        slack = quota * scale - (x - start)
        if slack > 0:  # the hard quota's headroom above the estimate
            rects.append(Rect(round(x, 2), round(slack, 2), color, 0.12, f"{m.name} quota headroom"))
            x += slack
        if x - start > 40:
            labels.append(Label(round(start + 3, 2), m.name))
    used = sum((m.gpu_quota_hard if gpu else m.quota_hard) for m in plan.models.values() if m.hot)
    caption = f"{name}: hot set {gib(used)} GiB of budget {gib(budget)} GiB (usable {gib(capacity)} GiB)"
    return LedgerView(
        name,
        y,
        tuple(rects),
        tuple(labels),
        round(LEFT + budget * scale, 2),
        round(LEFT + capacity * scale, 2),
        caption,
        used > budget,
    )


def ledgers(plan: Plan) -> list[LedgerView]:
    cap = plan.capacity
    out = [_ledger(plan, "all memory", TOP, cap.usable, cap.budget, gpu=False)]
    if cap.gpu_budget is not None and cap.gpu_window is not None:
        out.append(_ledger(plan, "GPU window", TOP + ROW_H, cap.gpu_window, cap.gpu_budget, gpu=True))
    return out


@dataclass(frozen=True)
class Key:
    """One hot model in the key under the bars: every model is named there, however thin its segment."""

    x: float
    y: float
    fill: str
    text: str


@dataclass(frozen=True)
class ColdRow:
    """A cold model: its hard quota on the all-memory scale, and what its start would do."""

    y: float
    w: float
    text: str
    ok: bool


KEY_COLS, KEY_W, KEY_H, COLD_H = 3, 230, 18, 22


def _keys(plan: Plan, y0: float) -> list[Key]:
    hot = [m for m in plan.models.values() if m.hot]
    return [
        Key(
            LEFT + (i % KEY_COLS) * KEY_W,
            y0 + (i // KEY_COLS) * KEY_H,
            PALETTE[i % len(PALETTE)],
            f"{m.name} (prio {m.priority}) {gib(m.quota_hard)} GiB",
        )
        for i, m in enumerate(hot)
    ]


def _colds(plan: Plan, y0: float) -> list[ColdRow]:
    from .report import admission_text

    span = WIDTH - LEFT - RIGHT
    scale = span / max(plan.capacity.usable, sum(m.quota_hard for m in plan.models.values() if m.hot), 1)
    rows = []
    for i, (name, a) in enumerate(plan.cold_admission.items()):
        m = plan.models[name]
        text = f"{name} (prio {m.priority}) {gib(m.quota_hard)} GiB: {admission_text(a)}"
        rows.append(ColdRow(y0 + i * COLD_H, round(min(span, m.quota_hard * scale), 2), text, a.admissible))
    return rows


def svg_values(plan: Plan) -> dict[str, object]:
    views = ledgers(plan)
    keys_y = TOP + ROW_H * len(views)
    keys = _keys(plan, keys_y)
    key_rows = -(-len(keys) // KEY_COLS)
    cold_y = keys_y + key_rows * KEY_H + (28 if plan.cold_admission else 0)
    colds = _colds(plan, cold_y)
    legend_y = cold_y + len(colds) * COLD_H + 20
    legend = [(LEFT + i * 110, label, opacity) for i, (label, opacity) in enumerate(SHADES)]
    return {
        "width": WIDTH,
        "height": legend_y + 30,
        "left": LEFT,
        "bar_h": BAR_H,
        "ledgers": views,
        "keys": keys,
        "colds": colds,
        "cold_title_y": cold_y - 10,
        "legend": legend,
        "legend_y": legend_y,
        "title": f"umemc {plan.name}: {'fits' if plan.fits else 'does NOT fit'}",
    }
