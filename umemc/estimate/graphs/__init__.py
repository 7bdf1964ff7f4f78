"""llama.cpp's reserve graph for the decoder architectures whose graph umemc writes out, for the allocator replay
(umemc.estimate.allocator): what decides the compute buffer without llama.cpp on the box.

The graph is the one llama-server reserves at load (`sched_reserve`: a full micro-batch of n_ubatch tokens
against the whole cache, one output row per sequence), op by op as `src/models/<arch>.cpp` and
`src/llama-graph.cpp` build it (checked against the node list llama.cpp prints with GGML_SCHED_DEBUG=2 and
against its `compute buffer size`, bench/accuracy.py --sweep):

- inputs, in the order the graph reaches them: token ids (i32), the embeddings input (n_embd floats a token,
  allocated though unused), positions (i32), the K and V cache indices (i64 a token; V's a token and row when
  V is stored transposed, without flash attention), the attention mask (f16 with flash attention, else f32),
  the output rows' ids (built even when every token is an output, llama-graph.cpp build_inp_out_ids);
- a layer: RMS norm, Q, V, K projections (a Q/K norm where the architecture has one: on the whole projection,
  or per head on its reshaped view, which cannot be done in place), RoPE, the cache writes, attention (flash:
  one op; else the KQ scores, their soft-max in place, KQV, its permuted copy), the output projection, the
  residual; on the last layer only the output rows go on; then the FFN: gate, up, SwiGLU, down; or the routed
  experts (router logits, gating, top-k, the weights' normalisation and scale, gate/up/SwiGLU/down of the
  chosen experts, their weighting in place, the sum of their outputs), then a shared expert's dense FFN where
  there is one, added; the first layers dense where the model leads with some (GLM-4.5);
- the final norm and the logits (a graph output: never freed).

Sliding-window layers (Llama 4, gpt-oss) attend to a cache of their own (its own indices and mask). The hybrids'
recurrent layers (LFM2's short convolutions, Granite 4.0 H's Mamba-2, Qwen3-Next's gated DeltaNet) differ in what
they hold and in the order llama.cpp's explicit expansions put their ops in.

The package: `recipes` (what each architecture adds to the common layer, its router), `decoder` (the common
graph and its inputs), `llama4`, `hybrids`; here, which shapes are written out and the replay itself.

A model whose layers are all alike is replayed over four or five of them (reserve_buffer says why); the
result is cached per shape and setting.
"""

from __future__ import annotations

from functools import lru_cache

from umemc.catalog.archs import LlmShape

from ..allocator import buffer_size
from .decoder import Caches, Graph
from .hybrids import DeltaNetGraph, Mamba2Graph, Qwen35Graph, ShortConvGraph
from .llama4 import Llama4Graph
from .recipes import RECIPES, Recipe, gating, recipe_of

__all__ = ["RECIPES", "MAX_EXPERTS", "Recipe", "reserve_buffer", "supported"]

MAX_EXPERTS = 1024  # llama.cpp's LLAMA_MAX_EXPERTS (src/llama-hparams.h)


# the graph each recipe names (Recipe.graph): the one that writes its architecture out and says which shapes
GRAPHS: dict[str, type[Graph]] = {
    "decoder": Graph,
    "llama4": Llama4Graph,
    "shortconv": ShortConvGraph,
    "mamba2": Mamba2Graph,
    "deltanet": DeltaNetGraph,
    "qwen35": Qwen35Graph,
}


def supported(shape: LlmShape) -> bool:
    """The shapes written out: a causal decoder of an architecture with a recipe, or of one without whose file lists
    its blocks' tensors (read as the common decoder: recipes.inferred), within what every recipe's graph needs
    (below) and what its own graph replays (`Graph.replays`: its recurrent layers, its experts' layout)."""
    recipe = recipe_of(shape)
    recurrent = any(shape.recurrent_layers)
    return (
        (shape.arch in RECIPES or bool(shape.block_norms))  # without a recipe, the file's tensors describe it
        and shape.causal
        and (not any(shape.swa_layers) or recipe.windows)
        and GRAPHS[recipe.graph].replays(shape)
        and shape.n_expert_used <= shape.n_expert <= MAX_EXPERTS  # what llama.cpp loads (a file may claim more)
        and shape.mla == recipe.mla  # deepseek2 from before latent attention (attn_kv_b): not written out
        and (not shape.mla or (len(shape.mla_dims) == 4 and min(shape.mla_dims[1:]) > 0))
        and (not shape.n_expert or bool(gating(shape)))
        and shape.expert_groups <= 1  # DeepSeek V3's group selection: not written out
        and (not shape.attn_temp_scale or recipe.temp_scale)
        and not shape.experts_gate_up  # the experts' gate and up in one product: not written out
        and shape.experts_gated  # experts and shared experts without a gate: not written out
        and shape.shexp_gated
        and (not shape.n_ff_shexp or recipe.shared_expert)
        and (not shape.n_layer_dense_lead or recipe.dense_lead)
        and not shape.resident_width
        and all(shape.has_kv(i) or recurrent for i in range(shape.n_layer_main))
    )


@lru_cache(maxsize=256)
def reserve_buffer(
    shape: LlmShape,
    n_kv: int,
    n_ubatch: int,
    outputs: int,
    mask_row: int,
    *,
    flash_attn: bool,
    rotated: bool,
    n_kv_swa: int = 0,
    n_seqs: int = 1,
    kv_bytes: int = 2,
    whole_depth: bool = False,
) -> int:
    """Bytes of llama.cpp's compute buffer (without the output buffer) for this shape's reserve graph: `n_kv` cells
    a stream (`n_kv_swa` in a sliding-window layer's cache), a mask of `mask_row` bytes a cell, `n_seqs` sequences in
    the reserve batch (a recurrent layer reads and writes a state for each), `kv_bytes` an element of an unquantized
    cache (MLA copies V out of it without flash attention). `rotated`: a
    quantized cache, into which llama.cpp writes K and V turned by a Hadamard matrix (llama-kv-cache.cpp
    attn_rot_k / attn_rot_v, where the head size is a multiple of 64). Where every layer is alike, the free blocks
    a layer leaves repeat every two layers after the first few, so four or five layers (as many as the model's
    depth is, modulo two; the last with the output rows) place every tensor as the whole depth does; Llama 4's
    layers repeat every four, so eight to eleven of its last layers are replayed. Dense lead layers (GLM-4.5) are
    all replayed before them. Checked against `whole_depth` on every preset and hundreds of random shapes
    (tests/estimate/test_allocator.py)."""
    caches = Caches(n_kv, n_kv_swa or n_kv, mask_row, max(1, min(n_seqs, n_ubatch)), kv_bytes)
    last = shape.n_layer_main
    # the dense lead layers and the deepstack layers (each adds its slice of the input): all replayed
    lead = max(min(shape.n_layer_dense_lead, last) if shape.n_expert else 0, min(shape.n_deepstack, last))
    recipe = recipe_of(shape)
    kind = GRAPHS[recipe.graph]
    tail, period = last - lead, recipe.period  # the rest: alike, `period` by `period`
    if not whole_depth and kind.alike_layers and tail > 3 * period - 1:
        tail = 2 * period + (tail - 2 * period) % period
    graph = kind(shape, n_ubatch, flash_attn=flash_attn, replayed=(*range(lead), *range(last - tail, last)))
    graph.build(caches, outputs, rotated=rotated)
    return buffer_size(graph.leaves, graph.nodes)
