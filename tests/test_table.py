"""The budget table off a terminal: umemc's plain writer prints the very bytes rich prints for the same blocks
on the console `umemc check` uses there (200 columns, soft wraps, no colour). rich is the oracle: each case is
drawn by both and compared whole."""

from __future__ import annotations

import io
import random
import string
from pathlib import Path

import pytest
from rich.console import Console

from umemc.budget.plan import make_plan
from umemc.stack.resolve import load_stack
from umemc.targets.table import Grid, Line, budget_blocks, plain_stdout, plain_text, rich_group

REPO = Path(__file__).resolve().parents[1]


def rich_text(blocks: list[Line | Grid]) -> str:
    out = io.StringIO()
    Console(file=out, highlight=False, width=200, soft_wrap=True, force_terminal=False).print(rich_group(blocks))
    return out.getvalue()


def plan_of(path: Path):  # type: ignore[no-untyped-def]
    return make_plan(load_stack(path))


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.toml")), ids=lambda p: p.stem)
def test_examples_print_as_rich_prints_them(example: Path) -> None:
    blocks = budget_blocks(plan_of(example))
    assert plain_text(blocks) == rich_text(blocks)


def many_nodes(n: int, over: bool) -> str:
    """n CPU nodes of 8 GiB, two hot models each (one node over its budget when `over`), a cold one."""
    text = ['version = 1\nname = "many"\n']
    for i in range(n):
        text.append(f'[nodes.n{i}]\nkind = "cpu"\nmemory = "8GiB"\n')
    for i in range(2 * n):
        size = 9000 if over and i == 0 else 1500 + 10 * i
        text.append(
            f'[models.m{i}]\nruntime = "command"\ncommand = ["true"]\nmemory = "{size}MiB"\npriority = {i % 100}\n'
            f'nodes = ["n{i % n}"]\n'
        )
    text.append('[models.later]\nruntime = "command"\ncommand = ["true"]\nmemory = "2GiB"\nmode = "cold"\n')
    return "\n".join(text)


@pytest.mark.parametrize(("nodes", "over"), [(3, False), (3, True), (13, False), (13, True)])
def test_node_tables_and_node_rows_print_as_rich_prints_them(write_stack, nodes: int, over: bool) -> None:
    plan = plan_of(write_stack(many_nodes(nodes, over)))
    assert plan.fits is not over
    blocks = budget_blocks(plan)
    assert any(isinstance(b, Grid) and b.headers[0] == "node" for b in blocks) is (nodes > 12)
    assert plain_text(blocks) == rich_text(blocks)


def random_grid(rng: random.Random) -> Grid:
    n = rng.randint(1, 9)
    width = rng.choice([3, 12, 30])
    alphabet = string.ascii_letters + string.digits + ".-;()[]:%"  # markup and emoji look-alikes are text here

    def text() -> str:
        words = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(rng.randint(0, width // 4))
        ]
        line = " ".join(words)
        return line if rng.random() < 0.99 else rng.choice(["", " "]) + line + rng.choice(["  ", " "])

    rows = tuple(tuple((text(), rng.choice(["", "bold", "green"])) for _ in range(n)) for _ in range(rng.randint(0, 5)))
    return Grid(
        tuple(text() for _ in range(n)),
        tuple(rng.random() < 0.5 for _ in range(n)),
        rows,
        boxed=rng.random() < 0.7,
        collapse=rng.random() < 0.5,
        title=rng.choice(["", "a title", "a title longer than most of these tables are wide, on one line " * 2]),
        rule_after=rng.choice([None, *range(len(rows))]),
        no_wrap=rng.random() < 0.5,
    )


def test_random_grids_print_as_rich_prints_them_or_are_left_to_rich() -> None:
    """Widths, justification, boxes, collapsed padding, titles, blank rules and empty cells: where the plain
    writer answers, its answer is rich's; it declines only grids wider than the console (rich shrinks those) and
    cells with spaces at an edge or two together (rich strips some of them)."""
    rng = random.Random(32)
    declined = 0
    for _ in range(400):
        blocks: list[Line | Grid] = [Line.of("above"), random_grid(rng), Line((("below ", "bold"), ("it", "red")))]
        plain = plain_text(blocks)
        if plain is None:
            declined += 1
            grid = blocks[1]
            assert isinstance(grid, Grid)
            cells = [*grid.headers, *(text for row in grid.rows for text, _ in row)]
            spaced = any(text != text.strip() or "  " in text for text in cells)
            assert spaced or max(len(line) for line in rich_text(blocks).splitlines()) == 200  # rich fitted it to 200
            continue
        assert plain == rich_text(blocks)
    assert 0 < declined < 150


@pytest.mark.parametrize(
    "block",
    [
        Line.of("a tab\there"),
        Line.of("a bell \x07"),
        Grid(("model",), (False,), ((("模型", ""),),)),  # two terminal cells a character
        Grid(("model",), (False,), ((("x\x1b[31m", ""),),)),
    ],
    ids=["tab", "control", "wide", "escape"],
)
def test_what_rich_would_change_is_left_to_rich(block: Line | Grid) -> None:
    assert plain_text([block]) is None


def test_plain_only_where_rich_sees_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich's Console.is_terminal: TTY_COMPATIBLE 0/1 first, then FORCE_COLOR (set and non-empty: a terminal),
    then isatty; and its boxes need a UTF encoding."""

    class Stream(io.StringIO):
        def __init__(self, tty: bool, encoding: str = "utf-8") -> None:
            super().__init__()
            self.tty, self.enc = tty, encoding

        def isatty(self) -> bool:
            return self.tty

        @property
        def encoding(self) -> str:  # type: ignore[override]
            return self.enc

    cases = [  # TTY_COMPATIBLE, FORCE_COLOR, isatty -> plain
        (None, None, False, True),
        (None, None, True, False),
        (None, "1", False, False),
        (None, "", False, True),
        (None, "", True, True),  # set and empty: no terminal (force-color.org is silent; rich reads it so)
        ("1", None, False, False),
        ("0", "1", True, True),
        ("2", None, True, False),
    ]
    for compatible, force, tty, plain in cases:
        for name, value in (("TTY_COMPATIBLE", compatible), ("FORCE_COLOR", force)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        assert plain_stdout(Stream(tty)) is plain, (compatible, force, tty)
        assert Console(file=Stream(tty)).is_terminal is not plain, (compatible, force, tty)  # rich agrees
    monkeypatch.delenv("TTY_COMPATIBLE")
    assert plain_stdout(Stream(tty=False, encoding="ascii")) is False  # rich would draw an ASCII box


def test_check_off_a_terminal_prints_the_rich_table(run_cli) -> None:
    """The whole command, stdout captured (no terminal): the plain writer's bytes, which are rich's."""
    stack = REPO / "examples/strix-halo-5.toml"
    code, out, _ = run_cli("check", str(stack))
    assert code == 0
    assert out == rich_text(budget_blocks(plan_of(stack)))
    assert out.splitlines()[:6] == [
        "umemc strix-halo-5   FITS   headroom 33.2 GiB",
        "strix-halo-128 (amd-apu): 128.0 GiB RAM, 8.0 GiB OS reserve, GPU window 120.0 GiB, safety margin 15%",
        "hard quotas enforced by the kernel (a memory cgroup per worker, where the machine allows) and umemc's "
        "enforcer",
        "ledger      hot set  budget  usable    ",
        "all memory     68.8   102.0   120.0  ok",
        "GPU window     66.6   102.0   120.0  ok",
    ]


def test_a_small_stack_reads_in_mib(tmp_path: Path, run_cli) -> None:
    """A model of a few MiB (every figure under 1 GiB): the model table is in MiB, each figure to a tenth; its
    weights are the file's tensor bytes (as the gguf package reads them). With a 1 GiB model beside it: GiB."""
    import gguf

    from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2))
    tensors = sum(int(t.n_bytes) for t in gguf.GGUFReader(tmp_path / "tiny.gguf").tensors)
    stack = tmp_path / "stack.toml"
    stack.write_text(
        'version = 1\nname = "small"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n[models.chat]\n'
        'runtime = "llama-server"\nmodel = "tiny.gguf"\ncontext = 1024\n'
    )
    code, out, _ = run_cli("check", str(stack))
    assert code == 0 and "MiB per model; hard = estimate x (1 + quota_headroom)" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("chat "))
    assert row[3] == f"{tensors / 2**20:.1f}"
    big = stack.read_text().replace('context = 1024\n', 'context = 1024\n[models.big]\nruntime = "command"\n'
                                    'command = ["true"]\nmemory = "1GiB"\n')  # fmt: skip
    stack.write_text(big)
    code, out, _ = run_cli("check", str(stack))
    assert code == 0 and "GiB per model; hard = estimate x (1 + quota_headroom)" in out
