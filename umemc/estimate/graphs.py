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

Sliding-window layers (Llama 4, gpt-oss) attend to a cache of their own (its own indices and mask). LFM2's
short-convolution layers (_ShortConvGraph) differ in what they hold and in the order llama.cpp's explicit
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
    # the router: "softmax" (probabilities), "sigmoid" (with a selection bias), "softmax_weight" (the top k taken
    # on the logits, a soft-max over the chosen ones' weights), "header" (expert_gating_func; a selection bias
    # where the file has exp_probs_b tensors)
    gating: str = "softmax"
    residual_first: bool = False  # the residual add takes the layer's input first (written in place into it)
    qk_norm_optional: bool = False  # the Q/K norms are there only where the file has them (LlmShape.qk_norm)
    # the chosen experts' weights: "normalised" (divided by their sum), "header" (normalised and scaled as
    # expert_weights_norm / _scale say), "plain" (neither)
    expert_weights: str = "normalised"
    shared_expert: bool = False  # a shared expert (a dense FFN of n_ff_shexp) beside the routed ones, added
    windows: bool = False  # sliding-window layers attend to a cache of their own (llama-kv-cache-iswa.cpp)
    k_before_v: bool = False  # the graph reaches K before V (else V, then K)
    # every layer runs all the tokens; the output rows are taken after the last, whose whole output is kept as a
    # graph output (llm_graph_result t_h_nextn: never freed)
    rows_at_end: bool = False


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
    # Llama 4: chunked attention on three layers of four, the fourth without RoPE; routed and shared experts
    # (src/models/llama4.cpp; _Llama4Graph)
    "llama4": Recipe(shared_expert=True, windows=True),  # its own attention and experts: _Llama4Graph
    # GLM-4.5: dense lead layers, sigmoid routing with a selection bias, one shared expert; per-head Q/K norms in
    # the 355B model only (src/models/glm4-moe.cpp)
    "glm4moe": Recipe(
        qk_norm="heads", qk_norm_optional=True, gating="sigmoid", expert_weights="header", shared_expert=True
    ),
    # gpt-oss: a 128-token window on every other layer, attention sinks (an input of the attention, no op of
    # their own), biases everywhere (added in place), the top 4 of the router's logits soft-maxed
    # (src/models/openai-moe.cpp)
    "gpt-oss": Recipe(gating="softmax_weight", expert_weights="plain", windows=True, k_before_v=True, rows_at_end=True),
    # Granite 4.0 H: Mamba-2 layers between a few attention layers (without RoPE where the file says so), routed
    # experts and a shared one on every layer (src/models/granite-hybrid.cpp; _Mamba2Graph)
    "granitehybrid": Recipe(shared_expert=True),
    # DeepSeek V2 / V3 and their kin: multi-head latent attention (Q absorbed into the latent, one K row a token, V
    # read from K and projected after the attention), dense lead layers, the router and the weights as the header
    # says, shared experts (src/models/deepseek2.cpp; _Graph.attend_mla)
    "deepseek2": Recipe(gating="header", expert_weights="header", shared_expert=True),
    # Qwen3-Next: gated DeltaNet layers, every fourth layer gated attention (Q/K normed per head), routed experts
    # and a gated shared expert (src/models/qwen3next.cpp; _DeltaNetGraph)
    "qwen3next": Recipe(qk_norm="heads", shared_expert=True),
}
_GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}  # llama_expert_gating_func_type


def _gating(shape: LlmShape) -> str:
    """The router's gating: the recipe's, else the header's (deepseek2: soft-max where the file says nothing, but
    for GLM 4.7 Lite's shape, sigmoid), "" where the graph does not know it."""
    recipe = RECIPES[shape.arch]
    if recipe.gating != "header":
        return recipe.gating
    code = shape.expert_gating or (2 if shape.n_layer_main in (47, 48) and shape.n_vocab == 154880 else 1)
    return _GATING.get(code, "")


def supported(shape: LlmShape) -> bool:
    """The shapes this graph describes: a plain causal decoder of a listed architecture."""
    recurrent = any(shape.recurrent_layers)
    llama4 = shape.arch == "llama4"  # its chunked attention and its shared expert are written out (_Llama4Graph)
    return (
        shape.arch in RECIPES
        and shape.causal
        and (not any(shape.swa_layers) or RECIPES[shape.arch].windows)
        and (not recurrent or _recurrent_replayed(shape))
        and shape.n_expert_used <= shape.n_expert <= MAX_EXPERTS  # what llama.cpp loads (a file may claim more)
        and (shape.n_expert_used > 0 or not llama4)
        and (not shape.mla or (shape.arch == "deepseek2" and len(shape.mla_dims) == 4 and min(shape.mla_dims[1:]) > 0))
        and (shape.mla or shape.arch != "deepseek2")  # a file from before MLA (attn_kv_b): not written out
        and (not shape.n_expert or bool(_gating(shape)))
        and shape.expert_groups <= 1  # DeepSeek V3's group selection: not written out
        and not shape.attn_temp_scale
        and not shape.experts_gate_up  # the experts' gate and up in one product: not written out
        and (not shape.n_ff_shexp or RECIPES[shape.arch].shared_expert)
        and (not shape.n_layer_dense_lead or shape.arch in ("glm4moe", "deepseek2"))
        and (shape.moe_every == 1 or llama4)
        and not shape.resident_width
        and all(shape.has_kv(i) or recurrent for i in range(shape.n_layer_main))
    )


def _recurrent_replayed(shape: LlmShape) -> bool:
    """The hybrids whose recurrent layers are written out: LFM2's short convolutions (dense FFN), Granite 4.0 H's
    Mamba-2 mixers."""
    if shape.arch == "lfm2":
        return shape.recurrent_kind == "shortconv" and not shape.n_expert
    if shape.arch == "qwen3next" and len(shape.ssm_dims) == 5:  # the converter's fused q/k/v and z projections
        d_conv, d_inner, d_state, n_k, n_v = shape.ssm_dims
        fused = len(shape.qkv_fused) >= shape.n_layer_main and all(
            shape.qkv_fused[i] for i in range(shape.n_layer_main) if shape.recurrent_layers[i]
        )
        return (
            fused and min(shape.ssm_dims) > 0 and n_v % n_k == 0 and d_inner % n_v == 0 and shape.n_expert > 0
            and bool(shape.n_ff_shexp) and shape.head_dim_k == shape.head_dim_v
        )  # fmt: skip
    if shape.arch == "granitehybrid" and len(shape.ssm_dims) == 5:
        d_conv, d_inner, d_state, n_group, n_head = shape.ssm_dims
        return min(shape.ssm_dims) > 0 and d_inner % n_head == 0 and d_inner % n_group == 0
    return False


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
    caches = _Caches(n_kv, n_kv_swa or n_kv, mask_row, max(1, min(n_seqs, n_ubatch)), kv_bytes)
    last = shape.n_layer_main
    lead = min(shape.n_layer_dense_lead, last) if shape.n_expert else 0  # the dense lead layers: all replayed
    tail, period = last - lead, 4 if shape.arch == "llama4" else 2  # the rest: alike, `period` by `period`
    if not whole_depth and tail > 3 * period - 1:
        tail = 2 * period + (tail - 2 * period) % period
    replayed = (*range(lead), *range(last - tail, last))
    if shape.recurrent_kind == "shortconv":  # layers of two kinds, in the model's own pattern: all of them
        graph: _Graph = _ShortConvGraph(shape, n_ubatch, flash_attn=flash_attn)
    elif shape.arch == "granitehybrid":
        graph = _Mamba2Graph(shape, n_ubatch, flash_attn=flash_attn)
    elif shape.arch == "qwen3next":
        graph = _DeltaNetGraph(shape, n_ubatch, flash_attn=flash_attn)
    elif shape.arch == "llama4":
        graph = _Llama4Graph(shape, n_ubatch, flash_attn=flash_attn, replayed=replayed)
    else:
        graph = _Graph(shape, n_ubatch, flash_attn=flash_attn, replayed=replayed)
    graph.build(caches, outputs, rotated=rotated)
    return buffer_size(graph.leaves, graph.nodes)


@dataclass(frozen=True)
class _Caches:
    """The cells a stream of each KV cache holds (a sliding-window layer's own, where there is one), the bytes a
    cell takes in an attention mask (the reserve batch's rows, f16 with flash attention, else f32), and the reserve
    batch's sequences."""

    n_kv: int
    n_kv_swa: int
    mask_row: int
    seqs: int = 1  # the reserve batch's sequences (llama.cpp: n_seq_max): one recurrent state each
    kv_bytes: int = 2  # an element of an unquantized cache (f16, bf16: 2; f32: 4)


def _rotation(head: int, *, widest: bool) -> int:
    """The Hadamard matrix's side: K's the largest power of two (from 128) dividing the head, V's 64."""
    side = 64
    while widest and head % (side * 2) == 0:
        side *= 2
    return side


@dataclass
class _Kv:
    """One KV cache's inputs: a quantized cache's Hadamard matrices for K and V, the K and V cells' indices, the
    attention mask; and the cells a stream holds."""

    turns: tuple[Tensor | None, Tensor | None]
    k_idxs: Tensor
    v_idxs: Tensor
    mask: Tensor
    n_kv: int

    def leaves(self) -> list[Tensor]:
        return [*(t for t in self.turns if t), self.k_idxs, self.v_idxs, self.mask]


@dataclass
class _Inputs:
    """The graph's inputs (llama.cpp's llm_graph_input_*), in the order the graph first reaches them."""

    tokens: Tensor
    embd: Tensor  # the embeddings input: allocated, unused when tokens are given
    pos: Tensor
    kv: _Kv
    out_ids: Tensor

    def attention(self) -> list[Tensor]:
        return [self.pos, *self.kv.leaves()]


class _Graph:
    """The reserve graph's inputs (`leaves`) and ops (`nodes`), in the order llama.cpp's graph holds them."""

    def __init__(self, shape: LlmShape, n_ubatch: int, *, flash_attn: bool, replayed: tuple[int, ...] = ()) -> None:
        self.shape, self.recipe, self.n_ub, self.flash_attn = shape, RECIPES[shape.arch], n_ubatch, flash_attn
        self.replayed = replayed or tuple(range(shape.n_layer_main))  # the layers replayed, by index
        self.extra_inputs: list[Tensor] = []  # inputs an architecture adds (Llama 4's attention scale)
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

    def kv(self, n_kv: int, mask_row: int, *, rotated: bool) -> _Kv:
        """A KV cache's inputs."""
        shape, n_ub = self.shape, self.n_ub
        turns = tuple(
            Tensor(_rotation(head, widest=widest) ** 2 * F32) if rotated and head % 64 == 0 else None
            for head, widest in ((shape.head_dim_k, True), (shape.head_dim_v, False))
        )
        v_rows = 1 if self.flash_attn else max(shape.n_head_kv) * shape.head_dim_v  # a transposed V: one per row
        return _Kv((turns[0], turns[1]), Tensor(n_ub * I64), Tensor(n_ub * v_rows * I64), Tensor(n_kv * mask_row), n_kv)

    def inputs(self, n_out: int, caches: _Caches, *, rotated: bool) -> _Inputs:
        shape, n_ub = self.shape, self.n_ub
        return _Inputs(
            Tensor(n_ub * I32), Tensor(shape.n_embd * n_ub * F32), Tensor(n_ub * I32),
            self.kv(caches.n_kv, caches.mask_row, rotated=rotated), Tensor(n_out * I32),
        )  # fmt: skip

    def build(self, caches: _Caches, n_out: int, *, rotated: bool) -> None:
        """The inputs (a sliding-window cache's own where layers slide), the layers; then the inputs in the order
        the graph first reaches them (the token ids and the embeddings input first)."""
        self.caches = caches
        inputs = self.inputs(n_out, caches, rotated=rotated)
        windowed = any(self.shape.swa_layers)
        self.window = self.kv(caches.n_kv_swa, caches.mask_row, rotated=rotated) if windowed else inputs.kv
        self.layers(inputs, n_out)
        known = {id(t) for t in (*inputs.attention(), *self.extra_inputs, *self.window.leaves(), inputs.out_ids)}
        reached: list[Tensor] = []
        for src in (src for node in self.nodes for src in node.sources):
            if id(src) in known and src not in reached:
                reached.append(src)
        self.leaves = [inputs.tokens, inputs.embd, *reached]

    def layers(self, inputs: _Inputs, n_out: int) -> None:
        """The token embeddings' rows, the replayed layers (each at its own index; the model's last among them),
        the logits."""
        shape, n_ub = self.shape, self.n_ub
        e, last, out_ids = shape.n_embd, shape.n_layer_main, inputs.out_ids
        x = self.op(e * n_ub * F32, self.weight, inputs.tokens)
        for layer in self.replayed:
            out = self.op(e * n_ub * F32, self.weight, self.attend_layer(layer, self.norm(x), inputs))
            residual, rows = x, n_ub
            if layer == last - 1 and not self.recipe.rows_at_end:  # only the output rows go on
                rows = n_out
                out, residual = self.op(e * rows * F32, out, out_ids), self.op(e * rows * F32, x, out_ids)
            ffn_in = self.op(e * rows * F32, out, residual, inplace=True)
            x = self.op(e * rows * F32, self.ffn(layer, self.norm(ffn_in), rows), ffn_in, inplace=True)
        if self.recipe.rows_at_end:  # the last layer's output for every token is a graph output (t_h_nextn)
            x.output = True
            x = self.op(e * n_out * F32, x, out_ids)
        logits = self.op(shape.n_vocab * n_out * F32, self.weight, self.norm(x))
        logits.output = True

    def attend_layer(self, layer: int, h: Tensor, inputs: _Inputs) -> Tensor:
        if self.shape.mla:
            return self.attend_mla(h, inputs.pos, inputs.kv)
        return self.attend(h, inputs.pos, self.cache_of(layer, inputs))

    def attend_mla(self, h: Tensor, pos: Tensor, kv: _Kv) -> Tensor:
        """Multi-head latent attention with the absorption (deepseek2.cpp, is_mla): Q (through its LoRA and norm
        where there is one), its no-RoPE part multiplied into the latent space, its RoPE part turned, the two
        joined; the compressed KV row, its latent part normed, its RoPE part turned, the two joined and written
        into the cache (K only: V is a view of it); the attention, whose output (latent wide) V's projection
        brings to the value heads, made contiguous for the output projection."""
        shape, n_ub = self.shape, self.n_ub
        q_lora, kv_lora, rope, k_mla = shape.mla_dims
        heads, v_mla = shape.n_head, shape.head_dim_v_mla
        if q_lora:
            q_a = self.op(q_lora * n_ub * F32, self.weight, h)
            h_q = self.op(q_a.size, self.op(q_a.size, q_a, inplace=True), self.weight, inplace=True)
        else:
            h_q = h
        q = self.view(self.op(heads * k_mla * n_ub * F32, self.weight, h_q))
        absorbed = self.op(kv_lora * heads * n_ub * F32, self.weight, self.view(q))
        q_pe = self.op(rope * heads * n_ub * F32, self.view(q), pos, inplace=True)  # of a view: a new tensor
        q_cat = self.op((kv_lora + rope) * heads * n_ub * F32, self.view(absorbed), q_pe)
        kv_pe = self.op((kv_lora + rope) * n_ub * F32, self.weight, h)
        kv_c = self.op(kv_lora * n_ub * F32, self.view(kv_pe), inplace=True)  # the norm, of a view
        kv_c = self.op(kv_c.size, kv_c, self.weight, inplace=True)
        k_pe = self.op(rope * n_ub * F32, self.view(kv_pe), pos, inplace=True)
        k_cat = self.op((kv_lora + rope) * n_ub * F32, self.view(kv_c), k_pe)
        self.cache_view(self.view(k_cat), kv.k_idxs)
        if self.flash_attn:  # V: the cache's latent part, read as a view of K
            k_all, v_all = self.cached(kv, kv_lora + rope), self.cached(kv, kv_lora)
            latent = self.op(kv_lora * heads * n_ub * F32, self.view(q_cat), k_all, v_all, kv.mask)
        else:
            v = self.op(kv_lora * kv.n_kv * self.caches.seqs * self.caches.kv_bytes, self.cache_view())  # cont
            scores = self.op(kv.n_kv * heads * n_ub * F32, self.cache_view(), self.view(q_cat))
            probs = self.op(scores.size, scores, kv.mask, inplace=True)
            latent = self.op(kv_lora * heads * n_ub * F32, v, probs)
        out = self.op(v_mla * heads * n_ub * F32, self.weight, self.view(latent))
        return self.view(self.op(out.size, self.view(out)))  # the permuted product made contiguous

    def cache_of(self, layer: int, inputs: _Inputs) -> _Kv:
        """The cache a layer attends to: the window's on a sliding-window layer, else the whole one."""
        return self.window if self.shape.swa_layers and self.shape.swa_layers[layer] else inputs.kv

    def ffn(self, layer: int, h: Tensor, rows: int) -> Tensor:
        """The layer's dense FFN, or its routed experts (reached first) and the shared expert beside them, added."""
        shape = self.shape
        if not shape.is_moe(layer):
            return self.dense(h, rows)
        routed = self.moe(h, rows)
        if not shape.n_ff_shexp:
            return routed
        return self.op(shape.n_embd * rows * F32, routed, self.dense(h, rows, shape.n_ff_shexp), inplace=True)

    def projection(self, h: Tensor, width: int, normed: bool) -> Tensor:
        """Q or K: the projection, its norm where the architecture has one, the reshape to heads."""
        x = self.op(width * self.n_ub * F32, self.weight, h)
        if normed and self.recipe.qk_norm == "flat":
            x = self.norm(x)
        x = self.view(x)
        if normed and self.recipe.qk_norm == "heads" and (self.shape.qk_norm or not self.recipe.qk_norm_optional):
            x = self.norm(x)
        return x

    def attend(self, h: Tensor, pos: Tensor, kv: _Kv) -> Tensor:
        """The attention of a normed input, up to its output projection: Q, V, K (or Q, K, V), the cache writes,
        attention."""
        shape, n_ub = self.shape, self.n_ub
        k_turn, v_turn = kv.turns
        kv_heads = max(shape.n_head_kv)
        q = self.projection(h, shape.n_head * shape.head_dim_k, normed=True)
        if not shape.no_rope:
            q = self.op(q.size, q, pos, inplace=True)  # RoPE: a new tensor when q is a view
        q = self.turn(q, k_turn)

        def make_k() -> Tensor:
            k = self.projection(h, kv_heads * shape.head_dim_k, normed=True)
            return self.turn(k if shape.no_rope else self.op(k.size, k, pos, inplace=True), k_turn)

        def make_v() -> Tensor:
            return self.turn(self.view(self.op(kv_heads * shape.head_dim_v * n_ub * F32, self.weight, h)), v_turn)

        if self.recipe.k_before_v:
            k = make_k()
            v = make_v()
        else:
            v = make_v()
            k = make_k()
        return self.stored_and_attended(q, k, v, kv)

    def stored_and_attended(self, q: Tensor, k: Tensor, v: Tensor, kv: _Kv) -> Tensor:
        """K and V written into the cache (set_rows: views of it), the attention of Q over the cache."""
        shape, n_ub = self.shape, self.n_ub
        self.cache_view(self.view(k), kv.k_idxs)
        self.cache_view(self.view(v), kv.v_idxs)
        width = shape.n_head * shape.head_dim_v
        if self.flash_attn:
            kv_heads = max(shape.n_head_kv)
            k_all, v_all = self.cached(kv, kv_heads * shape.head_dim_k), self.cached(kv, kv_heads * shape.head_dim_v)
            fa = self.op(width * n_ub * F32, self.view(q), k_all, v_all, kv.mask)
            return self.turn(self.view(fa), kv.turns[1])
        scores = self.op(kv.n_kv * shape.n_head * n_ub * F32, self.cache_view(), self.view(q))
        probs = self.op(scores.size, scores, kv.mask, inplace=True)  # soft-max with the mask, in place
        kqv = self.op(width * n_ub * F32, self.cache_view(), probs)
        return self.op(kqv.size, self.view(kqv))  # the permuted product made contiguous

    def cached(self, kv: _Kv, row: int) -> Tensor:
        """K or V as flash attention reads it: a view of the cache, cast to f16 from an f32 cache (build_attn_mha)
        -- every stream's cells, `row` floats a cell."""
        if self.caches.kv_bytes != 4:
            return self.cache_view()
        return self.op(row * kv.n_kv * self.caches.seqs * 2, self.cache_view())

    def dense(self, h: Tensor, rows: int, width: int = 0) -> Tensor:
        """build_ffn: gate, up, SwiGLU, down (`width`: the FFN's, else the model's n_ff)."""
        n_ff = width or self.shape.n_ff
        gate, up = self.op(n_ff * rows * F32, self.weight, h), self.op(n_ff * rows * F32, self.weight, h)
        return self.op(self.shape.n_embd * rows * F32, self.weight, self.op(n_ff * rows * F32, gate, up))

    def moe(self, h: Tensor, rows: int) -> Tensor:
        """llama-graph.cpp build_moe_ffn for a SwiGLU expert FFN with separate gate and up projections."""
        shape, recipe = self.shape, self.recipe
        k, n_exp, e, f = shape.n_expert_used, shape.n_expert, shape.n_embd, shape.n_ff_exp
        gating = _gating(shape)
        probs = self.op(n_exp * rows * F32, self.op(n_exp * rows * F32, self.weight, h), inplace=True)
        chosen = probs
        # the selection bias, added beside the probabilities: sigmoid routers' (or the file's, by the header)
        if shape.expert_bias if recipe.gating == "header" else gating == "sigmoid":
            chosen = self.op(n_exp * rows * F32, probs, self.weight, inplace=True)
        top_k = self.view(self.op(n_exp * rows * I32, chosen))  # argsort, its first k
        weights = self.op(k * rows * F32, self.view(probs), top_k)
        if gating == "softmax_weight":  # a soft-max over the chosen ones (of a view: a new tensor)
            weights = self.view(self.op(k * rows * F32, self.view(weights)))
        by_header = recipe.expert_weights == "header"
        if (by_header and shape.expert_weights_norm) or recipe.expert_weights == "normalised":
            by_row = self.view(weights)  # the chosen experts' weights divided by their sum (clamped in place)
            total = self.op(rows * F32, self.op(rows * F32, by_row), inplace=True)
            weights = self.view(self.op(k * rows * F32, by_row, total, inplace=True))
        if by_header and shape.expert_weights_scale not in (0.0, 1.0):
            weights = self.op(k * rows * F32, weights, inplace=True)
        hv = self.view(h)
        gate = self.op(f * k * rows * F32, self.weight, hv, top_k)
        up = self.op(f * k * rows * F32, self.weight, hv, top_k)
        down = self.op(e * k * rows * F32, self.weight, self.op(f * k * rows * F32, gate, up), top_k)
        return self.summed(self.op(down.size, down, weights, inplace=True), rows)

    def summed(self, experts: Tensor, rows: int) -> Tensor:
        """The chosen experts' outputs (views of one tensor) added up; one expert's: a contiguous copy."""
        e = self.shape.n_embd
        parts = [self.view(experts) for _ in range(self.shape.n_expert_used)]
        total = self.op(e * rows * F32, *parts[:2], inplace=True)
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

    def build(self, caches: _Caches, n_out: int, *, rotated: bool) -> None:
        shape, n_ub = self.shape, self.n_ub
        e = shape.n_embd
        seqs, self.caches = caches.seqs, caches
        inputs = self.inputs(n_out, caches, rotated=rotated)
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
                attn = self.attend(h, inputs.pos, inputs.kv)
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


class _Llama4Graph(_Graph):
    """Llama 4's graph (src/models/llama4.cpp). Three layers of four attend in chunks (8192 tokens) to their own,
    smaller cache (llama-kv-cache-iswa.cpp: its own cell indices and mask); the fourth attends to the whole cache
    without RoPE, its queries scaled by a per-token input instead (temperature tuning). Q, K and V are made in
    that order, each RoPE'd layer's Q and K normed without a weight (not for the 128-expert model); a quantized
    cache turns them after all three. Experts: the router's logits, their sigmoid, the top k chosen on the
    logits, the chosen weights applied to the input before the experts (weight_before_ffn), and a shared expert as
    wide as a routed one beside them, the two added. Without a window (a file's sliding_window = 0) one cache,
    and only the last layer goes without RoPE."""

    def build(self, caches: _Caches, n_out: int, *, rotated: bool) -> None:
        self.no_rope_every = 4 if any(self.shape.swa_layers) else self.shape.n_layer  # n_no_rope_layer_step
        self.scale = Tensor(self.n_ub * F32)
        self.extra_inputs.append(self.scale)
        super().build(caches, n_out, rotated=rotated)

    def attend_layer(self, layer: int, h: Tensor, inputs: _Inputs) -> Tensor:
        kv = self.cache_of(layer, inputs)
        roped = (layer + 1) % self.no_rope_every != 0
        return self.attend4(h, kv, inputs.pos if roped else self.scale, roped=roped)

    def attend4(self, h: Tensor, kv: _Kv, by: Tensor, *, roped: bool) -> Tensor:
        """Q, K, V; RoPE'd (`by`: the positions), else Q scaled (`by`: the scale input); the norms, the turns, the
        cache writes, the attention."""
        shape, n_ub = self.shape, self.n_ub
        kv_heads = max(shape.n_head_kv)
        normed = roped and shape.n_expert != 128  # llama_hparams use_kq_norm: not for the 128-expert model
        k_turn, v_turn = kv.turns
        # each is made whole, its turn included, before the next: the graph reaches them one by one (build_attn)
        q = self.view(self.op(shape.n_head * shape.head_dim_k * n_ub * F32, self.weight, h))
        q = self.op(q.size, q, by, inplace=True)  # RoPE, or the scale's MUL: a new tensor (q is a view)
        if normed:
            q = self.op(q.size, q, inplace=True)
        q = self.turn(q, k_turn)
        k = self.view(self.op(kv_heads * shape.head_dim_k * n_ub * F32, self.weight, h))
        if roped:
            k = self.op(k.size, k, by, inplace=True)
            if normed:
                k = self.op(k.size, k, inplace=True)
        k = self.turn(k, k_turn)
        v = self.turn(self.view(self.op(kv_heads * shape.head_dim_v * n_ub * F32, self.weight, h)), v_turn)
        return self.stored_and_attended(q, k, v, kv)

    def moe(self, h: Tensor, rows: int) -> Tensor:
        """build_moe_ffn for Llama 4: sigmoid gating, the top k of the logits, the weights before the experts."""
        shape = self.shape
        k, n_exp, e, f = shape.n_expert_used, shape.n_expert, shape.n_embd, shape.n_ff_exp
        logits = self.op(n_exp * rows * F32, self.weight, h)
        probs = self.op(n_exp * rows * F32, logits, inplace=True)  # the sigmoid: a new tensor (logits has 2 users)
        top_k = self.view(self.op(n_exp * rows * I32, logits))  # argsort, its first k
        weights = self.op(k * rows * F32, self.view(probs), top_k)
        repeated = self.op(e * k * rows * F32, self.view(h))  # the input once per chosen expert
        weighted = self.op(repeated.size, repeated, weights, inplace=True)
        gate = self.op(f * k * rows * F32, self.weight, weighted, top_k)
        up = self.op(f * k * rows * F32, self.weight, weighted, top_k)
        down = self.op(e * k * rows * F32, self.weight, self.op(f * k * rows * F32, gate, up), top_k)
        return self.summed(down, rows)


class _Mamba2Graph(_Graph):
    """Granite 4.0 H's graph (src/models/granite-hybrid.cpp, mamba-base.cpp build_mamba2_layer): Mamba-2 layers
    and attention layers, each followed by routed experts and a shared expert (or a dense FFN). The order is the
    one llama.cpp's explicit expansions give: a Mamba-2 layer first reads its convolution state (build_rs: the
    state's rows, the extra states' copy), which comes before the previous layer's shared expert and residual;
    its convolution state's write pulls in its norm and in-projection, its SSM state's write the convolution
    and the scan; the routed experts are expanded early (build_moe_ffn), the shared expert when the next layer
    asks for the layer's output."""

    def build(self, caches: _Caches, n_out: int, *, rotated: bool) -> None:
        self.seqs = caches.seqs
        self.s_copy = Tensor(self.seqs * I32)  # which recurrent state each sequence reads
        self.extra_inputs.append(self.s_copy)
        super().build(caches, n_out, rotated=rotated)

    def layers(self, inputs: _Inputs, n_out: int) -> None:
        shape, n_ub = self.shape, self.n_ub
        e, last, out_ids = shape.n_embd, shape.n_layer_main, inputs.out_ids
        x = self.op(e * n_ub * F32, self.weight, inputs.tokens)
        tail: Callable[[], Tensor] | None = None  # the previous layer's shared expert and residual
        for layer in range(last):
            state = self.conv_state() if shape.recurrent_layers[layer] else None
            x = tail() if tail else x
            h = self.norm(x)
            mixed = self.attend(h, inputs.pos, inputs.kv) if state is None else self.mamba2(h, state)
            out, residual, rows = self.op(e * n_ub * F32, self.weight, mixed), x, n_ub
            if layer == last - 1:  # only the output rows go on
                rows = n_out
                out, residual = self.op(e * rows * F32, out, out_ids), self.op(e * rows * F32, x, out_ids)
            ffn_in = self.op(e * rows * F32, out, residual, inplace=True)
            tail = self.ffn_tail(layer, ffn_in, rows)
        x = tail() if tail else x
        logits = self.op(shape.n_vocab * n_out * F32, self.weight, self.norm(x))
        logits.output = True

    def ffn_tail(self, layer: int, ffn_in: Tensor, rows: int) -> Callable[[], Tensor]:
        """The routed experts now (build_moe_ffn expands them); the shared expert (or the dense FFN) and the
        residual once the next layer asks for them."""
        shape, e = self.shape, self.shape.n_embd
        h = self.norm(ffn_in)
        routed = self.moe(h, rows) if shape.is_moe(layer) else None

        def finish() -> Tensor:
            if routed is None:
                out = self.dense(h, rows)
            elif shape.n_ff_shexp:
                out = self.op(e * rows * F32, routed, self.dense(h, rows, shape.n_ff_shexp), inplace=True)
            else:
                out = routed
            return self.op(e * rows * F32, out, ffn_in, inplace=True)

        return finish

    def conv_state(self) -> Tensor:
        """build_rs: the convolution state's rows for the ubatch's sequences (a view of the cache cleared in place
        first), the extra states' copy (none)."""
        state = self.op(self.shape.n_embd_r * self.seqs * F32, self.cache_view(), self.view(self.s_copy))
        self.cache_view(self.op(0, self.cache_view(), self.view(self.s_copy)))
        return state

    def mamba2(self, h: Tensor, state: Tensor) -> Tensor:
        """The in-projection (z, xBC, dt), the convolution over the state and xBC, its write into the cache, the
        scan (its output: y, then the new SSM state, written into the cache), y + x D gated by z, the grouped
        RMS norm: the out-projection's input."""
        d_conv, d_inner, d_state, n_group, n_head = self.shape.ssm_dims
        n_ub, seqs = self.n_ub, self.seqs
        channels = d_inner + 2 * n_group * d_state
        zxbcdt = self.op((2 * d_inner + 2 * n_group * d_state + n_head) * n_ub * F32, self.weight, h)
        conv_x = self.op((d_conv - 1 + n_ub // seqs) * channels * seqs * F32, self.view(state), self.view(zxbcdt))
        self.cache_view(self.view(conv_x))  # the last d_conv - 1 columns: the new convolution state
        xbc = self.op(channels * n_ub * F32, conv_x, self.weight)  # ssm_conv
        xbc = self.op(xbc.size, xbc, self.weight, inplace=True)  # + bias
        xbc = self.op(xbc.size, xbc, inplace=True)  # silu
        dt = self.op(n_head * n_ub * F32, self.view(zxbcdt))  # cont
        dt = self.op(dt.size, dt, self.weight, inplace=True)  # + bias
        scan = self.op(
            (d_inner * n_ub + d_state * d_inner * seqs) * F32,
            self.cache_view(), self.view(xbc), dt, self.weight, self.view(xbc), self.view(xbc), self.view(self.s_copy),
        )  # fmt: skip
        self.cache_view(self.op(0, self.cache_view(), self.view(self.s_copy)))  # the extra states' copy: none
        self.cache_view(self.view(scan))  # the new SSM state's write
        z = self.op(d_inner * n_ub * F32, self.view(zxbcdt))  # cont
        xd = self.op(d_inner * n_ub * F32, self.view(xbc), self.weight)
        y = self.op(xd.size, self.view(scan), xd, inplace=True)
        y = self.op(y.size, z, y)  # swiglu
        y = self.op(y.size, self.op(y.size, self.view(y)), self.weight, inplace=True)  # the grouped norm
        return self.view(y)


class _DeltaNetGraph(_Graph):
    """Qwen3-Next's graph (src/models/qwen3next.cpp, the gated delta net of delta-net-base.cpp): gated DeltaNet
    layers between gated attention layers, routed experts and a sigmoid-gated shared expert after each. Each
    layer's norm is expanded first; a DeltaNet layer then reads its convolution state, projects q, k, v in one
    product, joins it after the state (writing the new state), reads its SSM state, convolves, norms q and k (L2:
    an RMS norm and a scale) and repeats them to the value heads, computes the decay (softplus) and beta
    (sigmoid) from one small product, runs the delta rule (the output, then the new state, written into the
    cache), norms the output gated by silu(z), and projects it out. An attention layer's Q projection carries a
    gate, applied (sigmoid) to the attention's output. Every token goes through the last layer; the final norm's
    output is a graph output (t_h_nextn), its output rows the logits' input."""

    def build(self, caches: _Caches, n_out: int, *, rotated: bool) -> None:
        self.s_copy = Tensor(caches.seqs * I32)  # which recurrent state each sequence reads
        self.extra_inputs.append(self.s_copy)
        super().build(caches, n_out, rotated=rotated)

    def layers(self, inputs: _Inputs, n_out: int) -> None:
        shape, n_ub, e = self.shape, self.n_ub, self.shape.n_embd
        x = self.op(e * n_ub * F32, self.weight, inputs.tokens)
        for layer in range(shape.n_layer_main):
            h = self.norm(x)
            if shape.recurrent_layers[layer]:
                mixed = self.delta_net(h)
            else:
                mixed = self.gated_attention(h, inputs, fused=bool(shape.qkv_fused and shape.qkv_fused[layer]))
            ffn_in = self.op(e * n_ub * F32, mixed, x, inplace=True)  # into x where `mixed` is a view
            x = self.op(e * n_ub * F32, self.ffn(layer, self.norm(ffn_in), n_ub), ffn_in, inplace=True)
        hidden = self.norm(x)
        hidden.output = True
        logits = self.op(shape.n_vocab * n_out * F32, self.weight, self.op(e * n_out * F32, hidden, inputs.out_ids))
        logits.output = True

    def ffn(self, layer: int, h: Tensor, rows: int) -> Tensor:
        """The routed experts, then the shared expert scaled by sigmoid(its gate), the two added."""
        e = self.shape.n_embd
        routed = self.moe(h, rows)
        shared = self.dense(h, rows, self.shape.n_ff_shexp)
        gate = self.op(rows * F32, self.op(rows * F32, self.weight, h), inplace=True)
        return self.op(e * rows * F32, routed, self.op(shared.size, shared, gate, inplace=True), inplace=True)

    def state_rows(self, size: int) -> Tensor:
        """build_rs: a state's rows for the batch's sequences (the cache cleared in place first), the extra
        states' copy (none)."""
        rows = self.op(size * self.caches.seqs * F32, self.cache_view(), self.view(self.s_copy))
        self.cache_view(self.op(0, self.cache_view(), self.view(self.s_copy)))
        return rows

    def delta_net(self, h: Tensor) -> Tensor:
        shape, n_ub, seqs = self.shape, self.n_ub, self.caches.seqs
        d_conv, d_inner, d_state, n_k, n_v = shape.ssm_dims
        head_v, channels = d_inner // n_v, d_inner + 2 * n_k * d_state
        conv_state = self.state_rows(shape.n_embd_r)
        qkv = self.op(channels * n_ub * F32, self.weight, h)
        conv_in = self.op((d_conv - 1 + n_ub // seqs) * channels * seqs * F32, self.view(conv_state), self.view(qkv))
        self.cache_view(self.view(conv_in))  # the new convolution state
        state = self.state_rows(shape.n_embd_s)
        conv = self.op(channels * n_ub * F32, conv_in, self.weight)  # ssm_conv
        conv = self.op(conv.size, conv, inplace=True)  # silu
        q, k = (self.l2_normed(conv, d_state * n_k, d_state * n_v) for _ in range(2))
        ba = self.op(2 * n_v * n_ub * F32, self.weight, h)
        decay = self.op(n_v * n_ub * F32, self.view(ba))  # a: cont, + dt bias, softplus, x A: in place
        for _ in range(3):
            decay = self.op(decay.size, decay, self.weight, inplace=True)
        beta = self.op(n_v * n_ub * F32, self.view(ba))  # b: cont, sigmoid in place
        beta = self.op(beta.size, beta, inplace=True)
        out = self.op(
            (d_inner * n_ub + head_v * head_v * n_v * seqs) * F32,
            q, k, self.view(conv), self.view(decay), self.view(beta), self.view(state),
        )  # fmt: skip
        self.cache_view(self.view(out))  # the new SSM state
        normed = self.op(d_inner * n_ub * F32, self.view(out))  # rms norm of the output (a view)
        normed = self.op(normed.size, normed, self.weight, inplace=True)
        z = self.op(d_inner * n_ub * F32, self.weight, h)
        gated = self.op(normed.size, normed, self.op(z.size, self.view(z)), inplace=True)  # x silu(z)
        return self.view(self.op(shape.n_embd * n_ub * F32, self.weight, self.view(gated)))

    def l2_normed(self, conv: Tensor, width: int, repeated: int) -> Tensor:
        """q or k out of the convolution: an RMS norm (of a view: a new tensor) and a scale in place, repeated
        to the value heads where they are more (a view of it otherwise)."""
        x = self.op(width * self.n_ub * F32, self.view(conv))
        x = self.op(x.size, x, inplace=True)
        if repeated != width:
            return self.view(self.op(repeated * self.n_ub * F32, self.view(x)))
        return self.view(x)

    def gated_attention(self, h: Tensor, inputs: _Inputs, *, fused: bool) -> Tensor:
        """Q with its gate (one projection, or the Q part of attn_qkv made contiguous), Q normed per head and
        RoPE'd, V, K normed and RoPE'd (each turned under a quantized cache), the attention, the gate's sigmoid
        (a contiguous copy of its half of Q) applied, the output projection."""
        shape, n_ub, kv = self.shape, self.n_ub, inputs.kv
        k_turn, v_turn = kv.turns
        q_width, kv_width = shape.n_head * shape.head_dim_k, max(shape.n_head_kv) * shape.head_dim_k
        if fused:
            qkv = self.op((2 * q_width + 2 * kv_width) * n_ub * F32, self.weight, h)
            q_full = self.op(2 * q_width * n_ub * F32, self.view(qkv))

            def made(width: int) -> Tensor:
                return self.op(width * n_ub * F32, self.view(qkv))
        else:
            q_full = self.op(2 * q_width * n_ub * F32, self.weight, h)

            def made(width: int) -> Tensor:
                return self.op(width * n_ub * F32, self.weight, h)

        q = self.op(q_width * n_ub * F32, self.view(q_full), inplace=True)  # its Q half normed: a new tensor
        q = self.op(q.size, q, self.weight, inplace=True)
        q = self.turn(self.op(q.size, q, inputs.pos, inplace=True), k_turn)
        v = self.turn(self.view(made(kv_width)), v_turn)
        k = self.norm(self.view(made(kv_width)))
        k = self.turn(self.op(k.size, k, inputs.pos, inplace=True), k_turn)
        attn = self.stored_and_attended(q, k, v, kv)
        gate = self.op(q_width * n_ub * F32, self.view(q_full))  # cont
        gate = self.op(gate.size, gate, inplace=True)  # sigmoid
        return self.op(self.shape.n_embd * n_ub * F32, self.weight, self.op(gate.size, attn, gate, inplace=True))
