"""llama.cpp memory: weights, KV cache, compute and output buffers (docs/ESTIMATES.md, "KV cache" and
"Compute buffers"). The compute model is calibrated against llama.cpp's own buffer report by
bench/accuracy.py; the constants below say which graph node each term stands for."""

from __future__ import annotations

from functools import cache

from ..catalog.archs import LlmPreset, LlmShape, VisionShape
from ..catalog.llama_archs import facts
from ..catalog.quant import KV_TYPES, loaded, preset_mix, quantized_kv, row_bytes, tensor_bytes
from . import graphs
from .figures import Figure

CTX_PAD = 256  # llama.cpp pads n_ctx (KV cells) to a multiple of 256
KQ_MASK_PAD = 64  # GGML_KQ_MASK_PAD: the mask's token dimension is padded to 64
F32 = 4
# The logits (the largest tensor, allocated last) land above what ggml-alloc still holds: the final norm's
# activations, 2 blocks of n_embd x n_ubatch x 4, and one more where the graph has one more tensor of
# that width alive late (a quantized KV cache; a full-size sliding-window cache): measured across llama,
# qwen2 and gemma3 shapes (bench/accuracy.py, docs/ESTIMATES.md). Which freed blocks lie below them is
# ggml-alloc's best-fit history, so this is a calibration, not a derivation.
LOGITS_BELOW = 2
# Mixture-of-experts graphs leave more behind at the end (the routed and shared experts' outputs of the last
# layer, in whatever blocks the allocator kept): measured at full size, ubatch 512, with f16 and q8_0 caches
# (bench/RESULTS.md), per architecture in its record (catalog.llama_archs: logits_below); qwen3moe and
# llama-style MoE (Mixtral) keep the dense rule.


def pad(n: int, to: int) -> int:
    return -(-n // to) * to


@cache
def weights_from_preset(preset: LlmPreset, ftype: str) -> Figure:
    """Cached: a stack of many models of one preset computes the figure once (frozen inputs)."""
    main = preset.shape.n_layer_main
    mix = [(name, shape, t) for name, shape, t in preset_mix(preset, ftype) if loaded(name, main)]
    total = sum(tensor_bytes(t, shape) for _, shape, t in mix)
    counts: dict[str, int] = {}
    for _, _, t in mix:
        counts[t] = counts.get(t, 0) + 1
    inputs: dict[str, object] = {
        "preset": preset.name,
        "file type": ftype,
        "tensors": len(mix),
        "tensor types": ", ".join(f"{k}:{v}" for k, v in sorted(counts.items())),
    }
    if preset.shape.n_layer_nextn:
        inputs["next-token-prediction layers"] = (
            f"{preset.shape.n_layer_nextn} in the file, not loaded (llama.cpp skips them unless it drafts with them)"
        )
    return Figure(
        "weights",
        total,
        "sum over tensors of row_bytes(type, ne0) x rows, types from llama.cpp's "
        f"{ftype} mix (llama-quant.cpp) incl. block-size fallbacks",
        inputs,
    )


def projector_from_preset(vision: VisionShape, arch: str) -> Figure:
    tensors = vision.tensors()
    total = sum(tensor_bytes("F32" if len(s) < 2 else "F16", s) for _, s in tensors)
    return Figure(
        "projector",
        total,
        "mmproj tensors, F16 weights and F32 biases/norms (published mmproj-f16)",
        {"preset": arch, "tensors": len(tensors), "vit layers": vision.n_layer, "vit width": vision.n_embd},
    )


def cells(context: int, parallel: int) -> int:
    """KV cells for `parallel` sequences of `context` tokens. llama.cpp keeps one stream per sequence unless
    the KV cache is unified (llama-server -np N without --kv-unified): each of n_ctx / n_seq cells, padded to
    256 (llama-context.cpp, n_ctx_seq)."""
    return parallel * pad(context, CTX_PAD)


def swa_cells(shape: LlmShape, context: int, parallel: int, ubatch: int, *, swa_full: bool) -> int:
    """Cells of a sliding-window layer's cache: per stream the window plus one ubatch, padded to 256
    (llama-kv-cache-iswa.cpp), unless the runtime keeps full-size caches (swa_full) or the model has no window."""
    n_cells = cells(context, parallel)
    if not shape.sliding_window or swa_full:
        return n_cells
    return parallel * pad(min(pad(context, CTX_PAD), shape.sliding_window + ubatch), CTX_PAD)


def kv_by_layer(
    shape: LlmShape, context: int, parallel: int, ubatch: int, kv_type: str, *, swa_full: bool, flash_attn: bool
) -> list[int]:
    """Each layer's KV cache in bytes (0 for a layer that keeps none): llama.cpp allocates it on the layer's
    device (llama-kv-cache.cpp), so a model split by layers holds each layer's beside its weights."""
    out = [0] * shape.n_layer
    if not shape.causal:
        return out
    n_cells = cells(context, parallel)
    gtype = KV_TYPES[kv_type]
    n_swa_cells = swa_cells(shape, context, parallel, ubatch, swa_full=swa_full)
    v_max = max(shape.n_head_kv) * shape.head_dim_v
    for layer in range(shape.n_layer):
        if not shape.has_kv(layer):
            continue
        n_kv = shape.n_head_kv[layer]
        c = n_swa_cells if shape.swa_layers and shape.swa_layers[layer] else n_cells
        v = 0 if shape.mla else row_bytes(gtype, shape.head_dim_v * n_kv if flash_attn else v_max)
        out[layer] = (row_bytes(gtype, shape.head_dim_k * n_kv) + v) * c
    return out


def kv_figure(
    shape: LlmShape,
    context: int,
    parallel: int,
    ubatch: int,
    kv_type: str,
    *,
    swa_full: bool = False,
    flash_attn: bool = True,
) -> Figure:
    """The KV cache (llama-kv-cache.cpp) plus, for hybrid models, the recurrent state (llama-memory-recurrent.cpp):
    both are what llama.cpp allocates for the context at load. Without flash attention V is stored transposed,
    every layer's V as wide as the widest layer's (llama_kv_cache: n_embd_v_gqa_max, [TAG_V_CACHE_VARIABLE])."""
    if not shape.causal:
        return Figure("kv", 0, "encoder model: llama.cpp keeps no KV cache", {"arch": shape.arch})
    n_cells = cells(context, parallel)
    n_swa_cells = swa_cells(shape, context, parallel, ubatch, swa_full=swa_full)
    layers = [i for i in range(shape.n_layer) if shape.has_kv(i)]
    v_max = max(shape.n_head_kv) * shape.head_dim_v
    total = sum(kv_by_layer(shape, context, parallel, ubatch, kv_type, swa_full=swa_full, flash_attn=flash_attn))
    inputs: dict[str, object] = {
        "layers": f"{len(layers)} of {shape.n_layer}" if len(layers) != shape.n_layer else shape.n_layer,
        "kv heads": _heads(tuple(shape.n_head_kv[i] for i in layers) or (0,)),
        "head dim k/v": f"{shape.head_dim_k}/{0 if shape.mla else shape.head_dim_v}",
        "cells": f"parallel {parallel} x pad256(context {context}) = {n_cells}",
        "type": kv_type,
    }
    formula = "sum over layers of (row_bytes(type, hd_k x kv_heads) + row_bytes(type, hd_v x kv_heads)) x cells"
    if shape.mla:
        formula = "sum over layers of row_bytes(type, kv_lora_rank + rope dims) x cells"
        inputs["latent attention (MLA)"] = "one K row per token (the latent and the rope part); V is read from it"
    if shape.n_layer_nextn:
        inputs["next-token-prediction layers"] = f"{shape.n_layer_nextn}: no cache (not run)"
    if shape.kv_layers and shape.recurrent_layers and all(shape.recurrent_layers[i] for i in layers):
        inputs["hybrid"] = "every layer keeps a KV cache and a recurrent state (its mixers run side by side)"
    elif shape.kv_layers and not shape.recurrent_layers:
        n_reuse = sum(1 for i in range(shape.n_layer) if not shape.kv_layers[i])
        inputs["shared KV"] = f"{n_reuse} later layers read an earlier layer's cache: no cache of their own"
    if not flash_attn and len(set(shape.n_head_kv[i] for i in layers)) > 1:
        inputs["V without flash attention"] = f"every layer's V as wide as the widest ({v_max})"
    if shape.sliding_window:
        n_swa = sum(shape.swa_layers[i] for i in layers) if shape.swa_layers else 0
        inputs["sliding-window layers"] = (
            f"{n_swa} of {len(layers)} hold all {n_cells} cells (the runtime keeps full-size caches: swa_full)"
            if swa_full
            else f"{n_swa} of {len(layers)} hold parallel x pad256(min(context, window "
            f"{shape.sliding_window} + ubatch)) = {n_swa_cells} cells"
        )
    kv = Figure("kv cache", total, formula, inputs)
    state = recurrent_figure(shape, parallel)
    if state is None:
        return Figure("kv", kv.bytes, kv.formula, kv.inputs)
    return Figure.total("kv", [kv, state])


# What each recurrent mixer keeps per layer and sequence, as llama_hparams::n_embd_r and n_embd_s compute it.
_STATE = {
    "mamba": "conv (d_conv - 1) x (d_inner + 2 n_group d_state) + scan d_state x d_inner",
    "deltanet": "conv (d_conv - 1) x (2 x key heads x key dim + value dim) + delta state key dim x value dim",
    "rwkv": "token shift token_shift_count x n_embd + wkv n_embd x head size",
    "shortconv": "short convolution n_embd x (l_cache - 1)",
    "kda": "conv 3 x (d_conv - 1) x heads x head dim + state head dim² x heads",
    "lightning": "state head dim² x heads",
}


def recurrent_figure(shape: LlmShape, parallel: int) -> Figure | None:
    """Recurrent layers keep a convolution (or token-shift) state and a scan state per sequence, in f32,
    whatever the context: llama.cpp sizes it for max(1, n_seq) (llama-memory-recurrent.cpp)."""
    n = sum(shape.recurrent_layers)
    if not n:
        return None
    rows = max(1, parallel)
    return Figure(
        "recurrent state",
        n * (shape.n_embd_r + shape.n_embd_s) * F32 * rows,
        "recurrent layers x (n_embd_r + n_embd_s) x 4 bytes x sequences",
        {
            "recurrent layers": n,
            "mixer": f"{shape.recurrent_kind}: {_STATE.get(shape.recurrent_kind, '?')}",
            "n_embd_r": shape.n_embd_r,
            "n_embd_s": shape.n_embd_s,
            "sequences": rows,
        },
    )


def _heads(heads: tuple[int, ...]) -> str:
    return str(heads[0]) if len(set(heads)) == 1 else f"per layer {min(heads)}-{max(heads)}"


def compute_figure(
    shape: LlmShape,
    context: int,
    parallel: int,
    ubatch: int,
    *,
    flash_attn: bool,
    swa_full: bool = False,
    kv_type: str = "f16",
    embed_seqs: int = 0,
    outputs: int | None = None,
) -> Figure:
    """llama.cpp's compute buffer for its worst-case graph (a full ubatch against a full cache),
    plus the output buffer. ggml-alloc frees a tensor after its last use, so the buffer is the
    largest set of tensors alive at once: inside a layer (the attention masks are graph inputs and
    stay allocated) or at the end (the logits of the reserve batch's outputs). `outputs`: the rows of
    logits the runtime reserves (llama_context_params.n_outputs_max; llama-server sets one per sequence,
    tools/server/server-context.cpp server_output_limits); None: every token of the ubatch (the library's
    default, n_batch)."""
    n_ub = min(ubatch, context * parallel) if shape.causal else ubatch
    n_out = n_ub if outputs is None else max(1, min(n_ub, outputs))
    # one KV stream per sequence: each of the reserve batch's sequences attends to its own stream's cells
    streams = parallel if shape.causal else 1
    n_kv = cells(context, 1) if shape.causal else pad(n_ub, CTX_PAD)  # an encoder attends to its batch
    e = shape.n_embd
    mask_row = streams * pad(-(-n_ub // streams), KQ_MASK_PAD) * (2 if flash_attn else F32)
    masks: dict[str, object] = {"n_kv": n_kv} if streams == 1 else {"n_kv per stream": n_kv, "streams": streams}
    mask_bytes, n_swa = n_kv * mask_row, 0
    if shape.causal and shape.sliding_window and any(shape.swa_layers):
        n_swa = swa_cells(shape, context, 1, ubatch, swa_full=swa_full)  # the sliding-window layers' own mask
        masks["n_kv (sliding window)"] = n_swa
        mask_bytes += n_swa * mask_row
    elif shape.sliding_window and any(shape.swa_layers):  # an encoder's window: a second mask over the batch
        masks["n_kv (sliding window)"] = n_kv
        mask_bytes += n_kv * mask_row
    mask = Figure(
        "kq_mask",
        mask_bytes,
        "n_kv x pad64(n_ubatch) x (2 bytes with flash attention, else 4), per mask",
        masks,
    )
    quantized = quantized_kv(kv_type)
    if graphs.supported(shape):
        replayed = graphs.reserve_buffer(
            shape,
            n_kv,
            n_ub,
            n_out,
            mask_row,
            flash_attn=flash_attn,
            rotated=quantized,
            n_kv_swa=n_swa,
            n_seqs=streams,
            kv_bytes=4 if kv_type == "f32" else 2,
        )
        graph = Figure(
            "compute buffer",
            replayed,
            f"ggml-alloc's placement replayed on llama.cpp's reserve graph ({shape.arch}"
            f"{'' if shape.arch in graphs.RECIPES else ', the common decoder as its file describes it'}: n_ubatch "
            "tokens against the whole cache, the output rows' logits)",
            {"n_ubatch": n_ub, "flash_attn": flash_attn, "outputs": n_out},
            parts=(mask,),
        )
        return Figure.total("compute", [graph, _output_figure(shape, parallel, embed_seqs)])
    attn = attention_figure(shape, n_kv, n_ub, flash_attn=flash_attn)
    ffn = ffn_figure(shape, n_ub)
    width = shape.n_vocab if shape.causal else 0
    by_arch = facts(shape.arch).logits_below
    measured = by_arch != (0, 0)
    if measured:
        below = by_arch[quantized]
    else:
        below = LOGITS_BELOW + (quantized or (swa_full and any(shape.swa_layers)))
    end = Figure(
        "logits",
        (width + below * e) * n_out * F32,
        f"(n_vocab + {below} x n_embd) x outputs x 4: the reserve graph's output rows; the logits land "
        "above the final activations"
        + (
            f" ({shape.arch}: measured)"
            if measured
            else " (one more with a quantized or full-size sliding-window cache)"
            if below > 2
            else ""
        ),
        {"n_vocab": shape.n_vocab, "outputs": n_out if outputs is not None else f"{n_out} (every token of the ubatch)"},
    )
    layer = max(attn, ffn, key=lambda f: f.bytes)
    mamba = mixer_figure(shape, n_ub, parallel)
    resident = _resident(shape, n_ub)
    alive = mask.bytes + (resident.bytes if resident else 0)
    with_resident = " + resident streams" if resident else ""
    candidates = [(alive + layer.bytes, f"kq_mask{with_resident} + {layer.name}"), (end.bytes, "logits")]
    if mamba is not None:  # the masks are graph inputs: alive in a recurrent layer too, where there are any
        masked = mask.bytes if any(shape.has_kv(i) for i in range(shape.n_layer)) else 0
        candidates.append((masked + mamba.bytes, f"kq_mask + {mamba.name}" if masked else mamba.name))
    graph_bytes, peak = max(candidates)
    graph = Figure(
        "compute buffer",
        graph_bytes,
        f"max(kq_mask{with_resident} + max(attention, ffn), {'kq_mask + recurrent mixer, ' if mamba else ''}"
        f"logits) [= {peak}]",
        {"n_ubatch": n_ub, "flash_attn": flash_attn},
        parts=(mask, *([resident] if resident else []), attn, ffn, *([mamba] if mamba else []), end),
    )
    return Figure.total("compute", [graph, _output_figure(shape, parallel, embed_seqs)])


def _output_figure(shape: LlmShape, parallel: int, embed_seqs: int) -> Figure:
    if shape.causal:
        return Figure(
            "output buffer", shape.n_vocab * parallel * F32, "n_vocab x n_seq x 4 (llama.cpp output_reserve)",
            {"n_seq": parallel},
        )  # fmt: skip
    # embedding mode: logits and embeddings are both reserved, for every sequence the context can hold
    seqs = embed_seqs or parallel
    return Figure(
        "output buffer",
        (shape.n_vocab + shape.n_embd) * seqs * F32,
        "(n_vocab + n_embd) x n_seq_max x 4 (llama.cpp output_reserve keeps logits beside the embeddings)",
        {"n_seq_max": seqs},
    )


def attention_figure(shape: LlmShape, n_kv: int, n_ub: int, *, flash_attn: bool) -> Figure:
    """One layer's attention step. Latent attention (deepseek2) works in the latent space: the query absorbed
    into kv_lora_rank per head and concatenated with its rope part, and (with flash attention) the output in the
    latent space before V's up-projection (src/models/deepseek2.cpp, MLA branch); calibrated at full size."""
    e, e_kv = shape.n_embd, max(shape.n_head_kv) * shape.head_dim_k
    scores = n_kv * shape.n_head  # KQ, softmax in place (without flash attention)
    if not shape.causal:  # bert: q, k, v and the output with their biases over the batch, no cache
        width = (11 * e // 2) if flash_attn else scores + 6 * e
        formula = "5.5 x n_embd" if flash_attn else "KQ scores n_kv x heads + 6 x n_embd"
        return Figure("attention", width * n_ub * F32, f"({formula}) x n_ubatch x 4 (encoder)", {"heads": shape.n_head})
    if shape.mla:
        rank, rope = shape.head_dim_v, shape.head_dim_k - shape.head_dim_v
        inputs: dict[str, object] = {"heads": shape.n_head, "kv_lora_rank": rank, "rope dims": rope}
        if flash_attn:
            width = shape.n_head * (3 * rank + rope + shape.head_dim_v_mla)
            inputs["v head"] = shape.head_dim_v_mla
            formula = "heads x (3 x kv_lora_rank + rope dims + v head): absorbed query, its rope concat, latent output"
        else:
            width = scores + shape.n_head * (2 * rank + rope) + 5 * e + 2 * e_kv
            formula = "KQ scores n_kv x heads + heads x (2 x kv_lora_rank + rope dims) + 5 x n_embd + 2 x n_embd_kv"
        return Figure("attention", width * n_ub * F32, f"({formula}) x n_ubatch x 4", inputs)
    if flash_attn:
        return Figure(
            "attention",
            (6 * e + 2 * e_kv) * n_ub * F32,
            "(5 x n_embd + 2 x n_embd_kv + n_embd flash-attention output) x n_ubatch x 4",
            {"n_embd_kv": e_kv},
        )
    if facts(shape.arch).gated_query:
        q = shape.n_head * shape.head_dim_k
        return Figure(
            "attention",
            (scores + e + 6 * q + 2 * e_kv) * n_ub * F32,
            "KQ scores n_kv x n_ubatch x heads x 4 (softmax in place) + (n_embd + 6 x query width + 2 x n_embd_kv) "
            "x n_ubatch x 4: the joint query-gate projection (2 x query width) is held for its gate through the "
            "attention",
            {"heads": shape.n_head, "query width": q, "n_embd_kv": e_kv},
        )
    return Figure(
        "attention",
        (scores + 5 * e + 2 * e_kv) * n_ub * F32,
        "KQ scores n_kv x n_ubatch x heads x 4 (softmax in place) + (5 x n_embd + 2 x n_embd_kv) x n_ubatch x 4",
        {"heads": shape.n_head, "n_embd_kv": e_kv},
    )


def ffn_figure(shape: LlmShape, n_ub: int) -> Figure:
    """The widest feed-forward step of any layer: a dense FFN (gate, up, their product), the routed experts
    (the same three for each of the n_expert_used experts a token goes to: llama.cpp's build_moe_ffn runs
    MUL_MAT_ID into [n_ff_exp, n_expert_used, n_ubatch] tensors), the shared experts beside the routed output,
    or a Mamba-2 mixer. Calibrated per term against llama.cpp's compute buffer (bench/accuracy.py)."""
    e = shape.n_embd
    shexp_gates = 3 if shape.shexp_gated else 1  # the shared expert's FFN-wide tensors: gate, up, product; or up
    if not shape.causal:  # bert: up, GELU in place, down; a gated encoder (EmbeddingGemma): gate, up, product
        gates = 1 if not shape.ffn_gated else 3
        return Figure(
            "ffn", (gates * shape.n_ff + 3 * e) * n_ub * F32,
            f"({gates} x n_ff + 3 x n_embd) x n_ubatch x 4 (encoder, {'un' if gates == 1 else ''}gated)",
            {"n_ff": shape.n_ff},
        )  # fmt: skip
    terms: dict[str, int] = {}
    dense = shape.n_expert == 0 or shape.n_layer_dense_lead > 0
    if dense and not shape.ffn_gated:  # up, its activation in place, down (StarCoder2: measured 3-4 x n_embd)
        terms["ungated ffn"] = shape.n_ff + 4 * e
    elif dense:
        terms["dense ffn"] = 3 * shape.n_ff + 4 * e
    inputs: dict[str, object] = {"n_ff": shape.n_ff} if dense else {}
    if shape.n_expert:
        routed_e = 3 if shape.arch == "gpt-oss" else 4  # gpt-oss adds each expert's bias in place of one copy
        k = shape.n_expert_used
        if shape.experts_gated:
            terms["routed experts"] = 3 * shape.n_ff_exp * k + routed_e * e
            # then the down projections of the k experts ([n_embd, k, n_ubatch]) and their weighted copy, beside
            # the swiglu product they were made from: wider than the above when the experts are narrow (qwen3moe)
            terms["expert outputs"] = shape.n_ff_exp * k + 2 * e * k + (3 + facts(shape.arch).moe_extra) * e
        else:
            # up, its activation in place, the down projections beside it: measured on Nemotron 3's shape over
            # expert widths 928-3712, 3-12 experts a token and n_embd 2688-5376 (llama.cpp's dry run): k x (n_ff_exp
            # + n_embd) + 4.5 x n_embd
            terms["ungated expert outputs"] = k * (shape.n_ff_exp + e) + 9 * e // 2
            inputs["expert gate"] = "none (no ffn_gate_exps)"
        inputs.update(experts=f"{k} of {shape.n_expert} x n_ff_exp {shape.n_ff_exp}")
        if shape.n_ff_shexp:
            # the routed output stays alive while the shared experts run; llama4 also keeps its pre-weighted input
            terms["shared experts"] = shexp_gates * shape.n_ff_shexp + (6 if shape.arch == "llama4" else 5) * e
            inputs["shared experts width"] = shape.n_ff_shexp
    name, width = max(terms.items(), key=lambda kv: kv[1])
    formulas = {
        "expert outputs": "(n_ff_exp x n_expert_used: the swiglu product + 2 x n_embd x n_expert_used: the experts' "
        "down projections and their weighted copy + 3 x n_embd)",
        "dense ffn": "(3 x n_ff: gate, up and their product + 4 x n_embd)",
        "ungated ffn": "(n_ff: up, its activation in place + 4 x n_embd)",
        "routed experts": "(3 x n_ff_exp x n_expert_used + 4 x n_embd)",
        "ungated expert outputs": "(n_expert_used x (n_ff_exp: the up projection + n_embd: the down) + 4.5 x n_embd)",
        "shared experts": f"({shexp_gates} x shared width + 5 x n_embd: the routed output waits)",
    }
    inputs["widest"] = name
    return Figure("ffn", width * n_ub * F32, f"{formulas[name]} x n_ubatch x 4", inputs)


# The per-architecture constants these formulas use are in each architecture's record (catalog.llama_archs):
# moe_extra, the n_embd-wide activations an MoE layer keeps beyond its experts' outputs, measured where the cause
# is not known (llama.cpp's dry run under llama-server, bench/accuracy.py): gpt-oss (biases and clamped swiglu),
# deepseek2 (latent attention's output beside the experts); gated_query, an attention that projects the query
# and an output gate in one tensor (Qwen3-Next, Qwen3.5: build_qkv with 2 x head width, the gate a view of it,
# applied after the attention): the projection, twice the query width, stays alive through the scores. Without
# flash attention the layer's peak was measured with llama.cpp's dry run of qwen3next over query widths 2048-8192
# and n_embd 1024-4096 (bench/accuracy.py --sweep): n_embd + 6 query widths + 2 n_embd_kv beside the scores, to
# 2 MiB; the live set alone is n_embd + 3 query widths (the projection, the normed query, the scores' product),
# the rest is where ggml-alloc places them.
DELTA_CHUNK = 64  # build_delta_net_chunking: tokens per chunk (16 for Kimi's KDA)
# mixer_extra (the record's): n_embd-wide activations a mixer layer keeps beside its own tensors, measured where
# the graph keeps more than the mixer (granite's residual and embedding multipliers scale copies of the stream):
# llama.cpp's dry run of granite-4.0-h-small at 8K and 32K (bench/accuracy.py); other mixers keep none
# (nemotron_h, qwen3next, falcon-h1)


def mixer_figure(shape: LlmShape, n_ub: int, parallel: int = 1) -> Figure | None:
    """A recurrent mixer's step with the ssm keys (llama.cpp build_mamba2_layer; Qwen3-Next's Gated DeltaNet,
    src/models/delta-net-base.cpp): the in-projection (z, xBC, dt), the conv input and output, the scan, and the
    scan's state of every sequence it reads and writes (n_seq x n_embd_s); a chunked delta rule also holds two
    chunk x chunk matrices per chunk and value head (the chunk's attention and its decay mask). Checked against
    llama.cpp's dry run (bench/accuracy.py): granitehybrid, nemotron_h, falcon-h1, qwen3next."""
    if not any(shape.recurrent_layers) or not shape.ssm_dims or shape.recurrent_kind not in ("mamba", "deltanet"):
        return None
    _, d_inner, d_state, n_group, n_head = shape.ssm_dims
    d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_head
    xbc = d_inner + 2 * n_group * d_state
    extra = facts(shape.arch).mixer_extra
    width = (2 * d_in_proj + xbc + (4 + extra) * shape.n_embd) * n_ub
    state = max(1, parallel) * shape.n_embd_s
    formula = (
        "(2 x in-projection (2 d_inner + 2 n_group d_state + n_head) + conv width (d_inner + 2 n_group d_state) "
        "+ 4 x n_embd) x n_ubatch x 4 + n_seq x n_embd_s x 4"
    )
    inputs: dict[str, object] = {"d_inner": d_inner, "d_state": d_state, "n_group": n_group, "heads": n_head}
    if extra:
        inputs[f"{shape.arch}: measured"] = f"{extra} more n_embd-wide activations alive"
    chunks = 0
    if shape.recurrent_kind == "deltanet":
        chunks = 2 * DELTA_CHUNK * DELTA_CHUNK * -(-n_ub // DELTA_CHUNK) * n_head
        formula += " + 2 x chunk² x chunks x value heads x 4"
        inputs["chunk"] = DELTA_CHUNK
    return Figure(f"{shape.recurrent_kind} mixer", (width + state + chunks) * F32, formula, inputs)


def _resident(shape: LlmShape, n_ub: int) -> Figure | None:
    """Activations an architecture keeps alive across all its layers beside the residual (shape.resident_width
    floats per token: Gemma 3n's altup predictions and per-layer embeddings)."""
    if shape.n_deepstack:  # the wider embeddings input and the token embeddings padded to it
        width = 2 * shape.n_deepstack * shape.n_embd
        return Figure(
            "deepstack inputs",
            width * n_ub * F32,
            "2 x n_deepstack x n_embd x n_ubatch x 4 (the embeddings input and its padded copy, wider than n_embd)",
            {"deepstack layers": shape.n_deepstack},
        )
    if not shape.resident_width:
        return None
    return Figure(
        "resident streams",
        shape.resident_width * n_ub * F32,
        "resident width x n_ubatch x 4 (kept through every layer)",
        {"width": shape.resident_width},
    )


def vision_compute_figure(vision: VisionShape, image_size: int, *, flash_attn: bool) -> Figure:
    """The multimodal encoder's graph for one image of image_size² (approximate: clip graph)."""
    side = pad(image_size, vision.patch * vision.merge) // vision.patch
    n_patches = side * side
    act = n_patches * vision.n_embd * F32
    if flash_attn:
        attn = vision.n_embd * n_patches * F32
        formula = "patches x width x 4 (flash attention output) + 6 activations of patches x width x 4"
    else:
        attn = n_patches * n_patches * vision.n_head * F32
        formula = "patches² x heads x 4 (full-attention scores) + 6 activations of patches x width x 4"
    return Figure(
        "projector compute",
        attn + 6 * act + n_patches * vision.n_ff * F32 * 2,
        formula + " + ffn",
        {"image": f"{image_size}x{image_size}", "patches": n_patches, "heads": vision.n_head},
    )
