"""umemc's port of llama.cpp's quantization mix (umemc.catalog.quant, what the architecture path sizes a model
by) against llama-quantize itself: a real F16 GGUF written by the gguf package is quantized to every file type
umemc knows, and the type llama.cpp chose for each tensor is read back from the file it wrote. The I-quants and
Q2_K_S run with an importance matrix that llama-imatrix computes on the same model, as published I-quants are
made (llama-quantize refuses the lowest of them without one). Every file type runs as llama-quantize's own
--dry-run (the same type choice, no quantizing, milliseconds); two of them are quantized for real and read from the
file, so the dry run's listing is checked against what llama.cpp writes."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from umemc.catalog.quant import FILE_TYPES, mix_types
from umemc.estimate.gguf_header import read_header
from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("UMEMC_LLAMA_BIN") or REPO / ".venv" / "llama-server" / "bin")
QUANTIZE, IMATRIX = BIN / "llama-quantize", BIN / "llama-imatrix"
pytestmark = [
    pytest.mark.llama_server,
    pytest.mark.skipif(
        not (QUANTIZE.exists() and IMATRIX.exists()),
        reason=f"no llama-quantize/llama-imatrix in {BIN}: python3 dev.py setup-llama-server",
    ),
]
# shapes of whole 256-element blocks (no fallback types), 16 layers (the first and last eighth matter), and the
# two sides of llama.cpp's n_gqa >= 4 rules
MODELS = {
    "gqa4": TinySpec(n_layer=16, n_embd=256, n_ff=768, n_head=8, n_head_kv=2, n_vocab=512),
    "gqa2": TinySpec(n_layer=16, n_embd=256, n_ff=768, n_head=8, n_head_kv=4, n_vocab=512, tied=True),
}
NEEDS_IMATRIX = ("IQ", "Q2_K_S")
FTYPES = [f for f in FILE_TYPES if f not in ("F32", "F16", "BF16", "MXFP4_MOE")]


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, TinySpec]:
    d = tmp_path_factory.mktemp(request.param)
    spec = MODELS[request.param]
    path = write_tiny_gguf(d / "m.gguf", spec)
    text = d / "text.txt"
    words = "the quick brown fox jumps over the lazy dog and runs far away".split()
    text.write_text(" ".join(words[(i * 7) % len(words)] for i in range(3000)))
    imatrix = d / "imatrix.gguf"
    done = subprocess.run(
        [str(IMATRIX), "-m", str(path), "-f", str(text), "-o", str(imatrix), "-c", "128", "--chunks", "4"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return path, imatrix, spec


# "[   4/ 147] blk.0.attn_k.weight  - [   256,  64, 1, 1], type =    f16, size =  0.03 MiB ->  0.01 MiB (q4_K)"
LISTED = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^]]*\], type =\s+(\w+),.*?(?:\((\w+)\))?$", re.M)


def quantize(model, ftype: str, out: Path | None) -> str:
    path, imatrix, _ = model
    argv = [str(QUANTIZE), *(["--imatrix", str(imatrix)] if ftype.startswith(NEEDS_IMATRIX) else [])]
    argv += ["--dry-run", str(path), ftype] if out is None else [str(path), str(out), ftype]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


def umemc_types(model, ftype: str) -> dict[str, str]:
    path, _, spec = model
    source = read_header(path).tensors
    want = mix_types(
        ftype, [(t.name, t.shape) for t in source], spec.n_head // spec.n_head_kv, is_70b=False, n_layer=16
    )
    return {t.name: w for t, w in zip(source, want, strict=True)}


@pytest.mark.parametrize("ftype", FTYPES)
def test_every_tensor_gets_the_type_llama_quantize_gives_it(model, ftype: str) -> None:
    listed = {name: (new or old).upper() for name, old, new in LISTED.findall(quantize(model, ftype, None))}
    assert len(listed) == len(read_header(model[0]).tensors)
    assert umemc_types(model, ftype) == listed


@pytest.mark.parametrize("ftype", ["Q4_K_M", "IQ2_XXS"])
def test_the_file_llama_quantize_writes_has_those_types(model, ftype: str, tmp_path: Path) -> None:
    out = tmp_path / f"{ftype}.gguf"
    quantize(model, ftype, out)
    assert umemc_types(model, ftype) == {t.name: t.type_name for t in read_header(out).tensors}
