"""Architecture presets: llama.cpp's quantization mix reproduces published files, KV matches the
reference figures of docs/ESTIMATES.md, and the block table matches gguf's."""

from __future__ import annotations

import pytest

from umemc.catalog.archs import LLM_PRESETS
from umemc.catalog.quant import BLOCK, mix_types
from umemc.estimate.llm import compute_figure, kv_figure, weights_from_preset
from umemc.units import KiB


def test_block_table_matches_gguf() -> None:
    import gguf

    for name, (block, size) in BLOCK.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (block, size), name


@pytest.mark.parametrize(
    "arch,ftype,published_gb",
    [
        ("llama-3-70b", "Q4_K_M", 42.52),  # Meta-Llama-3-70B-Instruct Q4_K_M (docs/ESTIMATES.md)
        ("qwen2-72b", "Q4_K_M", 47.41),  # Qwen2-72B-Instruct Q4_K_M (docs/ESTIMATES.md)
    ],
)
def test_mix_reproduces_published_files(arch: str, ftype: str, published_gb: float) -> None:
    got = weights_from_preset(LLM_PRESETS[arch], ftype).bytes / 1e9
    assert abs(got - published_gb) / published_gb < 0.001


def test_mix_rules_for_llama_3_70b_q4_k_m() -> None:
    p = LLM_PRESETS["llama-3-70b"]
    types = dict(
        zip((n for n, _ in p.tensors()), mix_types("Q4_K_M", p.tensors(), p.shape.n_gqa, is_70b=p.is_70b), strict=True)
    )
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"  # untied: the embedding keeps the base type
    assert types["blk.0.attn_v.weight"] == "Q6_K"  # first eighth: more bits
    assert types["blk.11.attn_v.weight"] == "Q5_K"  # (11 - 10) % 3 != 2, but 70B lifts Q4_K to Q5_K
    assert types["blk.12.ffn_down.weight"] == "Q6_K"  # (12 - 10) % 3 == 2
    assert types["blk.11.ffn_down.weight"] == "Q4_K"
    assert types["blk.40.attn_norm.weight"] == "F32"


def test_qwen2_ffn_width_falls_back() -> None:
    """29568 is not a multiple of 256: every ffn_down row falls back (Q4_K->Q5_0, Q6_K->Q8_0)."""
    p = LLM_PRESETS["qwen2-72b"]
    types = mix_types("Q4_K_M", p.tensors(), p.shape.n_gqa, is_70b=p.is_70b)
    downs = [t for (n, _), t in zip(p.tensors(), types, strict=True) if n.endswith("ffn_down.weight")]
    assert sorted(set(downs)) == ["Q5_0", "Q8_0"] and len(downs) == 80


def test_tied_embedding_takes_the_output_rule() -> None:
    p = LLM_PRESETS["gemma-3-27b"]
    types = dict(
        zip((n for n, _ in p.tensors()), mix_types("Q4_K_M", p.tensors(), p.shape.n_gqa, is_70b=p.is_70b), strict=True)
    )
    assert "output.weight" not in types and types["token_embd.weight"] == "Q6_K"


@pytest.mark.parametrize(
    "arch,per_token",
    [("llama-3-8b", 128 * KiB), ("llama-3-70b", 320 * KiB), ("qwen2-72b", 320 * KiB), ("qwen2.5-7b", 56 * KiB)],
)
def test_kv_reference_models(arch: str, per_token: int) -> None:
    shape = LLM_PRESETS[arch].shape
    assert kv_figure(shape, 8192, 1, 512, "f16").bytes == per_token * 8192
    assert kv_figure(shape, 32768, 1, 512, "f16").bytes == per_token * 32768


def test_kv_context_times_parallel_padded() -> None:
    shape = LLM_PRESETS["llama-3-8b"].shape
    assert kv_figure(shape, 1000, 3, 512, "f16").bytes == 128 * KiB * 3072  # 3000 -> 3072 cells


def test_sliding_window_layers_are_capped() -> None:
    """Gemma-3-27B (config.json: 62 layers, every 6th global, sliding_window 1024, 16 KV heads of 128):
    52 sliding layers hold min(32768, 1024 x 1 + 512) = 1536 cells, 10 global layers 32768 cells;
    a cell is 16 x 128 x 2 (K and V) x 2 bytes = 8192 bytes: (52 x 1536 + 10 x 32768) x 8192."""
    shape = LLM_PRESETS["gemma-3-27b"].shape
    assert sum(shape.swa_layers) == 52
    assert kv_figure(shape, 32768, 1, 512, "f16").bytes == 3_338_665_984


def test_attention_scores_dominate_without_flash_attention() -> None:
    """70B at 32K, ubatch 512, no flash attention: the KQ matrix alone is 4 GiB (docs/ESTIMATES.md)."""
    shape = LLM_PRESETS["llama-3-70b"].shape
    graph = compute_figure(shape, 32768, 1, 512, flash_attn=False, outputs=1).parts[0]
    # KQ: n_ctx 32768 x n_ubatch 512 x n_head 64 x 4 bytes = 4 GiB; llama-server reserves 4244.01 MiB for this
    # shape and setting (tests/recorded/reserve-buffers.json, printed with two decimals)
    assert graph.bytes > 32768 * 512 * 64 * 4
    assert abs(graph.bytes / 2**20 - 4244.01) <= 0.005
    with_fa = compute_figure(shape, 32768, 1, 512, flash_attn=True, outputs=1)
    assert with_fa.bytes < graph.bytes / 10
