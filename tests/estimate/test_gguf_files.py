"""Estimates from real GGUF files written with the gguf package: weights must equal the header's
tensor bytes exactly, and the KV cache the llama.cpp formula exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from umemc.budget import make_plan
from umemc.stack.resolve import load_stack
from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

SHAPES = {
    "mha-f16": TinySpec(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=4, n_vocab=300),
    "gqa-f16": TinySpec(n_layer=3, n_embd=128, n_ff=352, n_head=8, n_head_kv=2, n_vocab=400),
    "gqa-q8": TinySpec(n_layer=2, n_embd=256, n_ff=512, n_head=8, n_head_kv=1, n_vocab=512, ftype="Q8_0"),
    "qwen2-q8-tied": TinySpec(
        arch="qwen2", n_layer=2, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_vocab=320, ftype="Q8_0", tied=True
    ),
}


def expected_weight_bytes(s: TinySpec) -> int:
    """Independent of umemc and gguf: element counts from the shape, bytes from the ggml types."""

    def matrix(rows: int, cols: int) -> int:
        return rows * cols * 2 if s.ftype == "F16" else rows * (cols // 32) * 34

    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    per_layer = (
        matrix(q, s.n_embd)
        + 2 * matrix(kv, s.n_embd)
        + matrix(s.n_embd, q)
        + 2 * matrix(s.n_ff, s.n_embd)
        + matrix(s.n_embd, s.n_ff)
        + 2 * s.n_embd * 4
    )
    if s.arch == "qwen2":
        per_layer += (q + 2 * kv) * 4
    outputs = 0 if s.tied else matrix(s.n_vocab, s.n_embd)
    return matrix(s.n_vocab, s.n_embd) + s.n_layer * per_layer + s.n_embd * 4 + outputs


def stack_for(tmp_path: Path, model: Path, extra: str = "") -> Path:
    path = tmp_path / "stack.toml"
    path.write_text(
        f'version = 1\nname = "t"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        f'[models.m]\nruntime = "llama-server"\nmodel = "{model.name}"\n{extra}'
    )
    return path


@pytest.mark.parametrize("name", SHAPES)
def test_weights_equal_header_tensor_bytes(tmp_path: Path, name: str) -> None:
    spec = SHAPES[name]
    model = write_tiny_gguf(tmp_path / f"{name}.gguf", spec)
    est = make_plan(load_stack(stack_for(tmp_path, model))).models["m"].estimate
    assert est.source == "gguf"
    assert est.weights.bytes == expected_weight_bytes(spec)


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize(
    "context,parallel,kv,bytes_per_elem",
    [(1000, 1, "f16", 2), (4096, 3, "f32", 4), (300, 2, "q8_0", 34 / 32), (2048, 1, "q4_0", 18 / 32)],
)
def test_kv_exact(tmp_path: Path, name: str, context: int, parallel: int, kv: str, bytes_per_elem: float) -> None:
    spec = SHAPES[name]
    model = write_tiny_gguf(tmp_path / f"{name}.gguf", spec)
    stack = stack_for(tmp_path, model, f'context = {context}\nparallel = {parallel}\nkv_cache = "{kv}"\n')
    est = make_plan(load_stack(stack)).models["m"].estimate
    cells = -(-(context * parallel) // 256) * 256
    expected = spec.n_layer * 2 * spec.n_head_kv * spec.head_dim * cells * bytes_per_elem
    assert est.kv.bytes == int(expected)


def test_file_type_mismatch_warns_and_uses_the_file(tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "m.gguf", SHAPES["gqa-q8"])
    plan = make_plan(load_stack(stack_for(tmp_path, model, 'quant = "Q4_K_M"\n')))
    assert plan.models["m"].estimate.facts["file type"] == "Q8_0"
    assert (
        f'{tmp_path / "stack.toml"}:9:9: models.m.quant: quant = "Q4_K_M" but the file is Q8_0; '
        "the estimate uses the file" in plan.warnings
    )


def test_missing_file_falls_back_to_arch_with_warning(tmp_path: Path) -> None:
    stack = tmp_path / "stack.toml"
    stack.write_text(
        'version = 1\nname = "t"\n[platform]\nkind = "cpu"\nmemory = "32GiB"\n'
        '[models.m]\nruntime = "llama-server"\nmodel = "absent.gguf"\narch = "llama-3-8b"\n'
    )
    plan = make_plan(load_stack(stack))
    assert plan.models["m"].estimate.source == "arch"
    assert plan.warnings[0] == f'{stack}:8:9: models.m.model: file not found, estimating from arch = "llama-3-8b"'


def test_check_reads_gguf_only_when_a_file_exists(tmp_path: Path) -> None:
    """`umemc check` on presets must not import gguf/numpy/torch (they cost ~100 ms and more)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    code = (
        "import sys; from umemc.cli import main; rc = main(['check', sys.argv[1], '--format', 'json']); "
        "print(sorted(m for m in ('torch', 'gguf', 'numpy') if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(repo / "examples/strix-halo-5.toml")], capture_output=True, text=True
    )
    assert out.stderr.strip().splitlines()[-1] == "[]"
    model = write_tiny_gguf(tmp_path / "m.gguf", SHAPES["mha-f16"])
    out = subprocess.run([sys.executable, "-c", code, str(stack_for(tmp_path, model))], capture_output=True, text=True)
    assert out.stderr.strip().splitlines()[-1] == "['gguf', 'numpy']"
