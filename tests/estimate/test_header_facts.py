"""What the file says decides the graph, not the architecture's name: a gate on the FFN (dense, routed, shared), a
deepstack input, the positions a token, read from GGUFs written with the gguf package."""

from __future__ import annotations

from pathlib import Path

from umemc.catalog.archs import LlmShape
from umemc.estimate import gguf_file
from umemc.testing.discover import ArchSpec, write_discovered

E, FF = 256, 512


def _read(tmp_path: Path, arch: str, tensors: dict[str, tuple[int, ...]], **keys: object) -> LlmShape:
    base = {"block_count": 2, "embedding_length": E, "feed_forward_length": FF, "attention.head_count": 4,
            "context_length": 4096}  # fmt: skip
    spec = ArchSpec("t", arch, {**base, **keys}, 1000, "a test")
    path = write_discovered(tmp_path / f"{arch}.gguf", spec, {"token_embd.weight": (E, 1000), **tensors}, "F32")
    shape = gguf_file.read(path).shape
    assert shape is not None
    return shape


def _blocks(*names: str, shape: tuple[int, ...] = (E, FF)) -> dict[str, tuple[int, ...]]:
    return {f"blk.{i}.{n}.weight": shape for i in range(2) for n in names}


def test_a_dense_ffn_without_a_gate_tensor_is_ungated(tmp_path: Path) -> None:
    assert _read(tmp_path, "starcoder2", _blocks("ffn_up")).ffn_gated is False
    assert _read(tmp_path, "llama", _blocks("ffn_up", "ffn_gate")).ffn_gated is True
    # Phi-3's gate and up in one tensor, twice the FFN's width: gated (the SwiGLU splits it), joint
    phi = _read(tmp_path, "phi3", {**_blocks("ffn_up", shape=(E, 2 * FF)), **_blocks("attn_qkv", shape=(E, 3 * E))})
    assert (phi.ffn_gated, phi.ffn_joint, phi.qkv_fused) == (True, True, (True, True))
    assert _read(tmp_path, "llama", _blocks("ffn_up", "ffn_gate")).ffn_joint is False
    # nothing to say where the file has no dense FFN at all: the common case
    assert _read(tmp_path, "qwen3moe", _blocks("ffn_up_exps", "ffn_gate_exps", shape=(E, FF, 8))).ffn_gated is True


def test_experts_and_shared_experts_without_a_gate_are_ungated(tmp_path: Path) -> None:
    ungated = _read(
        tmp_path, "nemotron_h_moe",
        {**_blocks("ffn_up_exps", shape=(E, FF, 8)), **_blocks("ffn_up_shexp")},
        expert_count=8, expert_used_count=2,
    )  # fmt: skip
    assert (ungated.experts_gated, ungated.shexp_gated) == (False, False)
    gated = _read(
        tmp_path, "qwen3moe",
        {**_blocks("ffn_up_exps", "ffn_gate_exps", shape=(E, FF, 8)), **_blocks("ffn_up_shexp", "ffn_gate_shexp")},
        expert_count=8, expert_used_count=2,
    )  # fmt: skip
    assert (gated.experts_gated, gated.shexp_gated) == (True, True)


def test_deepstack_layers_and_m_rope_positions_are_read(tmp_path: Path) -> None:
    vl = _read(tmp_path, "qwen3vl", {}, n_deepstack_layers=3, **{"rope.dimension_sections": [24, 20, 20, 0]})
    assert (vl.n_deepstack, vl.n_pos) == (3, 4)
    # GLM-4.5: four positions only where the file has rope sections (GLM-4.5V), else one
    assert _read(tmp_path, "glm4moe", {}, **{"rope.dimension_sections": [8, 12, 12, 0]}).n_pos == 4
    assert _read(tmp_path, "glm4moe", {}).n_pos == 1
    assert (_read(tmp_path, "llama", {}).n_deepstack, _read(tmp_path, "llama", {}).n_pos) == (0, 1)


def test_an_encoder_llama_cpp_keeps_no_cache_for_is_not_causal(tmp_path: Path) -> None:
    # llama_model::create_memory gives these no memory: EmbeddingGemma among them, whatever its window
    shape = _read(tmp_path, "gemma-embedding", {}, **{"attention.sliding_window": 512})
    assert (shape.causal, shape.swa_layers) == (False, (True, True))


def _norms(*kinds: str) -> dict[str, tuple[int, ...]]:
    return {f"blk.{i}.{k}.weight": (E,) for i in range(2) for k in kinds}


def test_where_a_blocks_norms_are_is_read_from_its_tensors(tmp_path: Path) -> None:
    # as llama.cpp's builders use them: Llama's before each branch; Gemma 2/3's and GLM-4's before and after; OLMo 2's
    # and EXAONE 4's only after (no attn_norm); Cohere's one norm both branches read (no ffn_norm); gpt-oss's and
    # GLM-4.5's post_attention_norm is the FFN's own norm under another name
    cases = {
        "pre": ("attn_norm", "ffn_norm"),
        "sandwich": ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"),
        "post": ("post_attention_norm", "post_ffw_norm"),
        "parallel": ("attn_norm",),
    }
    for expected, kinds in cases.items():
        assert _read(tmp_path, "novel", _norms(*kinds)).block_norms == expected, kinds
    assert _read(tmp_path, "novel", _norms("attn_norm", "post_attention_norm")).block_norms == "pre"
    assert _read(tmp_path, "novel", {}).block_norms == ""  # no block listed: not known


def test_a_q_norm_as_wide_as_the_projection_is_flat_and_one_heads_wide_is_per_head(tmp_path: Path) -> None:
    heads = _read(tmp_path, "novel", {"blk.0.attn_q_norm.weight": (E // 4,)})
    flat = _read(tmp_path, "novel", {"blk.0.attn_q_norm.weight": (E,)})
    assert (heads.qk_norm, heads.qk_norm_flat, flat.qk_norm, flat.qk_norm_flat) == (True, False, True, True)
    from umemc.estimate.graphs.recipes import inferred

    assert (inferred(heads).qk_norm, inferred(flat).qk_norm) == ("heads", "flat")
