"""Which layers of a hybrid or shared-KV architecture keep a KV cache and which a recurrent state, as llama.cpp
decides per architecture (src/models/<arch>.cpp load_arch_hparams and the memory filters of
src/llama-model.cpp). Every expected figure is computed by hand below from the GGUF keys written into the file
and llama.cpp's rules; the files hold the keys and one tensor (the estimator reads the header only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from umemc.budget.plan import make_plan
from umemc.stack.resolve import load_stack
from umemc.testing.discover import ArchSpec, write_discovered

F16, F32 = 2, 4
STACK = """version = 1
name = "t"
[platform]
kind = "cpu"
memory = "512GiB"
[models.m]
runtime = "{runtime}"
model = "m.gguf"
context = {context}
parallel = {parallel}
flash_attn = {fa}
mmap = false
"""


def estimate(tmp_path: Path, arch: str, keys: dict[str, Any], *, runtime: str = "llama-server", context: int = 8192,
             parallel: int = 1, fa: bool = True) -> Any:  # fmt: skip
    spec = ArchSpec("m", arch, keys, 1000, "a test")
    write_discovered(tmp_path / "m.gguf", spec, {"token_embd.weight": (keys["embedding_length"], 1000)}, "F32")
    (tmp_path / "stack.toml").write_text(
        STACK.format(runtime=runtime, context=context, parallel=parallel, fa=str(fa).lower())
    )
    return make_plan(load_stack(tmp_path / "stack.toml")).models["m"].estimate


def base(n_layer: int, kv: Any = 2, embd: int = 512) -> dict[str, Any]:
    return {
        "context_length": 32768, "embedding_length": embd, "block_count": n_layer, "feed_forward_length": 1024,
        "attention.head_count": 8, "attention.head_count_kv": kv, "attention.key_length": 64,
        "attention.value_length": 64,
    }  # fmt: skip


MAMBA2 = {"ssm.conv_kernel": 4, "ssm.inner_size": 1024, "ssm.state_size": 64, "ssm.time_step_rank": 16,
          "ssm.group_count": 1}  # fmt: skip
# conv (d_conv - 1) x (d_inner + 2 n_group d_state) + scan d_state x d_inner, f32
MAMBA2_STATE = (3 * (1024 + 2 * 64) + 64 * 1024) * F32
KV_PER_CELL = 2 * 2 * 64 * F16  # K and V of 2 heads of 64, f16


def parts(e: Any) -> list[tuple[str, int]]:
    return [(p.name, p.bytes) for p in e.kv.parts] or [(e.kv.name, e.kv.bytes)]


def attention(e: Any) -> Any:
    return next(p for p in e.compute.parts[0].parts if p.name == "attention")


def test_falcon_h1_keeps_a_kv_cache_and_a_state_on_every_layer(tmp_path: Path) -> None:
    # falcon-h1: attention and a Mamba-2 mixer side by side in all 4 layers (filter_attn and filter_recr both true)
    e = estimate(tmp_path, "falcon-h1", base(4) | MAMBA2)
    assert parts(e) == [("kv cache", 4 * 8192 * KV_PER_CELL), ("recurrent state", 4 * MAMBA2_STATE)]
    assert e.kv.parts[0].inputs["hybrid"] == (
        "every layer keeps a KV cache and a recurrent state (its mixers run side by side)"
    )
    # and its state is per sequence: 3 sequences, 3 rows
    e3 = estimate(tmp_path, "falcon-h1", base(4) | MAMBA2, parallel=3, context=4096)
    assert parts(e3) == [("kv cache", 4 * 3 * 4096 * KV_PER_CELL), ("recurrent state", 3 * 4 * MAMBA2_STATE)]


def test_qwen3_next_attends_every_fourth_layer(tmp_path: Path) -> None:
    # qwen3next: full_attention_interval 4 -> layers 3, 7 attend (8 layers); 6 Gated-DeltaNet layers keep
    # conv (4 - 1) x (2 x 4 key heads x 32 + 256) and a 32 x 256 delta state
    keys = base(8) | {"ssm.conv_kernel": 4, "ssm.inner_size": 256, "ssm.state_size": 32, "ssm.group_count": 4,
                      "ssm.time_step_rank": 8, "full_attention_interval": 4}  # fmt: skip
    state = (3 * (256 + 2 * 4 * 32) + 32 * 256) * F32
    e = estimate(tmp_path, "qwen3next", keys)
    assert parts(e) == [("kv cache", 2 * 8192 * KV_PER_CELL), ("recurrent state", 6 * state)]
    # a file that lists its recurrent layers is read as listed
    listed = keys | {"attention.recurrent_layers": [True, False] * 4}
    assert parts(estimate(tmp_path, "qwen3next", listed)) == [
        ("kv cache", 4 * 8192 * KV_PER_CELL), ("recurrent state", 4 * state)
    ]  # fmt: skip


def test_qwen3_next_attention_holds_its_query_gate_projection(tmp_path: Path) -> None:
    # qwen3next projects query and gate in one tensor of 2 x heads x head dim and applies the gate after the
    # attention, so without flash attention the layer holds, beside the KQ scores (n_kv 8192 x 8 heads per token)
    # and n_embd 512: 6 query widths (8 x 64 = 512) and K and V (2 x 64 each), where ungated attention holds
    # 5 x n_embd + 2 x n_embd_kv (bench/accuracy.py --sweep checks it against llama.cpp's dry run)
    keys = base(8) | {"ssm.conv_kernel": 4, "ssm.inner_size": 256, "ssm.state_size": 32, "ssm.group_count": 4,
                      "ssm.time_step_rank": 8, "full_attention_interval": 4}  # fmt: skip
    per_token = 4 * 512  # f32 x n_ubatch 512
    gated = attention(estimate(tmp_path, "qwen3next", keys, fa=False))
    assert gated.bytes == (8192 * 8 + 512 + 6 * 512 + 2 * 128) * per_token == 142_082_048


def test_nemotron_h_layers_are_mamba_attention_or_mlp(tmp_path: Path) -> None:
    # nemotron_h: a layer with n_ff > 0 is an MLP (neither); n_head_kv 0 and n_ff 0 a Mamba-2 layer
    pattern = "M-M*M-"  # 2 Mamba, 1 attention, ... : M - M * M -
    keys = (
        base(6)
        | MAMBA2
        | {
            "feed_forward_length": [1024 if c == "-" else 0 for c in pattern],
            "attention.head_count_kv": [2 if c == "*" else 0 for c in pattern],
        }
    )
    e = estimate(tmp_path, "nemotron_h", keys)
    assert parts(e) == [("kv cache", 1 * 8192 * KV_PER_CELL), ("recurrent state", 3 * MAMBA2_STATE)]


def test_lfm2_short_convolutions_keep_a_small_state(tmp_path: Path) -> None:
    # lfm2: layers without KV heads run a short convolution of l_cache 3: n_embd x (3 - 1) f32 per sequence
    keys = base(6, kv=[0, 0, 2, 0, 0, 2]) | {"shortconv.l_cache": 3}
    e = estimate(tmp_path, "lfm2", keys)
    assert parts(e) == [("kv cache", 2 * 8192 * KV_PER_CELL), ("recurrent state", 4 * 512 * 2 * F32)]


def test_gemma3n_later_layers_reuse_earlier_caches(tmp_path: Path) -> None:
    # gemma3n: layers from 20 on read the caches of layers 18 and 19; of 0-19, 4 in 5 slide (window 512,
    # pattern 5: layer i slides unless i % 5 == 4), holding pad256(min(8192, 512 + 512)) = 1024 cells
    keys = base(30) | {"attention.sliding_window": 512}
    e = estimate(tmp_path, "gemma3n", keys)
    assert parts(e) == [("kv", (16 * 1024 + 4 * 8192) * KV_PER_CELL)]
    assert e.kv.inputs["shared KV"] == "10 later layers read an earlier layer's cache: no cache of their own"


def test_rwkv_is_recurrent_throughout(tmp_path: Path) -> None:
    # rwkv7: no KV cache; token shift 2 x n_embd and a wkv state n_embd x head size 64 per layer
    keys = base(4) | {"wkv.head_size": 64}
    e = estimate(tmp_path, "rwkv7", keys)
    assert parts(e) == [("kv cache", 0), ("recurrent state", 4 * (2 * 512 + 512 * 64) * F32)]


def test_unknown_hybrid_says_its_state_is_not_counted(tmp_path: Path, run_cli: Any) -> None:
    estimate(tmp_path, "brand-new-hybrid", base(4) | MAMBA2)
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    import json

    assert code == 0
    assert json.loads(out)["warnings"] == [
        "stack.toml:8:9: models.m.model: architecture 'brand-new-hybrid' is not one umemc models: weights are exact "
        "from the header; KV cache and compute follow the generic transformer rules (every layer attends to the "
        "whole context; the compute buffer is the common decoder's graph as the file's tensors describe it, where "
        "they do); it has a recurrent mixer but no layer "
        "without KV heads: its recurrent state is NOT counted (the estimate may be low by it); "
        "`umemc check --measure` asks llama.cpp itself"
    ]


def test_v_without_flash_attention_is_as_wide_as_the_widest_layer(tmp_path: Path) -> None:
    # llama_kv_cache stores V transposed without flash attention, every layer's V n_embd_v_gqa_max wide
    # (4 KV heads x 64); K keeps each layer's own width
    keys = base(2, kv=[2, 4])
    k = (2 + 4) * 64 * F16 * 8192
    assert estimate(tmp_path, "llama", keys, fa=True).kv.bytes == k + (2 + 4) * 64 * F16 * 8192
    assert estimate(tmp_path, "llama", keys, fa=False).kv.bytes == k + 2 * 4 * 64 * F16 * 8192


def test_llama_server_reserves_one_row_of_logits_per_sequence(tmp_path: Path) -> None:
    # llama-server's n_outputs_max is n_parallel (server_output_limits): the reserve graph's logits are 1000 x
    # (2 sequences) x 4, far below the in-layer peak here; llama-cpp-python reserves all 512 rows of the ubatch
    # (granite: an architecture whose compute buffer is the formula, not the allocator replay)
    keys = base(2)
    server = estimate(tmp_path, "granite", keys, parallel=2, context=2048)
    logits = next(p for p in server.compute.parts[0].parts if p.name == "logits")
    assert logits.bytes == (1000 + 2 * 512) * 2 * F32
    library = estimate(tmp_path, "granite", keys, runtime="llama-cpp-python", context=2048)
    logits = next(p for p in library.compute.parts[0].parts if p.name == "logits")
    assert logits.bytes == (1000 + 2 * 512) * 512 * F32
