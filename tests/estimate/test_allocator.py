"""The compute buffer as ggml-alloc places it (umemc/estimate/allocator.py, graphs/).

The allocator's rules are checked on small graphs whose placement is worked out by hand below; the replay of
llama.cpp's reserve graph is checked against llama-server's own `CPU compute buffer size` for published shapes
(tests/recorded/reserve-buffers.json, recorded by `python bench/accuracy.py --record-graphs` from the llama.cpp
umemc builds: a sparse GGUF of three layers of each shape, its fit pass), which prints two decimals of MiB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from umemc.budget.plan import make_plan
from umemc.estimate.allocator import Tensor, buffer_size
from umemc.stack.resolve import load_stack
from umemc.testing.discover import ArchSpec, write_discovered

RECORDED = json.loads((Path(__file__).parents[1] / "recorded" / "reserve-buffers.json").read_text())
MiB = 1 << 20


def test_a_freed_block_is_reused_by_the_best_fit_not_the_first() -> None:
    # a (128) k1 (32) b (64) k2 (32) lie end to end at 0, 128, 160, 224; u (32, the last user of a and b) goes
    # to the end, 256, and frees a and b: holes of 128 at 0 and 64 at 160. x (64) takes the 64 hole (the best
    # fit, not the first); k1's freeing after x joins the 0 hole: 160 bytes at 0, where y (128) goes, leaving 32
    # at 128; k2's freeing after y leaves 32 at 224: z (32) fits both and takes the later one. The buffer never
    # grows past u's end: 288 bytes.
    a, k1, b, k2 = Tensor(128), Tensor(32), Tensor(64), Tensor(32)
    u = Tensor(32, (a, b))
    x = Tensor(64, (k1,))
    y = Tensor(128, (k2,))
    z = Tensor(32, (x, y, u))
    assert buffer_size([], [a, k1, b, k2, u, x, y, z]) == 288
    assert (u.offset, x.offset, y.offset, z.offset) == (256, 160, 0, 224)


def test_an_op_writes_in_place_into_its_last_users_memory() -> None:
    # x (1024) -> y = scale(x) in place -> z = mul(y, w) in place: one block of 1024, then the output beside it
    x = Tensor(1024)
    y = Tensor(1024, (x,), inplace=True)
    z = Tensor(1024, (y,), inplace=True)
    out = Tensor(256, (z,))
    assert buffer_size([], [x, y, z, out]) == 1024 + 256
    # the same graph where x has a second user: y cannot overwrite it
    x2 = Tensor(1024)
    y2 = Tensor(1024, (x2,), inplace=True)
    keep = Tensor(32, (x2, y2))
    assert buffer_size([], [x2, y2, keep]) == 1024 + 1024 + 32


def test_a_view_is_never_written_over_and_frees_what_it_views_at_its_last_use() -> None:
    # rope(reshape(q)) cannot be done in place (the view is not the allocator's own), so q and its rope are
    # both alive; after the rope, q is freed through its view, and the next 1024 takes q's place at 0
    q = Tensor(1024)
    r = Tensor(1024, (q,), view_of=q)
    rope = Tensor(1024, (r,), inplace=True)
    after = Tensor(1024, (rope,))
    assert buffer_size([], [q, r, rope, after]) == 2048
    assert (rope.offset, after.offset) == (1024, 0)


def test_inputs_are_placed_first_and_outputs_are_never_freed() -> None:
    leaf = Tensor(64)
    logits = Tensor(512, (leaf,))
    logits.output = True
    later = Tensor(512, (logits,))
    assert buffer_size([leaf], [logits, later]) == 64 + 512 + 512
    assert (leaf.offset, logits.offset, later.offset) == (0, 64, 576)


def _stack_flags(flags: list[str]) -> dict[str, Any]:
    given = dict(zip(flags[::2], flags[1::2], strict=True))
    return {
        "context": int(given["-c"]) // int(given["-np"]),
        "parallel": int(given["-np"]),
        "flash_attn": given["-fa"] == "on",
        "kv_cache": given.get("-ctk", "f16"),
    }


@pytest.mark.parametrize("row", RECORDED["rows"], ids=lambda r: f"{r['name']} {' '.join(r['flags'])}")
def test_the_replay_reserves_what_llama_server_reserves(row: dict[str, Any], tmp_path: Path) -> None:
    keys = row["keys"]
    spec = ArchSpec(row["name"], row["arch"], keys, row["n_vocab"], "a test")
    tensors = {name: tuple(ne) for name, ne in row.get("tensors", {}).items()}  # where the graph reads them
    write_discovered(
        tmp_path / "m.gguf", spec, {"token_embd.weight": (keys["embedding_length"], row["n_vocab"]), **tensors}, "F32"
    )
    flags = _stack_flags(row["flags"])
    (tmp_path / "stack.toml").write_text(
        'version = 1\nname = "t"\n[platform]\nkind = "cpu"\nmemory = "512GiB"\n[models.m]\n'
        f'runtime = "llama-server"\nmodel = "m.gguf"\ncontext = {flags["context"]}\nparallel = {flags["parallel"]}\n'
        f'flash_attn = {str(flags["flash_attn"]).lower()}\nkv_cache = "{flags["kv_cache"]}"\nmmap = false\n'
    )
    compute = make_plan(load_stack(tmp_path / "stack.toml")).models["m"].estimate.compute
    graph = compute.parts[0]
    assert graph.formula.startswith("ggml-alloc's placement replayed on llama.cpp's reserve graph")
    deepstack = int(keys.get("n_deepstack_layers", 0))
    if deepstack and not flags["flash_attn"]:
        # a known gap: without flash attention a deepstack model's scores land lower in llama.cpp's buffer than in
        # the replay (1176.01 MiB printed, 1206.01 replayed: 30 MiB, three blocks of n_embd x n_ubatch floats);
        # the replay is over, never under, by at most one such block a deepstack layer
        block = keys["embedding_length"] * 512 * 4 / MiB
        assert 0 <= graph.bytes / MiB - row["compute_mib"] <= deepstack * block + 0.005
        return
    gap = OVER_WHERE_THE_FILE_IS_SILENT.get((row["arch"], flags["flash_attn"], flags["kv_cache"]))
    if gap is not None:
        assert 0 <= graph.bytes / MiB - row["compute_mib"] <= gap, (graph.bytes / MiB, row["compute_mib"])
        return
    # llama-server prints MiB with two decimals
    assert abs(graph.bytes / MiB - row["compute_mib"]) <= 0.005, (graph.bytes / MiB, row["compute_mib"])


# Architectures without a recipe, replayed as their files describe them (graphs.recipes.inferred), where llama.cpp's
# builder does what no file says: the replay is over, never under, by at most this many MiB. Hunyuan-A13B's experts'
# weights are normalised (build_moe_ffn's norm_w, hard-coded true in src/models/hunyuan-moe.cpp; with it the replay
# is exact).
OVER_WHERE_THE_FILE_IS_SILENT = {
    ("hunyuan-moe", False, "f16"): 0.02,
    ("hunyuan-moe", True, "q8_0"): 0.02,
}


def test_a_few_layers_place_the_tensors_as_the_whole_depth_does() -> None:
    # the replay of four or five layers (the depth's parity) against the replay of every layer, the reference:
    # each preset the replay knows and random shapes, flash attention on and off, several sequences and ubatches
    import random

    from umemc.catalog.archs import LLM_PRESETS, LlmShape
    from umemc.estimate import graphs

    rng = random.Random(7)
    shapes = [p.shape for p in LLM_PRESETS.values() if graphs.supported(p.shape)]
    for _ in range(120):
        arch = rng.choice(["llama", "qwen3", "qwen3moe", "minimax-m2", "qwen2"])
        depth = rng.randint(6, 40)
        experts = {
            "n_expert": rng.choice([8, 128]),
            "n_expert_used": rng.choice([1, 2, 8]),
            "n_ff_exp": rng.choice([256, 1536]),
        }
        shapes.append(
            LlmShape(
                arch,
                depth,
                rng.choice([512, 2048, 3072, 5120]),
                rng.choice([1024, 14336]),
                rng.choice([8, 24, 48]),
                (rng.choice([1, 4, 8]),) * depth,
                rng.choice([64, 128]),
                128,
                rng.choice([1000, 151936]),
                8192,
                **(experts if arch in ("qwen3moe", "minimax-m2") else {}),
            )  # fmt: skip
        )
    for _ in range(40):  # Llama 4: chunked attention on three layers of four (or none), experts every layer or two
        depth, windowed = rng.randint(9, 48), rng.random() < 0.8
        shapes.append(
            LlmShape(
                "llama4",
                depth,
                rng.choice([1024, 5120]),
                rng.choice([3072, 16384]),
                rng.choice([16, 40]),
                (8,) * depth,
                128,
                128,
                202048,
                8192,
                sliding_window=8192 if windowed else 0,
                swa_layers=tuple(i % 4 < 3 for i in range(depth)) if windowed else (),
                n_expert=rng.choice([16, 128]),
                n_expert_used=rng.choice([1, 2]),
                n_ff_exp=8192,
                n_ff_shexp=8192,
                moe_every=rng.choice([1, 2]),
            )  # fmt: skip
        )
    for _ in range(40):  # GLM-4.5: dense lead layers, experts with a shared one, the weights' norm and scale
        depth = rng.randint(6, 48)
        shapes.append(
            LlmShape(
                "glm4moe",
                depth,
                rng.choice([1024, 4096, 5120]),
                rng.choice([3072, 10944]),
                rng.choice([16, 96]),
                (8,) * depth,
                128,
                128,
                151552,
                8192,
                n_expert=rng.choice([16, 128, 160]),
                n_expert_used=rng.choice([1, 4, 8]),
                n_ff_exp=rng.choice([256, 1408]),
                n_ff_shexp=rng.choice([0, 1408]),
                n_layer_dense_lead=rng.choice([0, 1, 3]),
                n_layer_nextn=rng.choice([0, 1]),
                qk_norm=rng.random() < 0.5,
                expert_weights_norm=rng.random() < 0.7,
                expert_weights_scale=rng.choice([0.0, 1.0, 2.5]),
            )  # fmt: skip
        )
    for _ in range(30):  # gpt-oss: a window on every other layer, the output rows taken after the last layer
        depth = rng.randint(6, 36)
        shapes.append(
            LlmShape(
                "gpt-oss",
                depth,
                rng.choice([512, 2880]),
                2880,
                rng.choice([8, 64]),
                (8,) * depth,
                64,
                64,
                201088,
                131072,
                sliding_window=128,
                swa_layers=tuple(i % 2 == 0 for i in range(depth)),
                n_expert=rng.choice([32, 128]),
                n_expert_used=rng.choice([2, 4]),
                n_ff_exp=rng.choice([512, 2880]),
            )  # fmt: skip
        )
    for _ in range(30):  # DeepSeek's latent attention: with and without a Q LoRA, dense lead layers, shared experts
        depth = rng.randint(6, 40)
        kv_lora, rope = rng.choice([256, 512]), 64
        shapes.append(
            LlmShape(
                "deepseek2",
                depth,
                rng.choice([2048, 7168]),
                rng.choice([10944, 18432]),
                rng.choice([16, 64]),
                (1,) * depth,
                kv_lora + rope,
                kv_lora,
                163840,
                131072,
                n_expert=rng.choice([64, 384]),
                n_expert_used=rng.choice([6, 8]),
                n_ff_exp=rng.choice([1408, 2048]),
                n_ff_shexp=rng.choice([1408, 2816]),
                n_layer_dense_lead=rng.choice([1, 3]),
                n_layer_nextn=rng.choice([0, 1]),
                mla=True,
                head_dim_v_mla=128,
                mla_dims=(rng.choice([0, 1536]), kv_lora, rope, 192),
                expert_gating=rng.choice([0, 1, 2]),
                expert_bias=rng.random() < 0.5,
                expert_weights_norm=rng.random() < 0.5,
                expert_weights_scale=rng.choice([0.0, 2.5]),
            )  # fmt: skip
        )
    assert len(shapes) > 260
    for shape in shapes:
        fa = rng.random() < 0.7
        ctx, ubatch, seqs = rng.choice([512, 8192]), rng.choice([256, 512]), rng.choice([1, 4])
        args = (shape, ctx, ubatch, seqs, ubatch * (2 if fa else 4))
        rotated = fa and rng.random() < 0.3
        window = {"n_kv_swa": rng.choice([ctx, 8704])} if shape.sliding_window else {}
        short = graphs.reserve_buffer(*args, flash_attn=fa, rotated=rotated, **window)
        assert short == graphs.reserve_buffer(*args, flash_attn=fa, rotated=rotated, whole_depth=True, **window), shape


def test_a_file_claiming_more_experts_than_llama_cpp_loads_is_not_replayed() -> None:
    # the replay holds one view per chosen expert: a header's claim of a billion (llama.cpp loads at most 1024,
    # LLAMA_MAX_EXPERTS) falls back to the formula, which does not count them one by one
    from umemc.catalog.archs import LlmShape
    from umemc.estimate import graphs

    plain = LlmShape(
        "qwen3moe", 4, 512, 1024, 8, (2,) * 4, 64, 64, 1000, 8192, n_expert=128, n_expert_used=8, n_ff_exp=64
    )
    assert graphs.supported(plain)
    assert not graphs.supported(plain._replace(n_expert=2_000_000_000, n_expert_used=1_000_000_000))
    assert not graphs.supported(plain._replace(n_expert_used=256))  # more chosen than there are


def test_what_the_deepseek_graph_does_not_write_out_is_not_replayed() -> None:
    # DeepSeek V3's expert groups, a query temperature input, a router llama.cpp names but the graph does not write
    # out, and a file from before latent attention: each falls back to the formula
    from umemc.catalog.archs import LLM_PRESETS
    from umemc.estimate import graphs

    lite = LLM_PRESETS["deepseek-v2-lite"].shape
    assert graphs.supported(lite)
    assert not graphs.supported(lite._replace(expert_groups=8))
    assert not graphs.supported(lite._replace(attn_temp_scale=True))
    assert not graphs.supported(lite._replace(expert_gating=4))  # sqrt(softplus)
    assert not graphs.supported(lite._replace(mla=False, mla_dims=()))


def test_the_header_says_how_deepseek_routes_and_projects(tmp_path: Path) -> None:
    # DeepSeek V3's header (its keys as the converter writes them): read, and the groups keep it off the replay
    from umemc.estimate import graphs
    from umemc.estimate.gguf_file import read as read_gguf

    keys = {"context_length": 163840, "block_count": 61, "embedding_length": 7168, "feed_forward_length": 18432,
            "attention.head_count": 128, "attention.head_count_kv": 1, "attention.key_length": 576,
            "attention.value_length": 512, "attention.key_length_mla": 192, "attention.value_length_mla": 128,
            "attention.kv_lora_rank": 512, "attention.q_lora_rank": 1536, "rope.dimension_count": 64,
            "expert_count": 256, "expert_used_count": 8, "expert_feed_forward_length": 2048,
            "expert_shared_count": 1, "leading_dense_block_count": 3, "expert_weights_norm": True,
            "expert_weights_scale": 2.5, "expert_gating_func": 2, "expert_group_count": 8,
            "expert_group_used_count": 4, "nextn_predict_layers": 1}  # fmt: skip
    spec = ArchSpec("deepseek-v3", "deepseek2", keys, 129280, "a test")
    bias = {f"blk.{i}.exp_probs_b.bias": (256,) for i in range(3, 61)}
    write_discovered(tmp_path / "m.gguf", spec, {"token_embd.weight": (7168, 129280), **bias}, "F32")
    shape = read_gguf(tmp_path / "m.gguf").shape
    assert shape is not None
    assert (shape.mla_dims, shape.expert_gating, shape.expert_groups, shape.expert_bias) == (
        (1536, 512, 64, 192),
        2,
        8,
        True,
    )
    assert (shape.expert_weights_norm, shape.expert_weights_scale, shape.head_dim_v_mla) == (True, 2.5, 128)
    assert not graphs.supported(shape)
    assert graphs.supported(shape._replace(expert_groups=1))  # Kimi K2's router: one group


def test_a_qwen3_next_file_laid_out_otherwise_is_not_replayed() -> None:
    # the DeltaNet graph is written for the converter's layout (q/k/v in one attn_qkv, z in attn_gate, on every
    # DeltaNet layer); an older file projecting all four in ssm_in, or experts whose gate and up are one tensor,
    # keep the formula
    from umemc.catalog.archs import LlmShape
    from umemc.estimate import graphs

    layers = 8
    recurrent = tuple(i % 4 != 3 for i in range(layers))
    shape = LlmShape(
        "qwen3next", layers, 2048, 5120, 16, tuple(0 if r else 2 for r in recurrent), 256, 256, 151936, 262144,
        n_expert=512, n_expert_used=10, n_ff_exp=512, n_ff_shexp=512, recurrent_layers=recurrent,
        kv_layers=tuple(not r for r in recurrent), n_embd_r=3 * 8192, n_embd_s=128 * 128 * 32,
        ssm_dims=(4, 4096, 128, 16, 32), recurrent_kind="deltanet", qkv_fused=recurrent,
    )  # fmt: skip
    assert graphs.supported(shape)
    assert not graphs.supported(shape._replace(qkv_fused=()))  # the legacy ssm_in projection
    assert not graphs.supported(shape._replace(experts_gate_up=True))
    assert not graphs.supported(shape._replace(n_ff_shexp=0))
