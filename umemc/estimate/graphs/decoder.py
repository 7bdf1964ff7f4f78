"""The common decoder's reserve graph (Graph) and its inputs: what every architecture written out here shares."""

from __future__ import annotations

from dataclasses import dataclass

from umemc.catalog.archs import LlmShape

from ..allocator import Tensor
from .recipes import gating, recipe_of

F32, I32, I64 = 4, 4, 8


@dataclass(frozen=True)
class Caches:
    """The cells a stream of each KV cache holds (a sliding-window layer's own, where there is one), the bytes a
    cell takes in an attention mask (the reserve batch's rows, f16 with flash attention, else f32), and the reserve
    batch's sequences."""

    n_kv: int
    n_kv_swa: int
    mask_row: int
    seqs: int = 1  # the reserve batch's sequences (llama.cpp: n_seq_max): one recurrent state each
    kv_bytes: int = 2  # an element of an unquantized cache (f16, bf16: 2; f32: 4)


def rotation(head: int, *, widest: bool) -> int:
    """The Hadamard matrix's side: K's the largest power of two (from 128) dividing the head, V's 64."""
    side = 64
    while widest and head % (side * 2) == 0:
        side *= 2
    return side


@dataclass
class Kv:
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
class Inputs:
    """The graph's inputs (llama.cpp's llm_graph_input_*), in the order the graph first reaches them."""

    tokens: Tensor
    embd: Tensor  # the embeddings input: allocated, unused when tokens are given
    pos: Tensor
    kv: Kv
    out_ids: Tensor

    def attention(self) -> list[Tensor]:
        return [self.pos, *self.kv.leaves()]


class Graph:
    """The reserve graph's inputs (`leaves`) and ops (`nodes`), in the order llama.cpp's graph holds them."""

    def __init__(self, shape: LlmShape, n_ubatch: int, *, flash_attn: bool, replayed: tuple[int, ...] = ()) -> None:
        self.shape, self.recipe, self.n_ub, self.flash_attn = shape, recipe_of(shape), n_ubatch, flash_attn
        self.replayed = replayed or tuple(range(shape.n_layer_main))  # the layers replayed, by index
        self.extra_inputs: list[Tensor] = []  # inputs an architecture adds (Llama 4's attention scale)
        self.scale: Tensor | None = None  # the queries' per-token scale (attention temperature tuning)
        self.leaves: list[Tensor] = []
        self.nodes: list[Tensor] = []
        self.weight = Tensor(0, external=True)  # every weight: in the model's buffer
        self.cache = Tensor(0, external=True)  # the KV cache: in its own buffer

    alike_layers = True  # its layers place their tensors alike (after the first few): a few of them are replayed

    @classmethod
    def replays(cls, shape: LlmShape) -> bool:
        """The shapes of its architecture this graph writes out beyond what every recipe needs: the common decoder
        writes out no recurrent layer, experts on every layer after the dense lead, and Q, K and V in one projection
        (attn_qkv) only where they are RoPE'd and not normed (Phi-3's layout)."""
        fused_ok = not shape.qkv_fused or (
            all(shape.qkv_fused[: shape.n_layer_main]) and not shape.no_rope and not recipe_of(shape).qk_norm
        )
        return not any(shape.recurrent_layers) and shape.moe_every == 1 and fused_ok

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

    def kv(self, n_kv: int, mask_row: int, *, rotated: bool) -> Kv:
        """A KV cache's inputs."""
        shape, n_ub = self.shape, self.n_ub
        turns = tuple(
            Tensor(rotation(head, widest=widest) ** 2 * F32) if rotated and head % 64 == 0 else None
            for head, widest in ((shape.head_dim_k, True), (shape.head_dim_v, False))
        )
        v_rows = 1 if self.flash_attn else max(shape.n_head_kv) * shape.head_dim_v  # a transposed V: one per row
        return Kv((turns[0], turns[1]), Tensor(n_ub * I64), Tensor(n_ub * v_rows * I64), Tensor(n_kv * mask_row), n_kv)

    def inputs(self, n_out: int, caches: Caches, *, rotated: bool) -> Inputs:
        shape, n_ub = self.shape, self.n_ub
        return Inputs(
            Tensor(n_ub * I32), Tensor(shape.n_embd * (1 + shape.n_deepstack) * n_ub * F32),
            Tensor(shape.n_pos * n_ub * I32), self.kv(caches.n_kv, caches.mask_row, rotated=rotated),
            Tensor(n_out * I32),
        )  # fmt: skip

    def build(self, caches: Caches, n_out: int, *, rotated: bool) -> None:
        """The inputs (a sliding-window cache's own where layers slide), the layers; then the inputs in the order
        the graph first reaches them (the token ids and the embeddings input first)."""
        self.caches = caches
        if self.recipe.temp_scale and self.shape.attn_temp_scale and self.scale is None:
            self.scale = Tensor(self.n_ub * F32)  # build_inp_attn_scale
            self.extra_inputs.append(self.scale)
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

    def layers(self, inputs: Inputs, n_out: int) -> None:
        """The token embeddings' rows, the replayed layers (each at its own index; the model's last among them),
        the logits."""
        shape, n_ub = self.shape, self.n_ub
        e, last, out_ids = shape.n_embd, shape.n_layer_main, inputs.out_ids
        x = self.op(e * n_ub * F32, self.weight, inputs.tokens)
        if self.recipe.embed_scale:
            x = self.op(x.size, x, inplace=True)
        stacked = x
        if shape.n_deepstack:  # the token embeddings padded to the deepstack input's width, their first slice on
            stacked = self.op(e * (1 + shape.n_deepstack) * n_ub * F32, x)
            x = self.view(stacked)
        recipe = self.recipe
        for layer in self.replayed:
            h = self.norm(x) if recipe.pre_norms else x
            if recipe.parallel:
                x = self.parallel_block(layer, h, x, inputs, n_out)
                continue
            out = self.op(e * n_ub * F32, self.weight, self.attend_layer(layer, h, inputs))
            residual, rows = x, n_ub
            if layer == last - 1 and not recipe.rows_at_end:  # only the output rows go on
                rows = n_out
                out, residual = self.op(e * rows * F32, out, out_ids), self.op(e * rows * F32, x, out_ids)
            if recipe.post_norms:
                out = self.norm(out)
            ffn_in = self.op(e * rows * F32, out, residual, inplace=True)
            ffn_out = self.ffn(layer, self.norm(ffn_in) if recipe.pre_norms else ffn_in, rows)
            if recipe.post_norms:
                ffn_out = self.norm(ffn_out)
            if recipe.residual_first:  # add(residual, out): in place into the residual
                x = self.op(e * rows * F32, ffn_in, ffn_out, inplace=True)
            else:
                x = self.op(e * rows * F32, ffn_out, ffn_in, inplace=True)
            if layer < shape.n_deepstack:  # the layer's slice of the deepstack input, added
                x = self.op(x.size, x, self.view(stacked), inplace=True)
        if self.recipe.rows_at_end:  # the last layer's output for every token is a graph output (t_h_nextn)
            x.output = True
            x = self.op(e * n_out * F32, x, out_ids)
        logits = self.op(shape.n_vocab * n_out * F32, self.weight, self.norm(x))
        logits.output = True

    def parallel_block(self, layer: int, h: Tensor, x: Tensor, inputs: Inputs, n_out: int) -> Tensor:
        """A block whose attention and FFN both read `h` (Cohere's): x + ffn(h) + attention(h). In llama.cpp's graph
        the attention comes first (build_attn adds it at once), but what follows it (a rotated cache's turn back,
        the output projection) is reached only after the FFN and its residual add (the graph is expanded from the
        block's output, operands first); on the last layer the output rows of h and x are taken before the FFN,
        those of the projected attention after it (GGML_SCHED_DEBUG=2's node list)."""
        e, n_ub, last, out_ids = self.shape.n_embd, self.n_ub, self.shape.n_layer_main, inputs.out_ids
        kv = self.cache_of(layer, inputs)
        attention = self.attend(h, inputs.pos, kv, turned=False, roped=self.roped(layer))
        rows = n_out if layer == last - 1 else n_ub
        if rows != n_ub:
            h = self.op(e * rows * F32, h, out_ids)
        ffn_out = self.ffn(layer, h, rows)
        residual = self.op(e * rows * F32, x, out_ids) if rows != n_ub else x
        x = self.op(e * rows * F32, ffn_out, residual, inplace=True)
        if self.flash_attn:  # flash attention's output turned back (a rotated cache), after the FFN too
            attention = self.turned_back(attention, kv)
        out = self.op(e * n_ub * F32, self.weight, attention)
        if rows != n_ub:
            out = self.op(e * rows * F32, out, out_ids)
        return self.op(e * rows * F32, x, out, inplace=True)

    def attend_layer(self, layer: int, h: Tensor, inputs: Inputs) -> Tensor:
        if self.shape.mla:
            return self.attend_mla(h, inputs.pos, inputs.kv)
        return self.attend(h, inputs.pos, self.cache_of(layer, inputs), roped=self.roped(layer))

    def roped(self, layer: int) -> bool:
        return not (self.shape.unroped_layers and self.shape.unroped_layers[layer])

    def attend_mla(self, h: Tensor, pos: Tensor, kv: Kv) -> Tensor:
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

    def cache_of(self, layer: int, inputs: Inputs) -> Kv:
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

    def attend(self, h: Tensor, pos: Tensor, kv: Kv, *, turned: bool = True, roped: bool = True) -> Tensor:
        """The attention of a normed input, up to its output projection: Q, V, K (or Q, K, V), the cache writes,
        attention (`turned`: flash attention's output turned back where the cache is rotated; else as it is;
        `roped`: the layer turns Q and K by their positions, unless the model has no RoPE at all)."""
        shape, n_ub = self.shape, self.n_ub
        roped = roped and not shape.no_rope
        k_turn, v_turn = kv.turns
        kv_heads = max(shape.n_head_kv)
        q_width, k_width, v_width = (
            shape.n_head * shape.head_dim_k, kv_heads * shape.head_dim_k, kv_heads * shape.head_dim_v
        )  # fmt: skip
        # Q, K and V as views of one projection where the file has attn_qkv (build_qkv's fused path)
        qkv = self.op((q_width + k_width + v_width) * n_ub * F32, self.weight, h) if shape.qkv_fused else None
        q = self.view(qkv) if qkv is not None else self.projection(h, q_width, normed=True)
        if roped:
            q = self.op(q_width * n_ub * F32, q, pos, inplace=True)  # RoPE: a new tensor when q is a view
        if self.scale is not None and self.recipe.temp_scale:  # the temperature's scale, multiplied in place
            q = self.op(q.size, q, self.scale, inplace=True)
        if self.recipe.q_scaled:  # Q scaled by 1/sqrt(head) before the attention, in place
            q = self.op(q.size, q, inplace=True)
        q = self.turn(q, k_turn)

        def make_k() -> Tensor:
            if qkv is not None:
                k = self.op(k_width * n_ub * F32, self.view(qkv), pos, inplace=True)  # RoPE of a view: new
                return self.turn(k, k_turn)
            k = self.projection(h, k_width, normed=True)
            return self.turn(self.op(k.size, k, pos, inplace=True) if roped else k, k_turn)

        def make_v() -> Tensor:
            if qkv is not None:
                return self.turn(self.view(qkv), v_turn)
            return self.turn(self.view(self.op(v_width * n_ub * F32, self.weight, h)), v_turn)

        if self.recipe.k_before_v:
            k = make_k()
            v = make_v()
        else:
            v = make_v()
            k = make_k()
        return self.stored_and_attended(q, k, v, kv, turned=turned)

    def stored_and_attended(self, q: Tensor, k: Tensor, v: Tensor, kv: Kv, *, turned: bool = True) -> Tensor:
        """K and V written into the cache (set_rows: views of it), the attention of Q over the cache."""
        shape, n_ub = self.shape, self.n_ub
        self.cache_view(self.view(k), kv.k_idxs)
        self.cache_view(self.view(v), kv.v_idxs)
        width = shape.n_head * shape.head_dim_v
        if self.flash_attn:
            kv_heads = max(shape.n_head_kv)
            k_all, v_all = self.cached(kv, kv_heads * shape.head_dim_k), self.cached(kv, kv_heads * shape.head_dim_v)
            fa = self.op(width * n_ub * F32, self.view(q), k_all, v_all, kv.mask)
            return self.turned_back(fa, kv) if turned else fa
        scores = self.op(kv.n_kv * shape.n_head * n_ub * F32, self.cache_view(), self.view(q))
        probs = self.op(scores.size, scores, kv.mask, inplace=True)  # soft-max with the mask, in place
        kqv = self.op(width * n_ub * F32, self.cache_view(), probs)
        return self.op(kqv.size, self.view(kqv))  # the permuted product made contiguous

    def turned_back(self, fa: Tensor, kv: Kv) -> Tensor:
        """Flash attention's output turned back by V's rotation, where the cache is rotated."""
        return self.turn(self.view(fa), kv.turns[1])

    def cached(self, kv: Kv, row: int) -> Tensor:
        """K or V as flash attention reads it: a view of the cache, cast to f16 from an f32 cache (build_attn_mha)
        -- every stream's cells, `row` floats a cell."""
        if self.caches.kv_bytes != 4:
            return self.cache_view()
        return self.op(row * kv.n_kv * self.caches.seqs * 2, self.cache_view())

    def dense(self, h: Tensor, rows: int, width: int = 0) -> Tensor:
        """build_ffn: gate, up, SwiGLU, down (`width`: the FFN's, else the model's n_ff); without a gate: up, the
        activation in place (its bias too), down."""
        n_ff = width or self.shape.n_ff
        if self.shape.ffn_joint and not width:  # gate and up in one product, split by the SwiGLU: a new tensor
            act = self.op(n_ff * rows * F32, self.op(2 * n_ff * rows * F32, self.weight, h))
            return self.op(self.shape.n_embd * rows * F32, self.weight, act)
        if not self.shape.ffn_gated and not width:
            act = self.op(n_ff * rows * F32, self.op(n_ff * rows * F32, self.weight, h), inplace=True)
            return self.op(self.shape.n_embd * rows * F32, self.weight, act)
        gate, up = self.op(n_ff * rows * F32, self.weight, h), self.op(n_ff * rows * F32, self.weight, h)
        return self.op(self.shape.n_embd * rows * F32, self.weight, self.op(n_ff * rows * F32, gate, up))

    def moe(self, h: Tensor, rows: int) -> Tensor:
        """llama-graph.cpp build_moe_ffn for a SwiGLU expert FFN with separate gate and up projections."""
        shape, recipe = self.shape, self.recipe
        k, n_exp, e, f = shape.n_expert_used, shape.n_expert, shape.n_embd, shape.n_ff_exp
        router = gating(shape)
        probs = self.op(n_exp * rows * F32, self.op(n_exp * rows * F32, self.weight, h), inplace=True)
        chosen = probs
        # the selection bias, added beside the probabilities: sigmoid routers' (or the file's, by the header)
        if shape.expert_bias if recipe.gating == "header" else router == "sigmoid":
            chosen = self.op(n_exp * rows * F32, probs, self.weight, inplace=True)
        top_k = self.view(self.op(n_exp * rows * I32, chosen))  # argsort, its first k
        weights = self.op(k * rows * F32, self.view(probs), top_k)
        if router == "softmax_weight":  # a soft-max over the chosen ones (of a view: a new tensor)
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
