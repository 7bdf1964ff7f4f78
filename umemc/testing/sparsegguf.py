"""Full-size GGUF files with a preset's real tensor shapes and llama.cpp's quantization mix, written
sparse: the header (architecture keys, a vocabulary of the real size, every tensor's name, shape and
type) is real, the tensor data is a hole. llama.cpp loads such a file with mmap and reports its
buffers without reading the weights, so a 70B model's memory can be measured on a 24 GiB machine.

The tensor types come from `umemc.catalog.quant.preset_mix` (`mix_types`), umemc's port of llama.cpp's
`llama_tensor_get_type`; bench/accuracy.py checks the resulting file sizes against the published
GGUF files of the same models (an independent source) before trusting them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..catalog.archs import LlmPreset, LlmShape
from ..catalog.quant import preset_mix, tensor_bytes
from .tinygguf import add_vocabulary

# llama.cpp's LLAMA_FTYPE numbers for general.file_type (llama.h)
FILE_TYPE_ID = {
    "F16": 1,
    "Q4_0": 2,
    "Q8_0": 7,
    "Q4_K_M": 15,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "Q4_K_S": 14,
    "Q3_K_M": 12,
    "MXFP4_MOE": 38,
}


def write_sparse_gguf(path: Path, preset: LlmPreset, ftype: str) -> tuple[Path, dict[str, str]]:
    """Write `preset` quantized as `ftype`; returns the path and each tensor's type."""
    import gguf
    import numpy as np

    s = preset.shape
    w = gguf.GGUFWriter(str(path), s.arch)
    w.add_name(f"sparse-{preset.name}-{ftype}")
    _hyperparameters(w, preset)
    w.add_file_type(FILE_TYPE_ID[ftype])
    add_vocabulary(w, s.n_vocab)
    mix = preset_mix(preset, ftype)
    for name, ne, t in mix:
        qtype = gguf.GGMLQuantizationType[t]
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), tensor_bytes(t, ne), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    data = sum(w.ggml_pad(tensor_bytes(t, ne), w.data_alignment) for _, ne, t in mix)
    size = fout.tell() + data
    fout.truncate(size)  # the data region is a hole: it reads as zeros and takes no disk space
    w.close()
    return path, {name: t for name, _, t in mix}


def _expert_keys(w: Any, s: LlmShape) -> None:
    """The mixture-of-experts keys (a shared expert's width as a count of routed ones where the converter writes
    it so: deepseek2, glm4moe)."""
    w.add_expert_count(s.n_expert)
    w.add_expert_used_count(s.n_expert_used)
    w.add_expert_feed_forward_length(s.n_ff_exp)
    if s.arch in ("deepseek2", "glm4moe"):
        w.add_expert_shared_count(s.n_ff_shexp // s.n_ff_exp)
    elif s.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(s.n_ff_shexp)
    if s.n_layer_dense_lead:
        w.add_leading_dense_block_count(s.n_layer_dense_lead)
    if s.expert_weights_norm:
        w.add_expert_weights_norm(True)
    if s.expert_weights_scale:
        w.add_expert_weights_scale(s.expert_weights_scale)


def _hyperparameters(w: Any, preset: LlmPreset) -> None:
    """The keys llama.cpp's loader reads for the preset's architecture (src/models/<arch>.cpp), named as the
    converter (convert_hf_to_gguf.py) writes them."""
    s, a = preset.shape, preset.shape.arch
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    if s.recurrent_layers or len(set(s.n_head_kv)) > 1:
        w.add_head_count_kv(list(s.n_head_kv))
    else:
        w.add_head_count_kv(s.n_head_kv[0])
    w.add_key_length(s.head_dim_k)
    w.add_value_length(s.head_dim_v)
    w.add_rope_dimension_count(preset.mla.qk_rope if preset.mla else s.head_dim_k)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if not s.causal:  # an encoder (bert): layer norms with bias, bidirectional attention, a pooled output
        import gguf

        w.add_layer_norm_eps(1e-5)
        w.add_causal_attention(False)
        w.add_pooling_type(gguf.PoolingType.CLS)
        w.add_token_type_count(1)
    if s.sliding_window:
        w.add_sliding_window(s.sliding_window)
    if s.n_expert:
        _expert_keys(w, s)
    if s.no_rope:
        w.add_rope_scaling_finetuned(False)
    if a == "llama4":
        w.add_uint32(f"{a}.interleave_moe_layer_step", 1)
    if s.n_layer_nextn:
        w.add_uint32(f"{a}.nextn_predict_layers", s.n_layer_nextn)
    if preset.mla is not None:
        m = preset.mla
        w.add_kv_lora_rank(m.kv_lora_rank)
        if m.q_lora_rank:
            w.add_q_lora_rank(m.q_lora_rank)
        w.add_uint32(f"{a}.attention.key_length_mla", m.qk_nope + m.qk_rope)
        w.add_uint32(f"{a}.attention.value_length_mla", m.v_head)
    if preset.ssm is not None:
        m2 = preset.ssm
        w.add_ssm_conv_kernel(m2.d_conv)
        w.add_ssm_inner_size(m2.d_inner)
        w.add_ssm_state_size(m2.d_state)
        w.add_ssm_time_step_rank(m2.n_head)
        w.add_ssm_group_count(m2.n_group)
