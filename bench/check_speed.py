"""`umemc check` wall time against `python -c "import pydantic"` (the anchor), same run, as a
median ratio; and the time to check a generated 1000-model stack.

    python bench/check_speed.py [--runs 15]

Goals: ratio <= 3x, table and json alike; 1000 models <= 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import ROOT, timed, write_section

PY = sys.executable
EXAMPLE = ROOT / "examples" / "strix-halo-5.toml"


def big_stack(path: Path, n: int) -> Path:
    archs = ["llama-3-8b", "qwen2.5-7b", "phi-4", "gemma-3-27b", "bge-m3"]
    parts = ['version = 1\nname = "big"\n[platform]\nkind = "cpu"\nmemory = "100TiB"\n']
    for i in range(n):
        parts.append(
            f'[models.m{i}]\nruntime = "llama-server"\nmodel = "models/m{i}.gguf"\narch = "{archs[i % len(archs)]}"\n'
            f'context = {2048 * (1 + i % 4)}\nmode = "{"hot" if i % 3 else "cold"}"\npriority = {i % 101}\n'
        )
    path.write_text("\n".join(parts))
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    runs = ap.parse_args().runs
    # Like an installed package (pip writes bytecode at install time), and like the anchor, whose
    # bytecode is in site-packages: compile umemc once, even where PYTHONDONTWRITEBYTECODE is set.
    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "umemc")], check=True)
    json_check = [PY, "-m", "umemc", "check", str(EXAMPLE), "--format", "json"]
    table_check = [PY, "-m", "umemc", "check", str(EXAMPLE)]  # the table (off a terminal: no colours)
    anchor = [PY, "-c", "import pydantic"]
    timed(json_check), timed(table_check), timed(anchor)  # warm the page cache
    # interleaved: same noise for all three
    runs3 = [(timed(json_check), timed(table_check), timed(anchor)) for _ in range(runs)]
    a = statistics.median(r[2] for r in runs3)
    rows = []
    for i, label in enumerate(("--format json", "(table)")):
        ratios = [r[i] / r[2] for r in runs3]
        rows.append(
            f"| `umemc check examples/strix-halo-5.toml {label}` | {statistics.median(r[i] for r in runs3) * 1000:.0f}"
            f" ms | {statistics.median(ratios):.2f} (worst {max(ratios):.2f}) |"
        )
    with tempfile.TemporaryDirectory() as d:
        stack = big_stack(Path(d) / "big.toml", 1000)
        big = [timed([PY, "-m", "umemc", "check", str(stack), "--format", "json"]) for _ in range(5)]
    lines = [
        f"Python {sys.version.split()[0]}, {runs} interleaved runs each, medians (wall clock).",
        "",
        "| what | median | ratio to anchor |",
        "|---|---:|---:|",
        f'| `python -c "import pydantic"` (anchor) | {a * 1000:.0f} ms | 1.00 |',
        *rows,
        f"| `umemc check` on a generated 1000-model stack | {statistics.median(big) * 1000:.0f} ms | - |",
        "",
        "Goals: ratio <= 3x for the table and json alike; 1000 models <= 2 s.",
    ]
    text = "\n".join(lines)
    print(text)
    write_section("umemc check speed (bench/check_speed.py)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
