"""GGML tensor types, llama.cpp file types (quantization mixes) and KV-cache types.

Kept free of numpy/gguf so `umemc check` on arch presets never imports them; a test checks the
block table against `gguf.GGML_QUANT_SIZES` (docs/ESTIMATES.md, "GGUF weights").
"""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .archs import LlmPreset

# type name -> (elements per block, bytes per block); ggml/src/ggml.c type_traits.
BLOCK: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "IQ4_NL": (32, 18),
    "IQ4_XS": (256, 136),
    "IQ3_S": (256, 110),
    "IQ3_XXS": (256, 98),
    "IQ2_S": (256, 82),
    "IQ2_XS": (256, 74),
    "IQ2_XXS": (256, 66),
    "IQ1_M": (256, 56),
    "IQ1_S": (256, 50),
    "MXFP4": (32, 17),
}


def row_bytes(type_name: str, n: int) -> int:
    """ggml_row_size: bytes of `n` consecutive elements of a type (n must fill whole blocks)."""
    block, size = BLOCK[type_name]
    return (n // block) * size


def tensor_bytes(type_name: str, shape: tuple[int, ...]) -> int:
    rows = 1
    for dim in shape[1:]:
        rows *= dim
    return row_bytes(type_name, shape[0]) * rows


# llama.cpp file types (`llama-quantize` names) -> the base tensor type of the mix
# (src/llama-quant.cpp, llama_model_quantize_impl: default_type per ftype).
FILE_TYPES: dict[str, str] = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q8_0": "Q8_0",
    "Q6_K": "Q6_K",
    "Q5_K_M": "Q5_K",
    "Q5_K_S": "Q5_K",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q4_K_M": "Q4_K",
    "Q4_K_S": "Q4_K",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "IQ4_XS": "IQ4_XS",
    "IQ4_NL": "IQ4_NL",
    "Q3_K_L": "Q3_K",
    "Q3_K_M": "Q3_K",
    "Q3_K_S": "Q3_K",
    "Q2_K": "Q2_K",
    "Q2_K_S": "Q2_K",
    "IQ3_M": "IQ3_S",
    "IQ3_S": "IQ3_S",
    "IQ3_XS": "IQ3_S",
    "IQ3_XXS": "IQ3_XXS",
    "IQ2_M": "IQ2_S",
    "IQ2_S": "IQ2_XS",
    "IQ2_XS": "IQ2_XS",
    "IQ2_XXS": "IQ2_XXS",
    "IQ1_M": "IQ1_M",
    "IQ1_S": "IQ1_S",
    "MXFP4_MOE": "MXFP4",  # experts MXFP4, every other matrix Q8_0 (gpt-oss as published)
}

# gguf `general.file_type` numbers (gguf-py LlamaFileType) for the names above.
FILE_TYPE_IDS: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    38: "MXFP4_MOE",
}

# Bits of precision, to compare a file type with what a model family wants (in practice vision at Q4 lost
# ~15 mAP points; embeddings want F16, speech Q8).
FILE_TYPE_BITS: dict[str, float] = {
    "F32": 32,
    "F16": 16,
    "BF16": 16,
    "Q8_0": 8.5,
    "Q6_K": 6.56,
    "Q5_K_M": 5.7,
    "Q5_K_S": 5.57,
    "Q5_1": 6.0,
    "Q5_0": 5.5,
    "Q4_K_M": 4.89,
    "Q4_K_S": 4.67,
    "Q4_1": 5.0,
    "Q4_0": 4.5,
    "IQ4_XS": 4.46,
    "IQ4_NL": 4.5,
    "Q3_K_L": 4.3,
    "Q3_K_M": 3.91,
    "Q3_K_S": 3.64,
    "Q2_K": 3.16,
    # llama-quantize's own table of the low-bit types (bits per weight of its Llama-3-8B reference files)
    "IQ3_M": 3.66,
    "IQ3_S": 3.44,
    "IQ3_XS": 3.3,
    "IQ3_XXS": 3.06,
    "Q2_K_S": 2.96,
    "IQ2_M": 2.7,
    "IQ2_S": 2.5,
    "IQ2_XS": 2.31,
    "IQ2_XXS": 2.06,
    "IQ1_M": 1.75,
    "IQ1_S": 1.56,
    "MXFP4_MOE": 4.25,
}

# KV cache types (llama-server -ctk/-ctv) -> ggml type. docs/ESTIMATES.md "KV cache".
KV_TYPES: dict[str, str] = {
    "f32": "F32",
    "f16": "F16",
    "bf16": "BF16",
    "q8_0": "Q8_0",
    "q5_1": "Q5_1",
    "q5_0": "Q5_0",
    "q4_1": "Q4_1",
    "q4_0": "Q4_0",
    "iq4_nl": "IQ4_NL",
}

FLOAT_KV_TYPES = frozenset({"f32", "f16", "bf16"})  # the rest are quantized (ggml_is_quantized)


def quantized_kv(kv_type: str) -> bool:
    """A quantized KV cache: llama.cpp needs flash attention for its V, and writes it turned by a Hadamard matrix."""
    return kv_type not in FLOAT_KV_TYPES


# torch dtypes -> bytes per parameter.
TORCH_DTYPES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}

# whisper.cpp model types (ggml .bin files) -> ggml type.
WHISPER_TYPES: dict[str, str] = {
    "f32": "F32",
    "f16": "F16",
    "q8_0": "Q8_0",
    "q5_1": "Q5_1",
    "q5_0": "Q5_0",
    "q4_1": "Q4_1",
    "q4_0": "Q4_0",
}

_FALLBACK = {  # tensor_type_fallback: 256-element types on rows that are not a multiple of 256
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
    "Q2_K": "Q4_0",
    "Q3_K": "Q4_0",
    **dict.fromkeys(("IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S"), "IQ4_NL"),
}


def _more_bits(i: int, n: int) -> bool:
    # llama-quant.cpp use_more_bits: the first and last eighth, and every third layer between.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@cache  # a pure function of the name, asked several times for every tensor of every preset
def category(name: str) -> str:
    """llama-quant.cpp tensor_get_category (same order of tests)."""
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for part, cat in (
        ("attn_qkv.weight", "attn_v"),  # category_is_attn_v: qkv, kv_b and v are treated alike
        ("attn_kv_b.weight", "attn_v"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if part in name:
            return cat
    return "other"


# llama-quant.cpp tensor_allows_quantization: the matrices it leaves in their source type, by name part
_NEVER_QUANTIZED = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight", "time_mix_first.weight",
    "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
    "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd",
)  # fmt: skip


_NEVER_QUANTIZED_RE = re.compile("|".join(map(re.escape, _NEVER_QUANTIZED)))  # any of them in the name


def quantizable(name: str, ndim: int) -> bool:
    """tensor_allows_quantization: 2-D+ weights, not norms, routers, BERT's position/token-type tables, conv
    kernels, Gemma 3n's altup/laurel, RWKV's small mixing matrices (_NEVER_QUANTIZED)."""
    return (
        ndim >= 2
        and name.endswith("weight")
        and _NEVER_QUANTIZED_RE.search(name) is None
        and name not in ("position_embd.weight", "token_types.weight")
    )


def source_type(name: str, shape: tuple[int, ...], default: str = "F16") -> str:
    """What a converter writes for a tensor the quantizer leaves alone: f32 for vectors, biases, norms,
    routers, conv kernels and Mamba's A/D; the model's own type for other matrices."""
    if len(shape) < 2 or not name.endswith("weight") or "_norm.weight" in name:
        return "F32"
    if "ffn_gate_inp" in name or "ssm_conv1d" in name or "shortconv.conv" in name:
        return "F32"
    return default


_LAYER = re.compile(r"blk\.(\d+)\.")
_EIGHT_EXPERT_ATTN_OUT = frozenset(
    {"Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS"}
)
# the 1- and 2-bit mixes llama.cpp chooses by their own rules (llama-quant.cpp's first ftype branch)
_LOWEST = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_OUTPUT_Q5K = _LOWEST | {"IQ3_XXS"}  # their output matrix (and a tied embedding) is Q5_K, not Q6_K


class MixState:
    """The per-file counters llama-quant.cpp keeps (i_attention_wv, i_ffn_down) while choosing types."""

    def __init__(
        self, ftype: str, n_attn_v: int, n_layer: int, n_gqa: int, *, is_70b: bool, tied: bool, n_expert: int = 0
    ):
        self.ftype, self.base = ftype, FILE_TYPES[ftype]
        self.n_attn_v, self.n_layer = n_attn_v, n_layer  # llama.cpp: n_ffn_down = n_layer_all
        self.i_attn_v = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.n_gqa, self.is_70b, self.tied, self.n_expert = n_gqa, is_70b, tied, n_expert

    def choose(self, name: str, shape: tuple[int, ...], source_type: str) -> str:
        """The type llama-quantize writes for one tensor (llama_tensor_get_type + fallback)."""
        if not quantizable(name, len(shape)):
            return source_type
        base = self.base
        if base in ("F32", "F16", "BF16"):
            return base
        new = self._mix(name, category(name), shape, base)
        return _fallback(new, shape[0])

    def _mix(self, name: str, cat: str, shape: tuple[int, ...], base: str) -> str:
        ft = self.ftype
        edge = self._edges(ft, cat, shape, base)
        if edge is not None:
            return edge
        if ft in _LOWEST:
            return self._lowest(ft, cat, base)
        if cat == "attn_v":
            return self._attn_v(ft, base)
        if cat == "attn_k":
            return "Q8_0" if self.n_expert == 8 else {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(ft, base)
        if cat == "attn_q":
            return {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(ft, base)
        if cat == "ffn_down":
            return self._ffn_down(ft, base, name)
        if cat == "attn_output":
            if self.n_expert == 8:
                return "Q5_K" if ft in _EIGHT_EXPERT_ATTN_OUT else base
            return {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}.get(
                ft, base
            )
        return self._gate_up(ft, base, cat, name) if cat in ("ffn_gate", "ffn_up") else base

    def _edges(self, ft: str, cat: str, shape: tuple[int, ...], base: str) -> str | None:
        """The output matrix (and an embedding tied to it), MXFP4's experts, the token embedding."""
        if cat == "output" or (self.tied and cat == "token_embd"):
            if ft == "MXFP4_MOE" or shape[0] % BLOCK[base][0] != 0:
                return "Q8_0"
            if ft in _OUTPUT_Q5K:
                return "Q5_K"
            return base if base == "Q8_0" else "Q6_K"
        if ft == "MXFP4_MOE":  # expert tensors (3-D) MXFP4, everything else Q8_0
            return "MXFP4" if len(shape) > 2 and shape[2] > 1 else "Q8_0"
        if cat == "token_embd":
            if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
                return "Q2_K"
            return "IQ3_S" if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS") else base
        return None

    def _lowest(self, ft: str, cat: str, base: str) -> str:
        """llama-quant.cpp's branch for IQ1_S/M and IQ2_*: more bits where they matter most."""
        iq3 = ft in ("IQ2_S", "IQ2_M")
        if cat == "attn_v":
            self.i_attn_v += 1
            if self.n_gqa >= 4 or self.n_expert >= 4:
                return "Q4_K"
            return "IQ3_S" if iq3 else "Q2_K"
        if cat == "attn_k" and self.n_expert == 8:
            return "Q4_K"
        if cat == "ffn_down":
            i = self.i_ffn_down  # this branch counts the tensors, experts or not
            self.i_ffn_down += 1
            return ("IQ3_S" if iq3 else "Q2_K") if i < self.n_layer // 8 else base
        if cat == "attn_output":
            if self.n_expert == 8:
                return "Q5_K"
            return "IQ2_XXS" if ft in ("IQ1_S", "IQ1_M") else "IQ3_S" if iq3 else base
        return base

    def _gate_up(self, ft: str, base: str, cat: str, name: str) -> str:
        if cat == "ffn_gate":
            i = self.i_ffn_gate
            self.i_ffn_gate += 1
        else:
            i = self.i_ffn_up
            self.i_ffn_up += 1
        if self.n_expert > 1:
            m = _LAYER.match(name)
            i = int(m.group(1)) if m else i
        n = self.n_layer
        return "IQ3_XXS" if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8 else base

    def _ffn_down(self, ft: str, base: str, name: str) -> str:
        i, n = self.i_ffn_down, self.n_layer
        self.i_ffn_down += 1
        if self.n_expert > 1:  # experts are not in layer order: llama.cpp reads the layer from the name
            m = _LAYER.match(name)
            i = int(m.group(1)) if m else i
        if ft == "Q2_K":
            return "Q3_K"
        if ft == "Q2_K_S":
            return "Q4_K" if i < n // 8 else base
        if ft == "IQ3_M" and (i < n // 8 or (self.n_expert == 8 and _more_bits(i, n))):
            return "Q4_K"
        if ft == "Q3_K_M":
            return "Q5_K" if i < n // 16 else "Q4_K"
        if ft == "Q3_K_L":
            return "Q5_K"
        if ft in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
            return "Q6_K"
        # (IQ4_NL/IQ4_XS without an importance matrix would take Q5_K for the first eighth: published I-quants
        # all have one, and llama-quantize's IQ1/IQ2 refuse to run without)
        if ft == "Q4_K_S" and i < n // 8:
            return "Q5_K"
        return base

    def _attn_v(self, ft: str, base: str) -> str:
        i = self.i_attn_v
        self.i_attn_v += 1
        new = base
        if ft == "Q2_K":
            new = "Q4_K" if self.n_gqa >= 4 else "Q3_K"
        elif ft == "Q2_K_S" and self.n_gqa >= 4:
            new = "Q4_K"
        elif ft == "IQ3_XXS":  # published IQ files are quantized with an importance matrix
            new = "Q4_K" if self.n_gqa >= 4 else "IQ3_XXS"
        elif ft in ("IQ3_XS", "IQ3_S") and self.n_gqa >= 4:
            new = "Q4_K"
        elif ft == "IQ3_M":
            new = "Q4_K"
        elif ft == "Q3_K_M":
            new = "Q5_K" if i < 2 else "Q4_K"
        elif ft == "Q3_K_L":
            new = "Q5_K"
        elif ft in ("IQ4_NL", "IQ4_XS") and self.n_gqa >= 4:
            new = "Q5_K"
        elif ft in ("Q4_K_M", "Q5_K_M") and _more_bits(i, self.n_attn_v):
            new = "Q6_K"
        elif ft == "Q4_K_S" and i < 4:
            new = "Q5_K"
        if self.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"  # 70B-class: attn_v is 8x smaller than attn_q, so more bits cost little
        if self.n_expert == 8:
            new = "Q8_0"  # llama.cpp: "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
        return new


def _fallback(type_name: str, ncols: int) -> str:
    if ncols % BLOCK[type_name][0] == 0:
        return type_name
    fallback = _FALLBACK.get(type_name, "F16")
    return fallback if ncols % BLOCK[fallback][0] == 0 else "F16"


def mix_types(
    ftype: str,
    tensors: list[tuple[str, tuple[int, ...]]],
    n_gqa: int,
    *,
    is_70b: bool,
    source: str = "F16",
    n_layer: int | None = None,
    n_expert: int = 0,
) -> list[str]:
    """Types of every tensor in a file of `ftype` (tensors in GGUF order, shapes as ggml ne)."""
    names = [name for name, _ in tensors]
    state = MixState(
        ftype,
        n_attn_v=sum(category(n) == "attn_v" for n in names),
        n_layer=n_layer if n_layer is not None else sum(category(n) == "ffn_down" for n in names),
        n_gqa=n_gqa,
        is_70b=is_70b,
        tied="output.weight" not in names,
        n_expert=n_expert,
    )
    return [state.choose(name, shape, source_type(name, shape, source)) for name, shape in tensors]


# Weight repacking (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type, and the extra buffer type's
# supports_op): llama.cpp's CPU backend copies weights of these types into an interleaved layout (a CPU_REPACK
# buffer) when the CPU has AVX2, which x86-64 servers and desktops of the last decade have: the 2-D matrices of
# a MUL_MAT and the 3-D expert stacks of a MUL_MAT_ID (`*_exps.weight`), 8 rows at a time. AVX-512 adds Q2_K;
# ARM builds repack other sets (NEON with dotprod/i8mm: Q4_0, Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4, Q8_0), which
# `umemc calibrate` measures. token_embd is read with get_rows, which the repacked layout does not support, so
# it stays in the mapped file. Measured with llama-cpp-python 0.3.36: Llama-3-8B Q4_K_M repacks its 192 Q4_K
# matrices, 3204 MiB; gpt-oss-20b its MXFP4 experts; Q8_0, Q6_K, F16 are not repacked on x86-64.
REPACK_ISA = "x86-64 with AVX2"
REPACKED_TYPES = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})


def is_repacked(name: str, type_name: str, shape: tuple[int, ...]) -> bool:
    """Whether llama.cpp's CPU backend keeps a repacked copy of this tensor (shape in ggml order)."""
    if type_name not in REPACKED_TYPES or name == "token_embd.weight" or len(shape) < 2 or shape[1] % 8:
        return False
    if len(shape) == 2:
        return name.endswith("weight")
    return len(shape) == 3 and name.endswith("_exps.weight")


def loaded(name: str, n_layer_main: int) -> bool:
    """Whether llama.cpp loads a tensor: not those of the next-token-prediction blocks after n_layer_main."""
    return not name.startswith("blk.") or int(name.split(".")[1]) < n_layer_main


@cache
def preset_mix(preset: LlmPreset, ftype: str) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """(name, ggml shape, type) of every tensor of a preset quantized as `ftype`; computed once per pair
    (a stack of many models of one preset, the weights figure and the repacked copy share it)."""
    tensors = preset.tensors()
    s = preset.shape
    types = mix_types(ftype, tensors, s.n_gqa, is_70b=preset.is_70b, n_layer=s.n_layer, n_expert=s.n_expert)
    return tuple((name, shape, t) for (name, shape), t in zip(tensors, types, strict=True))
