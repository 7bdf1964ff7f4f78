"""Small models of every architecture family umemc models beyond the dense transformer (mixture of experts,
sliding windows with sinks, latent attention, next-token-prediction layers, Mamba-2 hybrids), written as
sparse GGUFs (`sparsegguf`) for tests and bench/accuracy.py: llama.cpp loads them and reports its buffers.
Shapes are small but keep each architecture's structure (which layers slide, which are recurrent, how many
experts run); rows are multiples of 256 so every quantization type applies as it does at full size."""

from __future__ import annotations

from ..catalog.archs import LlmPreset, MlaShape, SsmShape, llm_preset

_SRC = "umemc.testing.tinyarchs (a small model of the architecture, not a published one)"

TINY: dict[str, LlmPreset] = {
    p.name: p
    for p in (
        llm_preset(
            "tiny-gpt-oss", "gpt-oss", layers=4, embd=512, ff=512, heads=8, kv_heads=2, head_dim=64,
            vocab=2048, ctx=4096, swa=128, swa_pattern=2, n_expert=8, n_expert_used=2, n_ff_exp=512,
            family="llm", qkv_bias=True, attn_out_bias=True, sinks=True, post_attn_norm=True, expert_bias=True,
            default_quant="MXFP4_MOE", source=_SRC,
        ),
        llm_preset(
            "tiny-mixtral", "llama", layers=4, embd=512, ff=1024, heads=8, kv_heads=2, vocab=2048, ctx=4096,
            n_expert=8, n_expert_used=2, n_ff_exp=1024, family="llm", source=_SRC,
        ),
        llm_preset(
            "tiny-qwen3moe", "qwen3moe", layers=4, embd=512, ff=1024, heads=8, kv_heads=2, head_dim=64,
            vocab=2048, ctx=4096, n_expert=16, n_expert_used=4, n_ff_exp=256, family="llm", qk_norm=True,
            source=_SRC,
        ),
        llm_preset(
            "tiny-glm4moe", "glm4moe", layers=5, embd=512, ff=1024, heads=8, kv_heads=2, head_dim=64,
            vocab=2048, ctx=4096, n_expert=16, n_expert_used=4, n_ff_exp=256, n_ff_shexp=256,
            n_layer_dense_lead=1, n_layer_nextn=1, expert_weights_norm=True, expert_weights_scale=1.0,
            family="llm", qkv_bias=True, post_attn_norm=True, exp_probs_b=True, source=_SRC,
        ),
        llm_preset(
            "tiny-llama4", "llama4", layers=4, embd=512, ff=1024, heads=8, kv_heads=2, head_dim=64,
            vocab=2048, ctx=16384, swa=8192, swa_pattern=4, n_expert=4, n_expert_used=1, n_ff_exp=512,
            n_ff_shexp=512, family="llm", source=_SRC,
        ),
        llm_preset(
            "tiny-deepseek2", "deepseek2", layers=4, embd=512, ff=1024, heads=8, kv_heads=8, vocab=2048,
            ctx=4096, n_expert=16, n_expert_used=4, n_ff_exp=256, n_ff_shexp=512, n_layer_dense_lead=1,
            family="llm", mla=MlaShape(q_lora_rank=256, kv_lora_rank=256, qk_nope=64, qk_rope=32, v_head=64),
            source=_SRC,
        ),
        llm_preset(
            "tiny-granitehybrid", "granitehybrid", layers=6, embd=512, ff=256, heads=8, kv_heads=2,
            head_dim=64, vocab=2048, ctx=4096, attention_layers=(2,), n_expert=8, n_expert_used=2,
            n_ff_exp=256, n_ff_shexp=512, family="llm", tied_embeddings=True,
            ssm=SsmShape(d_conv=4, d_inner=1024, d_state=64, n_group=1, n_head=16), source=_SRC,
        ),
    )
}  # fmt: skip
