"""The budget as a terminal table a person scans in five seconds (rich)."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..budget import Plan
from ..units import gib
from .report import admission_text, ledger_lines

DETAILED_NODES = 12  # a stack of more nodes gets one row per node instead of each node's tables


def budget_renderable(plan: Plan) -> Group:
    verdict = (
        Text(" FITS ", style="bold black on green") if plan.fits else Text(" DOES NOT FIT ", style="bold white on red")
    )
    title = Text.assemble(
        ("umemc ", "bold"), (plan.name, "bold cyan"), "  ", verdict, f"  headroom {gib(plan.headroom)} GiB"
    )
    if plan.nodes:
        title.append(f"  on {len(plan.nodes)} nodes")
        parts: list[RenderableType] = [title, *_advice(plan)]
        if len(plan.nodes) > DETAILED_NODES:  # one row per node: 500 nodes' tables are read by no one
            return Group(*parts, _node_rows(plan), _where_the_rest_is(), *_warnings(plan))
        for name, node in plan.nodes.items():
            mark = Text(" ok ", style="black on green") if node.fits else Text(" over ", style="white on red")
            parts += [Text(""), Text.assemble(("node ", "bold"), (name, "bold magenta"), " ", mark), _platform(node)]
            parts += [_ledgers(node), _models(node), *_cold(node)]
        return Group(*parts, *_warnings(plan))
    return Group(title, _platform(plan), _ledgers(plan), *_advice(plan), _models(plan), *_cold(plan), *_warnings(plan))


def _platform(plan: Plan) -> Text:
    p = plan.platform
    window = f"GPU window {gib(p.gpu_window)} GiB" if p.gpu_window is not None else "no GPU window"
    return Text(
        f"{p.preset or p.kind} ({p.kind}): {gib(p.memory)} GiB RAM, {gib(p.os_reserve)} GiB OS reserve, "
        f"{window}, safety margin {plan.stack.policy.safety_margin:.0%}\nhard quotas enforced by {plan.enforcement}",
        style="dim",
    )


def _ledgers(plan: Plan) -> Table:
    t = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    for col, justify in (
        ("ledger", "left"),
        ("hot set", "right"),
        ("budget", "right"),
        ("usable", "right"),
        ("", "left"),
    ):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name, used, budget, usable, ok in ledger_lines(plan):
        mark = Text("ok", style="green") if ok else Text(f"over by {gib(used - budget)} GiB", style="bold red")
        t.add_row(name, gib(used), gib(budget), gib(usable), mark)
    return t


def _models(plan: Plan) -> Table:
    t = Table(
        title="GiB per model; hard = estimate x (1 + quota_headroom)",
        title_justify="left",
        title_style="dim",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 1),
        collapse_padding=True,
    )
    for col in ("model", "mode", "prio", "weights", "KV", "compute", "ovhd", "estimate", "hard", "GPU", "source"):
        t.add_column(col, justify="left" if col in ("model", "mode", "source") else "right", no_wrap=True)
    for m in plan.models.values():
        e = m.estimate
        mode = Text(m.model.spec.mode, style="green" if m.hot else "blue")
        t.add_row(
            m.name,
            mode,
            str(m.priority),
            gib(e.weights.bytes),
            gib(e.kv.bytes),
            gib(e.compute.bytes),
            gib(e.overhead.bytes),
            gib(e.estimate_bytes),
            Text(gib(m.quota_hard), style="bold"),
            gib(e.gpu.bytes),
            e.source,
        )
    hot = Text(gib(plan.hot_total), style="bold")
    t.add_section()
    t.add_row(
        "hot set", "", "", "", "", "", "", "", hot, gib(plan.hot_gpu_total) if plan.capacity.gpu_budget else "-", ""
    )
    return t


def _node_rows(plan: Plan) -> Table:
    t = Table(
        title="GiB per node (hard quotas)",
        title_justify="left",
        title_style="dim",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in ("node", "platform", "hot", "cold", "hot set", "budget", "GPU set", "GPU budget", ""):
        t.add_column(col, justify="left" if col in ("node", "platform", "") else "right", no_wrap=True)
    for name, node in plan.nodes.items():
        cap, hot = node.capacity, sum(m.hot for m in node.models.values())
        over = [
            f"{ledger} over by {gib(used - budget)} GiB" for ledger, used, budget, _, ok in ledger_lines(node) if not ok
        ]
        t.add_row(
            name,
            node.platform.preset or node.platform.kind,
            str(hot),
            str(len(node.models) - hot),
            gib(node.hot_total),
            gib(cap.budget),
            gib(node.hot_gpu_total) if cap.gpu_budget is not None else "-",
            gib(cap.gpu_budget) if cap.gpu_budget is not None else "-",
            Text("; ".join(over), style="bold red") if over else Text("ok", style="green"),
        )
    return t


def _where_the_rest_is() -> Text:
    return Text(
        "every model's figures: --format markdown or json; one model's, where it goes and why: umemc explain "
        "STACK MODEL",
        style="dim",
    )


def _cold(plan: Plan) -> list[Text]:
    if not plan.cold_admission:
        return []
    lines = [Text("cold models:", style="bold")]
    for name, a in plan.cold_admission.items():
        style = "green" if a.fits_alongside_hot else ("yellow" if a.admissible else "red")
        lines.append(Text(f"  {name}: {admission_text(a)}", style=style))
    return lines


def _advice(plan: Plan) -> list[Text]:
    return [Text(a, style="bold red" if not a.startswith(" ") else "red") for a in plan.advice]


def _warnings(plan: Plan) -> list[Text]:
    return [Text(f"warning: {w}", style="yellow") for w in plan.warnings]


def print_budget(plan: Plan, console: Console | None = None) -> None:
    (console or Console(highlight=False)).print(budget_renderable(plan))
