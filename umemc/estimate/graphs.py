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

Every layer is replayed: where the free blocks a layer leaves differ from the previous one's (they may
alternate), a shortened graph would place the logits elsewhere. A graph of a hundred layers is a few thousand
tensors; the result is cached per shape and setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from umemc.catalog.archs import LlmShape

from .allocator import Tensor, buffer_size

F32, I32, I64 = 4, 4, 8


@dataclass(frozen=True)
class Recipe:
    """What an architecture's graph does beyond the common decoder layer (src/models/<arch>.cpp)."""

    qk_norm: str = ""  # "": none; "flat": on the whole projection (in place); "heads": per head, on a view
    gating: str = "softmax"  # the router: "softmax" (probabilities) or "sigmoid" (with a selection bias)
    norm_weights: bool = True  # the chosen experts' weights are divided by their sum


# Architectures whose reserve graph is written out here, each checked against llama.cpp's dry run.
RECIPES: dict[str, Recipe] = {
    "llama": Recipe(),  # Llama, Mistral, Mixtral (its experts: soft-max, normalised weights)
    "qwen2": Recipe(),  # its q/k/v biases are added in place
    "qwen3": Recipe(qk_norm="heads"),
    "qwen3moe": Recipe(qk_norm="heads"),
    "seed_oss": Recipe(),
    "minimax-m2": Recipe(qk_norm="flat", gating="sigmoid"),
}


def supported(shape: LlmShape) -> bool:
    """The shapes this graph describes: a plain causal decoder of a listed architecture."""
    return (
        shape.arch in RECIPES
        and shape.causal
        and not any(shape.swa_layers)
        and not any(shape.recurrent_layers)
        and not shape.mla
        and not shape.n_ff_shexp
        and not shape.n_layer_dense_lead
        and not shape.resident_width
        and all(shape.has_kv(i) for i in range(shape.n_layer_main))
    )


@lru_cache(maxsize=256)
def reserve_buffer(
    shape: LlmShape, n_kv: int, n_ubatch: int, outputs: int, mask_bytes: int, *, flash_attn: bool, rotated: bool
) -> int:
    """Bytes of llama.cpp's compute buffer (without the output buffer) for this shape's reserve graph. `rotated`:
    a quantized cache, into which llama.cpp writes K and V turned by a Hadamard matrix (llama-kv-cache.cpp
    attn_rot_k / attn_rot_v, where the head size is a multiple of 64)."""
    graph = _Graph(shape, n_ubatch, flash_attn=flash_attn)
    graph.build(n_kv, outputs, mask_bytes, rotated=rotated)
    return buffer_size(graph.leaves, graph.nodes)


def _rotation(head: int, *, widest: bool) -> int:
    """The Hadamard matrix's side: K's the largest power of two (from 128) dividing the head, V's 64."""
    side = 64
    while widest and head % (side * 2) == 0:
        side *= 2
    return side


class _Graph:
    """The reserve graph's inputs (`leaves`) and ops (`nodes`), in the order llama.cpp's graph holds them."""

    def __init__(self, shape: LlmShape, n_ubatch: int, *, flash_attn: bool) -> None:
        self.shape, self.recipe, self.n_ub, self.flash_attn = shape, RECIPES[shape.arch], n_ubatch, flash_attn
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

    def build(self, n_kv: int, n_out: int, mask_bytes: int, *, rotated: bool) -> None:
        shape, n_ub = self.shape, self.n_ub
        e = shape.n_embd
        tokens, embd_in, pos = Tensor(n_ub * I32), Tensor(e * n_ub * F32), Tensor(n_ub * I32)
        heads = (shape.head_dim_k, shape.head_dim_v)
        turns = [
            Tensor(_rotation(head, widest=widest) ** 2 * F32) if rotated and head % 64 == 0 else None
            for head, widest in zip(heads, (True, False), strict=True)
        ]
        v_rows = 1 if self.flash_attn else max(shape.n_head_kv) * shape.head_dim_v  # a transposed V: one per row
        k_idxs, v_idxs = Tensor(n_ub * I64), Tensor(n_ub * v_rows * I64)
        mask, out_ids = Tensor(mask_bytes), Tensor(n_out * I32)
        self.leaves = [tokens, embd_in, pos, *(t for t in turns if t), k_idxs, v_idxs, mask, out_ids]
        x = self.op(e * n_ub * F32, self.weight, tokens)  # the token embeddings' rows
        for layer in range(shape.n_layer_main):
            out = self.attention(x, pos, turns, (k_idxs, v_idxs, mask), n_kv)
            residual, rows = x, n_ub
            if layer == shape.n_layer_main - 1:  # only the output rows go on
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

    def attention(
        self, x: Tensor, pos: Tensor, turns: list[Tensor | None], inputs: tuple[Tensor, Tensor, Tensor], n_kv: int
    ) -> Tensor:
        shape, n_ub = self.shape, self.n_ub
        (k_turn, v_turn), (k_idxs, v_idxs, mask) = turns, inputs
        kv_heads = max(shape.n_head_kv)
        h = self.norm(x)
        q = self.projection(h, shape.n_head * shape.head_dim_k, normed=True)
        q = self.turn(self.op(q.size, q, pos, inplace=True), k_turn)  # RoPE: a new tensor when q is a view
        v = self.turn(self.view(self.op(kv_heads * shape.head_dim_v * n_ub * F32, self.weight, h)), v_turn)
        k = self.projection(h, kv_heads * shape.head_dim_k, normed=True)
        k = self.turn(self.op(k.size, k, pos, inplace=True), k_turn)
        self.cache_view(self.view(k), k_idxs)  # the cache writes (set_rows: views of the cache)
        self.cache_view(self.view(v), v_idxs)
        width = shape.n_head * shape.head_dim_v
        if self.flash_attn:
            fa = self.op(width * n_ub * F32, self.view(q), self.cache_view(), self.cache_view(), mask)
            attn = self.turn(self.view(fa), v_turn)
        else:
            scores = self.op(n_kv * shape.n_head * n_ub * F32, self.cache_view(), self.view(q))
            probs = self.op(scores.size, scores, mask, inplace=True)  # soft-max with the mask, in place
            kqv = self.op(width * n_ub * F32, self.cache_view(), probs)
            attn = self.op(kqv.size, self.view(kqv))  # the permuted product made contiguous
        return self.op(shape.n_embd * n_ub * F32, self.weight, attn)

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
        if recipe.norm_weights:  # divided by their sum (clamped in place)
            by_row = self.view(weights)
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
