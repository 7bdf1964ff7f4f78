"""Small models of each 2026 architecture family (umemc.testing.tinyarchs) loaded by real llama.cpp
(llama-cpp-python): its own buffer report against `umemc check` on the file. Weights and KV (with a hybrid's
recurrent state) must match to the 0.01 MiB llama.cpp prints; compute never more than 10% below llama.cpp's and
within the small-model bound above it that bench/RESULTS.md records (the experts' outputs term, exact for
full-size qwen3moe and glm4moe, is conservative on these small ones, whose allocator reuses more; full-size figures
are in the bench's tables)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from umemc.budget.plan import make_plan
from umemc.stack.resolve import load_stack
from umemc.testing.sparsegguf import write_sparse_gguf
from umemc.testing.tinyarchs import TINY

pytestmark = [
    pytest.mark.llama,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="llama-cpp-python not installed: python3 dev.py setup-llama",
    ),
]
MiB = 2**20
LOADER = """
import sys, llama_cpp
llama_cpp.Llama(model_path=sys.argv[1], n_ctx=2048, n_batch=512, n_ubatch=512, flash_attn=True, use_mmap=True,
                verbose=True)
"""
PATTERNS = {
    "weights": r"CPU(?:_Mapped)? model buffer size =\s+([\d.]+) MiB",
    "kv": r"(?:KV|RS) buffer size =\s+([\d.]+) MiB",
    "compute": r"(?:CPU compute|output) buffer size =\s+([\d.]+) MiB",
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_llama_cpp_reports_what_umemc_estimates(write_stack, tmp_path: Path, name: str) -> None:
    preset = TINY[name]
    ftype = preset.default_quant if preset.default_quant != "Q4_K_M" else "Q8_0"
    path, _ = write_sparse_gguf(tmp_path / f"{name}.gguf", preset, ftype)
    log = subprocess.run([sys.executable, "-c", LOADER, str(path)], capture_output=True, text=True, check=True).stderr
    real = {k: sum(float(x) for x in re.findall(p, log)) * MiB for k, p in PATTERNS.items()}
    stack = write_stack(
        f'version = 1\nname = "t"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n[models.m]\n'
        f'runtime = "llama-cpp-python"\nmodel = "{path}"\ncontext = 2048\nmmap = false\n'
    )
    e = make_plan(load_stack(stack)).models["m"].estimate
    assert abs(e.weights.bytes - real["weights"]) <= 0.01 * MiB
    assert abs(e.kv.bytes - real["kv"]) <= 0.01 * MiB
    assert -0.10 * real["compute"] <= e.compute.bytes - real["compute"] <= 0.40 * real["compute"]
