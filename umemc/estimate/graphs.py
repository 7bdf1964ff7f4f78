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
  experts (router logits, gating, top-k, the weights' normalisation, gate/up/SwiGLU/down of the chosen
  experts, their weighting in place, the sum of their outputs);
- the final norm and the logits (a graph output: never freed).

LFM2's short-convolution layers (_ShortConvGraph) differ in what they hold and in the order llama.cpp's explicit
expansions put their ops in.

A model whose layers are all alike is replayed over four or five of them (reserve_buffer says why); the
result is cached per shape and setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

from umemc.catalog.archs import LlmShape

from .allocator import Tensor, buffer_size

F32, I32, I64 = 4, 4, 8
MAX_EXPERTS = 1024  # llama.cpp's LLAMA_MAX_EXPERTS (src/llama-hparams.h)


@dataclass(frozen=True)
class Recipe:
    """What an architecture's graph does beyond the common decoder layer (src/models/<arch>.cpp)."""

    qk_norm: str = ""  # "": none; "flat": on the whole projection (in place); "heads": per head, on a view
    gating: str = "softmax"  # the router: "softmax" (probabilities) or "sigmoid" (with a selection bias)
    residual_first: bool = False  # the residual add takes the layer's input first (written in place into it)


# Architectures whose reserve graph is written out here, each checked against llama.cpp's dry run.
RECIPES: dict[str, Recipe] = {
    "llama": Recipe(),  # Llama, Mistral, Mixtral (its experts: soft-max, normalised weights)
    "qwen2": Recipe(),  # its q/k/v biases are added in place
    "qwen3": Recipe(qk_norm="heads"),
    "qwen3moe": Recipe(qk_norm="heads"),
    "seed_oss": Recipe(),
    "minimax-m2": Recipe(qk_norm="flat", gating="sigmoid"),
    # LFM2: short-convolution layers between attention layers (src/models/lfm2.cpp), dense FFN
    "lfm2": Recipe(qk_norm="heads", residual_first=True),
}


def supported(shape: LlmShape) -> bool:
    """The shapes this graph describes: a plain causal decoder of a listed architecture."""
    recurrent = any(shape.recurrent_layers)
    return (
        shape.arch in RECIPES
        and shape.causal
        and not any(shape.swa_layers)
        and (not recurrent or (shape.arch == "lfm2" and shape.recurrent_kind == "shortconv" and not shape.n_expert))
        and shape.n_expert_used <= shape.n_expert <= MAX_EXPERTS  # what llama.cpp loads (a file may claim more)
        and not shape.mla
        and not shape.n_ff_shexp
        and not shape.n_layer_dense_lead
        and not shape.resident_width
        and all(shape.has_kv(i) or recurrent for i in range(shape.n_layer_main))
    )


@lru_cache(maxsize=256)
def reserve_buffer(
    shape: LlmShape,
    n_kv: int,
    n_ubatch: int,
    outputs: int,
    mask_bytes: int,
    *,
    flash_attn: bool,
    rotated: bool,
    whole_depth: bool = False,
) -> int:
    """Bytes of llama.cpp's compute buffer (without the output buffer) for this shape's reserve graph. `rotated`:
    a quantized cache, into which llama.cpp writes K and V turned by a Hadamard matrix (llama-kv-cache.cpp
    attn_rot_k / attn_rot_v, where the head size is a multiple of 64). Where every layer is alike, the free blocks
    a layer leaves repeat every two layers after the first few, so four or five layers (as many as the model's
    depth is, modulo two; the last with the output rows) place every tensor as the whole depth does: checked
    against `whole_depth` on every preset and hundreds of random shapes (tests/estimate/test_allocator.py)."""
    if shape.recurrent_kind == "shortconv":  # layers of two kinds, in the model's own pattern: all of them
        graph: _Graph = _ShortConvGraph(shape, n_ubatch, flash_attn=flash_attn)
    else:
        depth = shape.n_layer_main
        if not whole_depth and depth > 5:
            depth = 4 + (depth - 4) % 2
        graph = _Graph(shape, n_ubatch, flash_attn=flash_attn, depth=depth)
    graph.build(n_kv, outputs, mask_bytes, rotated=rotated)
    return buffer_size(graph.leaves, graph.nodes)


def _rotation(head: int, *, widest: bool) -> int:
    """The Hadamard matrix's side: K's the largest power of two (from 128) dividing the head, V's 64."""
    side = 64
    while widest and head % (side * 2) == 0:
        side *= 2
    return side


@dataclass
class _Inputs:
    """The graph's inputs (llama.cpp's llm_graph_input_*), in the order the graph first reaches them."""

    tokens: Tensor
    embd: Tensor  # the embeddings input: allocated, unused when tokens are given
    pos: Tensor
    turns: tuple[Tensor | None, Tensor | None]  # a quantized cache's Hadamard matrices for K and V
    k_idxs: Tensor
    v_idxs: Tensor
    mask: Tensor
    out_ids: Tensor

    def attention(self) -> list[Tensor]:
        return [self.pos, *(t for t in self.turns if t), self.k_idxs, self.v_idxs, self.mask]


class _Graph:
    """The reserve graph's inputs (`leaves`) and ops (`nodes`), in the order llama.cpp's graph holds them."""

    def __init__(self, shape: LlmShape, n_ubatch: int, *, flash_attn: bool, depth: int = 0) -> None:
        self.shape, self.recipe, self.n_ub, self.flash_attn = shape, RECIPES[shape.arch], n_ubatch, flash_attn
        self.depth = depth or shape.n_layer_main  # the layers replayed
        self.leaves: list[Tensor] = []
        self.nodes: list[Tensor] = []
        self.weight = Tensor(0, external=True)  # every weight: in the model's buffer
        self.cache = Tensor(0, external=True)  # the KV cache: in its own buffer

    def op(self, size: int, *sources: Tensor, inplace: bool = False) -> Tensor:
        self.nodes.append(Tensor(size, sources, inplace=inplace))
        return self.nodes[-1]

    def view(self, of: Tensor) -> Tensor:
        """A reshape, permute or view: `of`'s memory under another shape (a view of a view views the first)."""
        self.nodes.append(Tensor(of.size, (of,), view_of=of.view_of or of))
        return self.nodes[-1]

    def cache_view(self, *sources: Tensor) -> Tensor:
        self.nodes.append(Tensor(0, (*sources, self.cache), view_of=self.cache))
        return self.nodes[-1]

    def norm(self, x: Tensor) -> Tensor:
        """build_norm: RMS_NORM (in place when x has no other user and is no view), then the weight's MUL."""
        return self.op(x.size, self.op(x.size, x, inplace=True), self.weight, inplace=True)

    def turn(self, x: Tensor, by: Tensor | None) -> Tensor:
        """llama_mul_mat_hadamard: x reshaped, multiplied by the rotation, reshaped back (nothing without one)."""
        return self.view(self.op(x.size, by, self.view(x))) if by is not None else x

    def inputs(self, n_out: int, mask_bytes: int, *, rotated: bool) -> _Inputs:
        shape, n_ub = self.shape, self.n_ub
        turns = tuple(
            Tensor(_rotation(head, widest=widest) ** 2 * F32) if rotated and head % 64 == 0 else None
            for head, widest in ((shape.head_dim_k, True), (shape.head_dim_v, False))
        )
        v_rows = 1 if self.flash_attn else max(shape.n_head_kv) * shape.head_dim_v  # a transposed V: one per row
        return _Inputs(
            Tensor(n_ub * I32), Tensor(shape.n_embd * n_ub * F32), Tensor(n_ub * I32), (turns[0], turns[1]),
            Tensor(n_ub * I64), Tensor(n_ub * v_rows * I64), Tensor(mask_bytes), Tensor(n_out * I32),
        )  # fmt: skip

    def build(self, n_kv: int, n_out: int, mask_bytes: int, *, rotated: bool) -> None:
        shape, n_ub = self.shape, self.n_ub
        e = shape.n_embd
        inputs = self.inputs(n_out, mask_bytes, rotated=rotated)
        self.leaves = [inputs.tokens, inputs.embd, *inputs.attention(), inputs.out_ids]
        tokens, out_ids = inputs.tokens, inputs.out_ids
        x = self.op(e * n_ub * F32, self.weight, tokens)  # the token embeddings' rows
        for layer in range(self.depth):
            out = self.op(e * n_ub * F32, self.weight, self.attend(self.norm(x), inputs, n_kv))
            residual, rows = x, n_ub
            if layer == self.depth - 1:  # only the output rows go on
                rows = n_out
                out, residual = self.op(e * rows * F32, out, out_ids), self.op(e * rows * F32, x, out_ids)
            ffn_in = self.op(e * rows * F32, out, residual, inplace=True)
            h = self.norm(ffn_in)
            ffn = self.moe(h, rows) if shape.n_expert else self.dense(h, rows)
            x = self.op(e * rows * F32, ffn, ffn_in, inplace=True)
        logits = self.op(shape.n_vocab * n_out * F32, self.weight, self.norm(x))
        logits.output = True

    def projection(self, h: Tensor, width: int, normed: bool) -> Tensor:
        """Q or K: the projection, its norm where the architecture has one, the reshape to heads."""
        x = self.op(width * self.n_ub * F32, self.weight, h)
        if normed and self.recipe.qk_norm == "flat":
            x = self.norm(x)
        x = self.view(x)
        if normed and self.recipe.qk_norm == "heads":
            x = self.norm(x)
        return x

    def attend(self, h: Tensor, inputs: _Inputs, n_kv: int) -> Tensor:
        """The attention of a normed input, up to its output projection: Q, V, K, the cache writes, attention."""
        shape, n_ub = self.shape, self.n_ub
        k_turn, v_turn = inputs.turns
        kv_heads = max(shape.n_head_kv)
        q = self.projection(h, shape.n_head * shape.head_dim_k, normed=True)
        q = self.turn(self.op(q.size, q, inputs.pos, inplace=True), k_turn)  # RoPE: a new tensor when q is a view
        v = self.turn(self.view(self.op(kv_heads * shape.head_dim_v * n_ub * F32, self.weight, h)), v_turn)
        k = self.projection(h, kv_heads * shape.head_dim_k, normed=True)
        k = self.turn(self.op(k.size, k, inputs.pos, inplace=True), k_turn)
        self.cache_view(self.view(k), inputs.k_idxs)  # the cache writes (set_rows: views of the cache)
        self.cache_view(self.view(v), inputs.v_idxs)
        width = shape.n_head * shape.head_dim_v
        if self.flash_attn:
            fa = self.op(width * n_ub * F32, self.view(q), self.cache_view(), self.cache_view(), inputs.mask)
            return self.turn(self.view(fa), v_turn)
        scores = self.op(n_kv * shape.n_head * n_ub * F32, self.cache_view(), self.view(q))
        probs = self.op(scores.size, scores, inputs.mask, inplace=True)  # soft-max with the mask, in place
        kqv = self.op(width * n_ub * F32, self.cache_view(), probs)
        return self.op(kqv.size, self.view(kqv))  # the permuted product made contiguous

    def dense(self, h: Tensor, rows: int) -> Tensor:
        n_ff = self.shape.n_ff
        gate, up = self.op(n_ff * rows * F32, self.weight, h), self.op(n_ff * rows * F32, self.weight, h)
        return self.op(self.shape.n_embd * rows * F32, self.weight, self.op(n_ff * rows * F32, gate, up))

    def moe(self, h: Tensor, rows: int) -> Tensor:
        """llama-graph.cpp build_moe_ffn for a SwiGLU expert FFN with separate gate and up projections."""
        shape, recipe = self.shape, self.recipe
        k, n_exp, e, f = shape.n_expert_used, shape.n_expert, shape.n_embd, shape.n_ff_exp
        probs = self.op(n_exp * rows * F32, self.op(n_exp * rows * F32, self.weight, h), inplace=True)
        chosen = probs
        if recipe.gating == "sigmoid":  # with the selection bias, added beside the probabilities
            chosen = self.op(n_exp * rows * F32, probs, self.weight, inplace=True)
        top_k = self.view(self.op(n_exp * rows * I32, chosen))  # argsort, its first k
        weights = self.op(k * rows * F32, self.view(probs), top_k)
        by_row = self.view(weights)  # the chosen experts' weights divided by their sum (clamped in place)
        total = self.op(rows * F32, self.op(rows * F32, by_row), inplace=True)
        weights = self.op(k * rows * F32, by_row, total, inplace=True)
        weights, hv = self.view(weights), self.view(h)
        gate = self.op(f * k * rows * F32, self.weight, hv, top_k)
        up = self.op(f * k * rows * F32, self.weight, hv, top_k)
        down = self.op(e * k * rows * F32, self.weight, self.op(f * k * rows * F32, gate, up), top_k)
        weighted = self.op(down.size, down, weights, inplace=True)
        parts = [self.view(weighted) for _ in range(k)]
        total = self.op(e * rows * F32, *parts[:2], inplace=True)  # one expert: a contiguous copy
        for part in parts[2:]:
            total = self.op(e * rows * F32, total, part, inplace=True)
        return total


class _ShortConvGraph(_Graph):
    """LFM2's graph (src/models/lfm2.cpp): attention layers and short-convolution layers, each followed by a dense
    FFN, the residual added into the layer's input. The order is the one llama.cpp's explicit expansions give:
    a convolution layer first reads its recurrent state (build_rs: the state's rows, a view of the cache cleared in
    place, the extra states' copy) and writes the new one from the concatenation of that state with the layer's
    gated input -- which pulls in everything before it, the previous layer's output projection and FFN included --
    while its own convolution, output projection and FFN wait for the next layer's first expansion; an attention
    layer's expansions end with the attention itself."""

    def build(self, n_kv: int, n_out: int, mask_bytes: int, *, rotated: bool) -> None:
        shape, n_ub = self.shape, self.n_ub
        e = shape.n_embd
        seqs = max(1, min(n_out, n_ub))  # the reserve ubatch's sequences: one output row each
        inputs = self.inputs(n_out, mask_bytes, rotated=rotated)
        s_copy = Tensor(seqs * I32)  # which recurrent state each sequence reads
        first_recurrent = shape.recurrent_layers.index(True)
        first_attention = next(i for i in range(shape.n_layer_main) if shape.has_kv(i))
        attention = inputs.attention()
        reached = [s_copy, *attention] if first_recurrent < first_attention else [*attention, s_copy]
        self.leaves = [inputs.tokens, inputs.embd, *reached, inputs.out_ids]
        tokens, out_ids = inputs.tokens, inputs.out_ids
        x = self.op(e * n_ub * F32, self.weight, tokens)
        pending: Callable[[], Tensor] | None = None  # the previous layer's rest, made at this layer's first expansion
        for layer in range(shape.n_layer_main):
            if shape.recurrent_layers[layer]:
                state = self.op(shape.n_embd_r * seqs * F32, self.cache_view(), self.view(s_copy))
                self.cache_view(self.op(0, self.cache_view(), self.view(s_copy)))  # the extra states: none
            x = pending() if pending else x
            h = self.norm(x)
            if shape.recurrent_layers[layer]:
                mixed = self.shortconv(h, state, seqs)
            else:
                attn = self.attend(h, inputs, n_kv)
                mixed = partial(self.op, e * n_ub * F32, self.weight, attn)  # its output projection, made later
            pending = self.rest(layer, x, mixed, out_ids, n_out)
        x = pending() if pending else x
        logits = self.op(shape.n_vocab * n_out * F32, self.weight, self.norm(x))
        logits.output = True

    def shortconv(self, h: Tensor, state: Tensor, seqs: int) -> Callable[[], Tensor]:
        """The in-projection (b, c, x), b x x, its concatenation after the state and the state's write; returns
        what the convolution does once the next layer asks for it."""
        shape, n_ub, e = self.shape, self.n_ub, self.shape.n_embd
        bcx = self.op(3 * e * n_ub * F32, self.weight, h)
        b, c, x = self.view(bcx), self.view(bcx), self.view(bcx)
        bx = self.view(self.op(e * n_ub * F32, b, x))  # transposed
        joined = self.op((shape.n_embd_r * seqs + e * n_ub) * F32, self.view(state), bx)
        self.cache_view(self.view(joined))  # the new state's write

        def convolve() -> Tensor:
            conv = self.op(e * n_ub * F32, joined, self.weight)
            return self.op(e * n_ub * F32, self.weight, self.op(e * n_ub * F32, c, conv, inplace=True))

        return convolve

    def rest(
        self, layer: int, x: Tensor, mixed: Callable[[], Tensor], out_ids: Tensor, n_out: int
    ) -> Callable[[], Tensor]:
        """The layer's output, its residual (into the layer's input), the FFN and its residual: the next layer's
        input."""
        e, n_ub = self.shape.n_embd, self.n_ub

        def finish() -> Tensor:
            out, residual, rows = mixed(), x, n_ub
            if layer == self.shape.n_layer_main - 1:
                rows = n_out
                out, residual = self.op(e * rows * F32, out, out_ids), self.op(e * rows * F32, x, out_ids)
            y = self.op(e * rows * F32, residual, out, inplace=True)
            return self.op(e * rows * F32, y, self.dense(self.norm(y), rows), inplace=True)

        return finish
