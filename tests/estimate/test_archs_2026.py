"""The architectures people run in 2026 beyond the dense transformer: every expected figure below is computed
by hand in the test from the model's published config.json (numbers in the comments) and llama.cpp's rules
(docs/ESTIMATES.md), never by calling the estimator's helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umemc.budget.plan import make_plan
from umemc.stack.resolve import load_stack
from umemc.testing.sparsegguf import write_sparse_gguf
from umemc.testing.tinyarchs import TINY
from umemc.testing.tinygguf import CHATML

STACK = """version = 1
name = "t"
[platform]
kind = "cpu"
memory = "512GiB"
[models.m]
runtime = "{runtime}"
{source}
context = {context}
parallel = {parallel}
flash_attn = {fa}
mmap = {mmap}
"""


def estimate(write_stack, source: str, runtime: str = "llama-server", context: int = 8192, parallel: int = 1,
             fa: bool = True, mmap: bool = False):  # fmt: skip
    text = STACK.format(
        runtime=runtime, source=source, context=context, parallel=parallel, fa=str(fa).lower(), mmap=str(mmap).lower()
    )
    return make_plan(load_stack(write_stack(text))).models["m"].estimate


def test_gpt_oss_kv_has_half_its_layers_on_the_window(write_stack) -> None:
    # gpt-oss-20b: 24 layers, 8 KV heads of 64, sliding window 128 on every other layer (sliding first).
    per_cell = 2 * 8 * 64 * 2  # K and V, f16
    window_cells = 768  # pad256(min(8192, 128 + 512))
    e = estimate(write_stack, 'arch = "gpt-oss-20b"')
    assert e.kv.bytes == per_cell * (12 * 8192 + 12 * window_cells) == 220_200_960
    # llama-cpp-python keeps llama.cpp's full-size SWA caches: every layer holds all 8192 cells
    assert estimate(write_stack, 'arch = "gpt-oss-20b"', runtime="llama-cpp-python").kv.bytes == 24 * 8192 * per_cell


def test_gpt_oss_kv_with_four_sequences_keeps_one_window_per_stream(write_stack) -> None:
    # llama-server -np 4 without --kv-unified: 4 streams of pad256(8192) cells, windows pad256(128 + 512) each
    per_cell = 2 * 8 * 64 * 2
    e = estimate(write_stack, 'arch = "gpt-oss-20b"', parallel=4)
    assert e.kv.bytes == per_cell * (12 * 4 * 8192 + 12 * 4 * 768)


def test_mla_cache_keeps_one_latent_row_and_no_v(write_stack) -> None:
    # DeepSeek-V2-Lite: 27 layers, kv_lora_rank 512 + qk_rope_head_dim 64 per token, f16, no V
    e = estimate(write_stack, 'arch = "deepseek-v2-lite"')
    assert e.kv.bytes == 27 * 8192 * (512 + 64) * 2 == 254_803_968


def test_glm_next_token_prediction_layer_has_no_cache_and_no_weights(write_stack) -> None:
    # GLM-4.5-Air: 46 of its 47 blocks run; 8 KV heads of 128
    e = estimate(write_stack, 'arch = "glm-4.5-air"')
    assert e.kv.bytes == 46 * 8192 * (2 * 8 * 128 * 2) == 1_543_503_872
    assert e.weights.inputs["next-token-prediction layers"] == (
        "1 in the file, not loaded (llama.cpp skips them unless it drafts with them)"
    )


def test_hybrid_counts_attention_kv_and_the_recurrent_state(write_stack) -> None:
    # Granite-4.0-H-Small: attention at 4 of 40 layers (8 KV heads of 128); 36 Mamba-2 layers with d_conv 4,
    # d_inner 8192, d_state 128, 1 group: conv state 3 x (8192 + 2 x 128), SSM state 128 x 8192, f32, 1 sequence
    e = estimate(write_stack, 'arch = "granite-4.0-h-small"')
    kv = 4 * 8192 * (2 * 8 * 128 * 2)
    state = 36 * (3 * (8192 + 2 * 128) + 128 * 8192) * 4
    assert [(p.name, p.bytes) for p in e.kv.parts] == [("kv cache", kv), ("recurrent state", state)]
    assert e.kv.bytes == 134_217_728 + 154_644_480
    # the state is per sequence, whatever the context
    e2 = estimate(write_stack, 'arch = "granite-4.0-h-small"', context=4096, parallel=2)
    assert e2.kv.parts[1].bytes == 2 * state


def test_mixtral_compute_is_what_llama_server_reserves(write_stack) -> None:
    # Mixtral-8x7B at 8K, ubatch 512, flash attention, one sequence: llama-server reserves a compute buffer of
    # 208.01 MiB for this shape (tests/recorded/reserve-buffers.json, printed with two decimals), and the output
    # buffer holds one row of 32000 logits
    e = estimate(write_stack, 'arch = "mixtral-8x7b"')
    graph, output = e.compute.parts
    assert abs(graph.bytes / 2**20 - 208.01) <= 0.005
    assert output.bytes == 32000 * 4


def test_repacked_copy_includes_mxfp4_experts(write_stack) -> None:
    # gpt-oss-20b on a CPU with mmap: the 72 MXFP4 expert stacks (24 layers x gate/up/down, 32 experts of
    # 2880 x 2880, 17 bytes per 32) are copied into CPU_REPACK; its Q8_0 matrices are not (AVX2)
    e = estimate(write_stack, 'arch = "gpt-oss-20b"', runtime="llama-cpp-python", mmap=True)
    repack = next(p for p in e.weights.parts if p.name == "repacked copy")
    assert repack.bytes == 24 * 3 * 32 * 2880 * 2880 * 17 // 32 == 10_152_345_600


def test_gguf_skips_next_token_prediction_tensors(write_stack, tmp_path: Path) -> None:
    import gguf

    path, _ = write_sparse_gguf(tmp_path / "glm.gguf", TINY["tiny-glm4moe"], "Q8_0")
    reader = gguf.GGUFReader(str(path))  # the gguf package's own reader: an independent sum
    loaded = sum(int(t.n_bytes) for t in reader.tensors if not t.name.startswith("blk.4."))
    assert loaded < sum(int(t.n_bytes) for t in reader.tensors)
    e = estimate(write_stack, f'model = "{path}"')
    assert e.weights.bytes == loaded


def test_unknown_architecture_is_said_not_guessed(write_stack, run_cli, tmp_path: Path) -> None:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "novel")
    for k, v in (("block_count", 2), ("embedding_length", 256), ("feed_forward_length", 512)):
        w.add_uint32(f"novel.{k}", v)
    w.add_uint32("novel.attention.head_count", 4)
    w.add_chat_template(CHATML)
    w.add_tensor("token_embd.weight", np.zeros((100, 256), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_stack(STACK.format(runtime="llama-server", source='model = "x.gguf"', context=4096, parallel=1,
                             fa="true", mmap="false"))  # fmt: skip
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 0
    report = json.loads(out)
    assert report["models"]["m"]["weights_bytes"] == 100 * 256 * 4
    assert report["warnings"] == [
        "stack.toml:8:9: models.m.model: architecture 'novel' is not one umemc models: weights are exact from the "
        "header; KV cache and compute follow the generic transformer rules (every layer attends to the whole "
        "context; the compute buffer is the common decoder's graph as the file's tensors describe it, where they "
        "do); `umemc check --measure` asks llama.cpp itself"
    ]


def test_explain_names_mxfp4_moe(write_stack, run_cli, tmp_path: Path) -> None:
    path, _ = write_sparse_gguf(tmp_path / "oss.gguf", TINY["tiny-gpt-oss"], "MXFP4_MOE")
    write_stack(STACK.format(runtime="llama-server", source=f'model = "{path}"', context=4096, parallel=1,
                             fa="true", mmap="false"))  # fmt: skip
    code, out, _ = run_cli("explain", "stack.toml", "m", cwd=tmp_path)
    assert code == 0
    assert "file type: MXFP4_MOE" in out and "file type ?" not in out and "file type: ?" not in out


@pytest.mark.parametrize("name", sorted(TINY))
def test_header_and_preset_agree(write_stack, tmp_path: Path, name: str) -> None:
    """Reading a sparse file back gives the preset's own estimate: the header facts (windows, experts, MLA,
    nextn, recurrent layers) are read the way the presets declare them."""
    p = TINY[name]
    path, _ = write_sparse_gguf(
        tmp_path / f"{name}.gguf", p, p.default_quant if p.default_quant != "Q4_K_M" else "Q8_0"
    )
    from_file = estimate(write_stack, f'model = "{path}"', context=4096)
    shape = p.shape
    # KV computed by hand from the preset's declared shape
    per_layer = []
    for i in range(shape.n_layer):
        if i >= shape.n_layer - shape.n_layer_nextn or shape.n_head_kv[i] == 0:
            continue
        cells = 4096
        if shape.swa_layers and shape.swa_layers[i]:
            cells = min(4096, -(-(shape.sliding_window + 512) // 256) * 256)
        v = 0 if shape.mla else shape.head_dim_v * shape.n_head_kv[i] * 2
        per_layer.append((shape.head_dim_k * shape.n_head_kv[i] * 2 + v) * cells)
    state = sum(shape.recurrent_layers) * (shape.n_embd_r + shape.n_embd_s) * 4
    assert from_file.kv.bytes == sum(per_layer) + state


def test_calibration_reads_the_repacked_copy_and_the_recurrent_state() -> None:
    """`umemc calibrate` replaces the estimate with llama.cpp's report, so a CPU that repacks other types than
    the AVX2 set umemc assumes, or a hybrid's state, is measured. Lines in llama.cpp's formats
    (llama-model.cpp '%s: %12s model buffer size = %8.2f MiB', llama-memory-recurrent.cpp '%10s RS buffer size')."""
    from umemc.lockfile import totals
    from umemc.runtime.llamalog import parse_buffers

    log = (
        "load_tensors:   CPU_Mapped model buffer size = 11536.18 MiB\n"
        "load_tensors:   CPU_REPACK model buffer size =  9682.03 MiB\n"
        "llama_kv_cache:        CPU KV buffer size =   128.00 MiB\n"
        "llama_memory_recurrent:        CPU RS buffer size =   147.48 MiB\n"
        "llama_context:        CPU compute buffer size =   228.00 MiB\n"
        "llama_context:        CPU  output buffer size =     0.38 MiB\n"
    )
    mib = 2**20
    assert totals(parse_buffers(log)) == {
        "model": round(11536.18 * mib) + round(9682.03 * mib),
        "kv": round(128.00 * mib) + round(147.48 * mib),
        "compute": round(228.00 * mib),
        "output": round(0.38 * mib),
    }


def test_encoder_compute_and_its_embedding_output(write_stack) -> None:
    # bge-m3 (24 layers, 1024 wide, FFN 4096, vocabulary 250002) under llama-cpp-python's embedding mode,
    # ubatch 512, flash attention: the batch attends to itself (pad256(512) cells), the ungated FFN is the
    # widest step; output_reserve keeps logits and embeddings for min(n_batch 512, 256) sequences
    mask = 512 * 512 * 2
    ffn = (4096 + 3 * 1024) * 512 * 4
    output = (250002 + 1024) * 256 * 4
    e = estimate(write_stack, 'arch = "bge-m3"', runtime="llama-cpp-python", context=512)
    assert e.compute.bytes == mask + ffn + output == 272_254_976
    # llama.cpp on the full-size sparse file: compute 14.51 MiB, output 245.14 MiB
    assert abs(e.compute.bytes - (14.51 + 245.14) * 2**20) < 0.02 * 2**20


def test_deepseek_repacks_its_q4_k_experts(write_stack) -> None:
    # DeepSeek-V2-Lite Q4_K_M on a CPU with mmap: the repacked copy is the Q4_K expert stacks and matrices
    # (rows a multiple of 8), measured 15429.04 MiB held in all (bench/RESULTS.md)
    e = estimate(write_stack, 'arch = "deepseek-v2-lite"', runtime="llama-cpp-python", mmap=True)
    assert round(e.weights.bytes / 2**20, 2) == 15429.04
