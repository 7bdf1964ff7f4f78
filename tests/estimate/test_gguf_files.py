"""Estimates from real GGUF files written with the gguf package: weights must equal the header's
tensor bytes exactly, and the KV cache the llama.cpp formula exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from umemc.budget.plan import make_plan
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
    # llama-context.cpp: n_ctx = pad256(context x parallel); one stream per sequence of pad256(n_ctx / parallel)
    n_ctx = -(-(context * parallel) // 256) * 256
    cells = parallel * (-(-(n_ctx // parallel) // 256) * 256)
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


def _every_kind_of_field(path: Path) -> Path:
    """A GGUF with every value type an estimate may meet, string arrays (a tokenizer) and tensors of
    several types, data left as a hole: written by the gguf package itself."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(3)
    w.add_uint64("gemma3.u64", 2**40 + 3)
    w.add_float64("gemma3.f64", 0.125)
    w.add_bool("gemma3.flag", True)
    w.add_int32("gemma3.neg", -7)
    w.add_array("gemma3.attention.head_count_kv", [8, 4, 8])
    w.add_array("gemma3.floats", [0.5, 1.5])
    w.add_string("general.name", "naïve – test")
    w.add_token_list([f"t{i}" for i in range(3000)])
    w.add_array("tokenizer.ggml.merges", [f"a{i} b{i}" for i in range(5000)])
    shapes = {"F32": (64,), "F16": (64, 32), "Q8_0": (64, 32), "Q4_K": (256, 8), "Q6_K": (512, 3)}
    for name, ne in shapes.items():
        qtype = gguf.GGMLQuantizationType[name]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(ne)) // block * size
        w.add_tensor_info(f"t.{name}", tuple(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    w.fout[0].truncate(w.fout[0].tell() + 4096 * 16)
    w.close()
    return path


def test_header_reader_agrees_with_gguf_reader(tmp_path: Path) -> None:
    """umemc's one-pass header reader against the gguf package's GGUFReader on the same files."""
    import gguf

    from umemc.estimate.gguf_header import read_header

    files = [_every_kind_of_field(tmp_path / "kinds.gguf")]
    files += [
        write_tiny_gguf(tmp_path / f"{n}.gguf", spec) for n, spec in (("q", TinySpec(arch="qwen2", ftype="Q8_0")),)
    ]
    for path in files:
        ours, ref = read_header(path), gguf.GGUFReader(str(path), "r")
        assert [(t.name, t.type_name, t.shape, t.n_bytes) for t in ours.tensors] == [
            (t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_bytes)) for t in ref.tensors
        ]
        for key, field in ref.fields.items():
            if key.startswith("GGUF."):
                continue  # the reader's own pseudo-fields (version, counts)
            value = field.contents()
            if isinstance(value, list) and value and isinstance(value[0], str):
                assert key not in ours.fields and ours.counts[key] == len(value), key  # counted, not kept
            elif isinstance(value, list):
                assert ours.fields[key] == pytest.approx(value), key
                assert ours.counts[key] == len(value)
            elif isinstance(value, float):
                assert ours.fields[key] == pytest.approx(value), key
            else:
                assert ours.fields[key] == value, key


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", "the file is empty"),
        (b"GGML" + bytes(20), "not a GGUF file (no GGUF magic)"),
        (b"GGUF" + (1).to_bytes(4, "little") + bytes(16), "GGUF version 1 is not supported (2 and 3 are)"),
        (b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little"), "truncated at byte 16"),
    ],
)
def test_header_reader_refuses_what_is_not_a_gguf(tmp_path: Path, data: bytes, message: str) -> None:
    from umemc.estimate.gguf_header import HeaderError, read_header

    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(HeaderError) as info:
        read_header(path)
    assert str(info.value) == message
