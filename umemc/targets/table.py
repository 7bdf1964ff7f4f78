"""The budget as a terminal table a person scans in five seconds.

The budget is described once, as lines of styled text and grids (`budget_blocks`). rich draws them on a
terminal. Off one (a pipe, a file, a CI log: what `umemc check` mostly writes to), rich would print them
without colour at 200 columns, nothing wrapped; `plain_text` prints exactly those bytes without importing
rich (a third of a short check's time), and hands anything it does not reproduce exactly back to rich
(a grid wider than 200 columns, a control character, a character wider than one column).
tests/test_table.py holds the two to the same bytes."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, NamedTuple, TextIO

from ..budget.plan import Plan
from ..units import gib, in_unit, unit_for
from .report import admission_text, ledger_lines, split_text

if TYPE_CHECKING:
    from rich.console import Console, Group

DETAILED_NODES = 12  # a stack of more nodes gets one row per node instead of each node's tables
WIDTH = 200  # columns of the console off a terminal (umemc.commands.common.console)

Span = tuple[str, str]  # text, rich style ("" for none)


class Line(NamedTuple):
    """One line of text (or several, split at "\\n"), in styled pieces."""

    spans: tuple[Span, ...]

    @classmethod
    def of(cls, text: str, style: str = "") -> Line:
        return cls(((text, style),))


class Grid(NamedTuple):
    """A table: a header row in bold, then rows of one styled piece per cell; every cell on one line.
    boxed: rich's SIMPLE_HEAD box (a blank line above and below, a rule under the header, one space at
    either edge); collapse: one space between columns instead of two; rule_after: a blank line after that
    row."""

    headers: tuple[str, ...]
    right: tuple[bool, ...]  # per column: justified right (numbers) or left
    rows: tuple[tuple[Span, ...], ...]
    boxed: bool = False
    collapse: bool = False
    title: str = ""
    rule_after: int | None = None
    no_wrap: bool = False


Block = Line | Grid


def budget_blocks(plan: Plan) -> list[Block]:
    verdict = (" FITS ", "bold black on green") if plan.fits else (" DOES NOT FIT ", "bold white on red")
    title = [
        ("umemc ", "bold"),
        (plan.name, "bold cyan"),
        ("  ", ""),
        verdict,
        (f"  headroom {gib(plan.headroom)} GiB", ""),
    ]
    if plan.nodes:
        title.append((f"  on {len(plan.nodes)} nodes", ""))
        blocks: list[Block] = [Line(tuple(title)), *_advice(plan), *_splits(plan)]
        if len(plan.nodes) > DETAILED_NODES:  # one row per node: 500 nodes' tables are read by no one
            return [*blocks, _node_rows(plan), _where_the_rest_is(), *_warnings(plan)]
        for name, node in plan.nodes.items():
            mark = (" ok ", "black on green") if node.fits else (" over ", "white on red")
            blocks += [Line.of(""), Line((("node ", "bold"), (name, "bold magenta"), (" ", ""), mark)), _platform(node)]
            blocks += [_ledgers(node), _models(node), *_cold(node)]
        return [*blocks, *_warnings(plan)]
    head: list[Block] = [Line(tuple(title)), _platform(plan), _ledgers(plan), *_advice(plan), _models(plan)]
    return [*head, *_cold(plan), *_warnings(plan)]


def _platform(plan: Plan) -> Line:
    p = plan.platform
    window = f"GPU window {gib(p.gpu_window)} GiB" if p.gpu_window is not None else "no GPU window"
    return Line.of(
        f"{p.preset or p.kind} ({p.kind}): {gib(p.memory)} GiB RAM, {gib(p.os_reserve)} GiB OS reserve, "
        f"{window}, safety margin {plan.stack.policy.safety_margin:.0%}\nhard quotas enforced by {plan.enforcement}",
        "dim",
    )


def _ledgers(plan: Plan) -> Grid:
    rows = []
    for name, used, budget, usable, ok in ledger_lines(plan):
        mark = ("ok", "green") if ok else (f"over by {gib(used - budget)} GiB", "bold red")
        rows.append(((name, ""), (gib(used), ""), (gib(budget), ""), (gib(usable), ""), mark))
    return Grid(("ledger", "hot set", "budget", "usable", ""), (False, True, True, True, False), tuple(rows))


MODEL_COLUMNS = ("model", "mode", "prio", "weights", "KV", "compute", "ovhd", "estimate", "hard", "GPU", "source")


def _models(plan: Plan) -> Grid:
    rows: list[tuple[Span, ...]] = []
    unit, size = unit_for(plan.hot_total, *(m.quota_hard for m in plan.models.values()))
    for m in plan.models.values():
        e = m.estimate
        figures = (e.weights.bytes, e.kv.bytes, e.compute.bytes, e.overhead.bytes, e.estimate_bytes)
        rows.append(
            (
                (m.name, ""),
                (m.model.spec.mode, "green" if m.hot else "blue"),
                (str(m.priority), ""),
                *((in_unit(b, size), "") for b in figures),
                (in_unit(m.quota_hard, size), "bold"),
                (in_unit(e.gpu.bytes, size), ""),
                (e.source, ""),
            )
        )
    gpu = in_unit(plan.hot_gpu_total, size) if plan.capacity.gpu_budget else "-"
    rows.append((("hot set", ""), *[("", "")] * 7, (in_unit(plan.hot_total, size), "bold"), (gpu, ""), ("", "")))
    return Grid(
        MODEL_COLUMNS,
        tuple(col not in ("model", "mode", "source") for col in MODEL_COLUMNS),
        tuple(rows),
        boxed=True,
        collapse=True,
        title=f"{unit} per model; hard = estimate x (1 + quota_headroom)",
        rule_after=len(rows) - 2,
        no_wrap=True,
    )


NODE_COLUMNS = ("node", "platform", "hot", "cold", "hot set", "budget", "GPU set", "GPU budget", "")


def _node_rows(plan: Plan) -> Grid:
    rows: list[tuple[Span, ...]] = []
    for name, node in plan.nodes.items():
        cap, hot = node.capacity, sum(m.hot for m in node.models.values())
        over = [
            f"{ledger} over by {gib(used - budget)} GiB" for ledger, used, budget, _, ok in ledger_lines(node) if not ok
        ]
        texts = (
            name,
            node.platform.preset or node.platform.kind,
            str(hot),
            str(len(node.models) - hot),
            gib(node.hot_total),
            gib(cap.budget),
            gib(node.hot_gpu_total) if cap.gpu_budget is not None else "-",
            gib(cap.gpu_budget) if cap.gpu_budget is not None else "-",
        )
        mark = ("; ".join(over), "bold red") if over else ("ok", "green")
        rows.append((*((t, "") for t in texts), mark))
    return Grid(
        NODE_COLUMNS,
        tuple(col not in ("node", "platform", "") for col in NODE_COLUMNS),
        tuple(rows),
        boxed=True,
        title="GiB per node (hard quotas)",
        no_wrap=True,
    )


def _where_the_rest_is() -> Line:
    return Line.of(
        "every model's figures: --format markdown or json; one model's, where it goes and why: umemc explain "
        "STACK MODEL",
        "dim",
    )


def _cold(plan: Plan) -> list[Line]:
    if not plan.cold_admission:
        return []
    lines = [Line.of("cold models:", "bold")]
    for name, a in plan.cold_admission.items():
        style = "green" if a.fits_alongside_hot else ("yellow" if a.admissible else "red")
        lines.append(Line.of(f"  {name}: {admission_text(a)}", style))
    return lines


def _splits(plan: Plan) -> list[Line]:
    """Models split across nodes: which node holds which of their layers."""
    return [Line.of(f"{m.name}: {split_text(m.split)}", "cyan") for m in plan.models.values() if m.split is not None]


def _advice(plan: Plan) -> list[Line]:
    return [Line.of(a, "bold red" if not a.startswith(" ") else "red") for a in plan.advice]


def _warnings(plan: Plan) -> list[Line]:
    return [Line.of(f"warning: {w}", "yellow") for w in plan.warnings]


# -- drawn by rich ------------------------------------------------------------------------------------------


def rich_group(blocks: list[Block]) -> Group:
    from rich import box
    from rich.console import Group, RenderableType
    from rich.table import Table
    from rich.text import Text

    parts: list[RenderableType] = []
    for block in blocks:
        if isinstance(block, Line):
            parts.append(Text.assemble(*block.spans))
            continue
        table = Table(
            title=block.title or None,
            title_justify="left",
            title_style="dim",
            header_style="bold",
            box=box.SIMPLE_HEAD if block.boxed else None,
            pad_edge=False,
            collapse_padding=block.collapse,
        )
        for header, right in zip(block.headers, block.right, strict=True):
            table.add_column(Text(header), justify="right" if right else "left", no_wrap=block.no_wrap)
        for i, row in enumerate(block.rows):
            table.add_row(*(Text(text, style) for text, style in row))
            if i == block.rule_after:
                table.add_section()
        parts.append(table)
    return Group(*parts)


# -- drawn without rich, off a terminal ---------------------------------------------------------------------


def plain_text(blocks: list[Block]) -> str | None:
    """What rich prints for these blocks on a 200-column console without colour and with soft wraps;
    None where that is not certain (rich then draws them)."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Line):
            lines = "".join(text for text, _ in block.spans).split("\n")
            if not all(line.isprintable() for line in lines):
                return None  # rich strips control characters and expands tabs
            out += lines
            continue
        grid = _plain_grid(block)
        if grid is None:
            return None
        out += grid
    return "".join(line + "\n" for line in out)


def _narrow(text: str) -> bool:
    """One column per character (printable ASCII: rich measures other text by its terminal cells), words
    one space apart (rich strips spaces at a justified edge)."""
    return text.isascii() and text.isprintable() and text == text.strip() and "  " not in text


def _plain_grid(g: Grid) -> list[str] | None:
    n = len(g.headers)
    table = [list(g.headers), *([text for text, _ in row] for row in g.rows)]
    if not all(_narrow(text) for row in table for text in row) or not g.title.isprintable():
        return None
    # rich's padding: one space either side of a cell, none at the table's outer edges (pad_edge off), and
    # with collapsed padding only the right one
    pads = [(0 if i == 0 or g.collapse else 1, 0 if i == n - 1 else 1) for i in range(n)]
    widths = [max(len(row[i]) for row in table) + left + right or 1 for i, (left, right) in enumerate(pads)]
    edges = 2 + (n - 1) if g.boxed else 0  # the box's edges and one divider between columns
    if sum(widths) + edges > WIDTH:
        return None  # rich would shrink columns to fit

    def row_text(row: list[str]) -> str:
        cells = []
        for text, width, (left, right), to_right in zip(row, widths, pads, g.right, strict=True):
            inner = width - left - right
            cells.append(" " * left + (text.rjust(inner) if to_right else text.ljust(inner)) + " " * right)
        return (" " + " ".join(cells) + " ") if g.boxed else "".join(cells)

    lines = [g.title] if g.title else []
    if not g.boxed:
        return lines + [row_text(row) for row in table]
    blank = " " * (sum(widths) + edges)
    lines += [blank, row_text(table[0]), " " + "─" * (sum(widths) + n - 1) + " "]
    for i, row in enumerate(table[1:]):
        lines.append(row_text(row))
        if i == g.rule_after and i != len(g.rows) - 1:
            lines.append(blank)
    return [*lines, blank]


def plain_stdout(stream: TextIO | None = None) -> bool:
    """Whether rich would treat `stream` (stdout) as no terminal (its Console.is_terminal: TTY_COMPATIBLE,
    then FORCE_COLOR, then isatty) and could write its box characters (a UTF encoding)."""
    stream = stream or sys.stdout
    compatible, force = os.environ.get("TTY_COMPATIBLE", ""), os.environ.get("FORCE_COLOR")
    if compatible in ("0", "1"):
        terminal = compatible == "1"
    elif force is not None:
        terminal = force != ""
    else:
        try:
            terminal = stream.isatty()
        except ValueError:  # closed
            terminal = False
    return not terminal and (getattr(stream, "encoding", None) or "utf-8").lower().startswith("utf")


def plain_budget(plan: Plan) -> str | None:
    """The budget as rich would print it on stdout, where stdout is no terminal and that text is certain; else
    None (the caller draws it with rich, print_budget)."""
    return plain_text(budget_blocks(plan)) if plain_stdout() else None


def print_budget(plan: Plan, console: Console) -> None:
    console.print(rich_group(budget_blocks(plan)))
