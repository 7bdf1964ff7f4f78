"""Architectures umemc was not tuned to, at their published sizes and as small models of the same structure,
for umemc.testing.discover (llama.cpp lays out their tensors) and bench/accuracy.py.

The keys are the GGUF keys llama.cpp's loader reads for each architecture (src/models/<arch>.cpp,
load_arch_hparams), with the values of each model's published config.json (Hugging Face, the repository
named in `source`); where a value was not in what we could consult it is marked "assumed" in `source`. A
value that differs from the real model changes the model's size, not the comparison the benchmark makes:
llama.cpp and umemc read the same file.
"""

from __future__ import annotations

from .discover import ArchSpec

# NVIDIA-Nemotron-Nano-9B-v2's hybrid_override_pattern: M a Mamba-2 layer, * attention, - an MLP
_NEMOTRON_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
_LFM2_ATTENTION = (2, 5, 8, 10, 12, 14)  # LFM2-1.2B's full_attn_idxs; the other layers are short convolutions


def _nemotron(pattern: str, ff: int, kv: int) -> dict[str, list[int]]:
    return {
        "feed_forward_length": [ff if c == "-" else 0 for c in pattern],
        "attention.head_count_kv": [kv if c == "*" else 0 for c in pattern],
    }


FULL: dict[str, ArchSpec] = {
    s.name: s
    for s in (
        ArchSpec(
            "qwen3-next-80b-a3b", "qwen3next",
            {
                "context_length": 262144, "embedding_length": 2048, "block_count": 48, "feed_forward_length": 5120,
                "attention.head_count": 16, "attention.head_count_kv": 2, "attention.key_length": 256,
                "attention.value_length": 256, "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e7,
                "rope.dimension_count": 64, "expert_count": 512, "expert_used_count": 10,
                "expert_feed_forward_length": 512, "expert_shared_feed_forward_length": 512,
                # Gated DeltaNet: conv 4; 16 key heads of 128 (group count, state size), 32 value heads of 128
                "ssm.conv_kernel": 4, "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 32,
                "ssm.inner_size": 4096, "full_attention_interval": 4,
            },
            151936, "Qwen/Qwen3-Next-80B-A3B-Instruct",
            # the DeltaNet layers' fused q/k/v and gate projections, the attention layers' separate q, k, v: the
            # converter's layout (the graph needs one of the loader's spellings)
            optional=(
                "output.weight",
                "blk.N.attn_gate.weight",
                *(f"blk.{i}.attn_qkv.weight" for i in range(48) if i % 4 != 3),
            ),
        ),
        ArchSpec(
            "falcon-h1-34b", "falcon-h1",
            {
                "context_length": 262144, "embedding_length": 5120, "block_count": 72, "feed_forward_length": 21504,
                "attention.head_count": 20, "attention.head_count_kv": 4, "attention.key_length": 128,
                "attention.value_length": 128, "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 1e11,
                "ssm.conv_kernel": 4, "ssm.inner_size": 4096, "ssm.state_size": 256, "ssm.time_step_rank": 32,
                "ssm.group_count": 1,
            },
            261120,
            "tiiuae/Falcon-H1-34B-Instruct (depth, width, heads, Mamba heads and state from the transformers docs' "
            "table; FFN width, vocabulary and group count assumed)",
            optional=("output.weight", "blk.N.ssm_conv1d.bias", "blk.N.ssm_norm.weight"),
        ),
        ArchSpec(
            "nemotron-nano-9b-v2", "nemotron_h",
            {
                "context_length": 131072, "embedding_length": 4480, "block_count": 56,
                **_nemotron(_NEMOTRON_PATTERN, 15680, 8),
                "attention.head_count": 40, "attention.key_length": 128, "attention.value_length": 128,
                "attention.layer_norm_epsilon": 1e-5, "attention.layer_norm_rms_epsilon": 1e-5,
                "ssm.conv_kernel": 4, "ssm.inner_size": 10240, "ssm.state_size": 128, "ssm.time_step_rank": 128,
                "ssm.group_count": 8,
            },
            131072, "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
            optional=("output.weight", "blk.N.ssm_conv1d.bias", "blk.N.ssm_norm.weight"),
        ),
        ArchSpec(
            "lfm2-1.2b", "lfm2",
            {
                "context_length": 128000, "embedding_length": 2048, "block_count": 16, "feed_forward_length": 8192,
                "attention.head_count": 32,
                "attention.head_count_kv": [8 if i in _LFM2_ATTENTION else 0 for i in range(16)],
                "attention.key_length": 64, "attention.value_length": 64, "attention.layer_norm_rms_epsilon": 1e-5,
                "rope.freq_base": 1e6, "shortconv.l_cache": 3,
            },
            65536, "LiquidAI/LFM2-1.2B (tied embeddings)", optional=(),
        ),
        ArchSpec(
            "gemma-3n-e4b", "gemma3n",
            {
                "context_length": 32768, "embedding_length": 2048, "block_count": 35, "feed_forward_length": 16384,
                "attention.head_count": 8, "attention.head_count_kv": 2, "attention.key_length": 256,
                "attention.value_length": 256, "attention.sliding_window": 512,
                "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e6, "rope.dimension_count": 256,
            },
            262144, "google/gemma-3n-E4B-it (tied embeddings; layers 20-34 reuse the caches of layers 18 and 19)",
            optional=(),
        ),
        ArchSpec(
            "seed-oss-36b", "seed_oss",
            {
                "context_length": 524288, "embedding_length": 5120, "block_count": 64, "feed_forward_length": 27648,
                "attention.head_count": 80, "attention.head_count_kv": 8, "attention.key_length": 128,
                "attention.value_length": 128, "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e7,
            },
            155136, "ByteDance-Seed/Seed-OSS-36B-Instruct (q/k/v biases)",
            optional=("output.weight", "blk.N.attn_q.bias", "blk.N.attn_k.bias", "blk.N.attn_v.bias"),
        ),
        ArchSpec(
            "ernie-4.5-21b-a3b", "ernie4_5-moe",
            {
                "context_length": 131072, "embedding_length": 2560, "block_count": 28, "feed_forward_length": 12288,
                "attention.head_count": 20, "attention.head_count_kv": 4, "attention.key_length": 128,
                "attention.value_length": 128, "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 5e5,
                "expert_count": 64, "expert_used_count": 6, "expert_feed_forward_length": 1536,
                "expert_shared_count": 2, "leading_dense_block_count": 1, "interleave_moe_layer_step": 1,
            },
            103424, "baidu/ERNIE-4.5-21B-A3B-PT (tied embeddings, 2 shared experts)", optional=(),
        ),
        ArchSpec(
            "minimax-m2", "minimax-m2",
            {
                "context_length": 196608, "embedding_length": 3072, "block_count": 62, "feed_forward_length": 1536,
                "attention.head_count": 48, "attention.head_count_kv": 8, "attention.key_length": 128,
                "attention.value_length": 128, "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 5e6,
                "rope.dimension_count": 64, "expert_count": 256, "expert_used_count": 8,
                "expert_feed_forward_length": 1536, "expert_gating_func": 2,
            },
            200064, "MiniMaxAI/MiniMax-M2 (sigmoid router with a selection bias)",
            optional=("output.weight", "blk.N.exp_probs_b.bias"),
        ),
    )
}  # fmt: skip
