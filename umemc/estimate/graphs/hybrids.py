"""The reserve graphs of the hybrids written out here: recurrent layers (LFM2's short convolutions, Granite 4.0
H's Mamba-2, Qwen3-Next's gated DeltaNet) between attention layers, in the order llama.cpp's explicit
expansions put their ops in."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from umemc.catalog.archs import LlmShape

from ..allocator import Tensor
from .decoder import F32, I32, Caches, Graph, Inputs


class RecurrentGraph(Graph):
    """A graph with recurrent layers: one more input, which state each of the reserve batch's sequences reads
    (llm_graph_input_rs s_copy), and build_rs's reads of a layer's state."""

    alike_layers = False  # its layers are of two kinds, in the model's own pattern: every one is replayed

    @classmethod
    def replays(cls, shape: LlmShape) -> bool:
        """A shape without recurrent layers as the common decoder's; with them, where its mixers are written out
        (`mixers_replayed`), experts on every layer."""
        if not any(shape.recurrent_layers):
            return shape.moe_every == 1
        return shape.moe_every == 1 and cls.mixers_replayed(shape)

    @classmethod
    def mixers_replayed(cls, shape: LlmShape) -> bool:
        return False

    def build(self, caches: Caches, n_out: int, *, rotated: bool) -> None:
        self.s_copy = Tensor(caches.seqs * I32)
        self.extra_inputs.append(self.s_copy)
        super().build(caches, n_out, rotated=rotated)

    def state_rows(self, size: int) -> Tensor:
        """build_rs: a state's rows for the batch's sequences (a view of the cache cleared in place first), then the
        extra states' copy."""
        rows = self.op(size * self.caches.seqs * F32, self.cache_view(), self.view(self.s_copy))
        self.extra_states()
        return rows

    def extra_states(self) -> None:
        """The states of the cells beyond the batch's sequences copied over: none in the reserve batch (a tensor of
        no bytes, and its copy into the cache)."""
        self.cache_view(self.op(0, self.cache_view(), self.view(self.s_copy)))


class ShortConvGraph(RecurrentGraph):
    """LFM2's graph (src/models/lfm2.cpp): attention layers and short-convolution layers, each followed by a dense
    FFN, the residual added into the layer's input. The order is the one llama.cpp's explicit expansions give:
    a convolution layer first reads its recurrent state (build_rs: the state's rows, a view of the cache cleared in
    place, the extra states' copy) and writes the new one from the concatenation of that state with the layer's
    gated input -- which pulls in everything before it, the previous layer's output projection and FFN included --
    while its own convolution, output projection and FFN wait for the next layer's first expansion; an attention
    layer's expansions end with the attention itself."""

    @classmethod
    def mixers_replayed(cls, shape: LlmShape) -> bool:
        """LFM2's short convolutions with a dense FFN."""
        return shape.recurrent_kind == "shortconv" and not shape.n_expert

    def layers(self, inputs: Inputs, n_out: int) -> None:
        shape, n_ub, seqs = self.shape, self.n_ub, self.caches.seqs
        e, out_ids = shape.n_embd, inputs.out_ids
        x = self.op(e * n_ub * F32, self.weight, inputs.tokens)
        pending: Callable[[], Tensor] | None = None  # the previous layer's rest, made at this layer's first expansion
        for layer in range(shape.n_layer_main):
            if shape.recurrent_layers[layer]:
                state = self.state_rows(shape.n_embd_r)
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


class Mamba2Graph(RecurrentGraph):
    """Granite 4.0 H's graph (src/models/granite-hybrid.cpp, mamba-base.cpp build_mamba2_layer): Mamba-2 layers
    and attention layers, each followed by routed experts and a shared expert (or a dense FFN). The order is the
    one llama.cpp's explicit expansions give: a Mamba-2 layer first reads its convolution state (build_rs: the
    state's rows, the extra states' copy), which comes before the previous layer's shared expert and residual;
    its convolution state's write pulls in its norm and in-projection, its SSM state's write the convolution
    and the scan; the routed experts are expanded early (build_moe_ffn), the shared expert when the next layer
    asks for the layer's output."""

    @classmethod
    def mixers_replayed(cls, shape: LlmShape) -> bool:
        """Mamba-2 mixers whose inner size divides into its heads and groups."""
        if len(shape.ssm_dims) != 5:
            return False
        d_conv, d_inner, d_state, n_group, n_head = shape.ssm_dims
        return min(shape.ssm_dims) > 0 and d_inner % n_head == 0 and d_inner % n_group == 0

    def layers(self, inputs: Inputs, n_out: int) -> None:
        shape, n_ub = self.shape, self.n_ub
        e, last, out_ids = shape.n_embd, shape.n_layer_main, inputs.out_ids
        x = self.op(e * n_ub * F32, self.weight, inputs.tokens)
        tail: Callable[[], Tensor] | None = None  # the previous layer's shared expert and residual
        for layer in range(last):
            state = self.state_rows(shape.n_embd_r) if shape.recurrent_layers[layer] else None
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

    def mamba2(self, h: Tensor, state: Tensor) -> Tensor:
        """The in-projection (z, xBC, dt), the convolution over the state and xBC, its write into the cache, the
        scan (its output: y, then the new SSM state, written into the cache), y + x D gated by z, the grouped
        RMS norm: the out-projection's input."""
        d_conv, d_inner, d_state, n_group, n_head = self.shape.ssm_dims
        n_ub, seqs = self.n_ub, self.caches.seqs
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
        self.extra_states()
        self.cache_view(self.view(scan))  # the new SSM state's write
        z = self.op(d_inner * n_ub * F32, self.view(zxbcdt))  # cont
        xd = self.op(d_inner * n_ub * F32, self.view(xbc), self.weight)
        y = self.op(xd.size, self.view(scan), xd, inplace=True)
        y = self.op(y.size, z, y)  # swiglu
        y = self.op(y.size, self.op(y.size, self.view(y)), self.weight, inplace=True)  # the grouped norm
        return self.view(y)


class DeltaNetGraph(RecurrentGraph):
    """Qwen3-Next's graph (src/models/qwen3next.cpp, the gated delta net of delta-net-base.cpp): gated DeltaNet
    layers between gated attention layers, routed experts and a sigmoid-gated shared expert after each. Each
    layer's norm is expanded first; a DeltaNet layer then reads its convolution state, projects q, k, v in one
    product, joins it after the state (writing the new state), reads its SSM state, convolves, norms q and k (L2:
    an RMS norm and a scale) and repeats them to the value heads, computes the decay (softplus) and beta
    (sigmoid) from one small product, runs the delta rule (the output, then the new state, written into the
    cache), norms the output gated by silu(z), and projects it out. An attention layer's Q projection carries a
    gate, applied (sigmoid) to the attention's output. Every token goes through the last layer; the final norm's
    output is a graph output (t_h_nextn), its output rows the logits' input."""

    repeats_heads = True  # q and k repeated to the value heads where there are more (qwen3next.cpp always does)

    @classmethod
    def mixers_replayed(cls, shape: LlmShape) -> bool:
        """The converter's layout: q/k/v fused on every DeltaNet layer (an older file's joint ssm_in is not written
        out), value heads a multiple of the key heads, routed experts and a shared one, K and V heads alike."""
        if len(shape.ssm_dims) != 5:
            return False
        d_conv, d_inner, d_state, n_k, n_v = shape.ssm_dims
        fused = len(shape.qkv_fused) >= shape.n_layer_main and all(
            shape.qkv_fused[i] for i in range(shape.n_layer_main) if shape.recurrent_layers[i]
        )
        return (
            fused and min(shape.ssm_dims) > 0 and n_v % n_k == 0 and d_inner % n_v == 0 and shape.n_expert > 0
            and bool(shape.n_ff_shexp) and shape.head_dim_k == shape.head_dim_v
        )  # fmt: skip

    def layers(self, inputs: Inputs, n_out: int) -> None:
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
        repeated = d_state * (n_v if self.repeats_heads else n_k)
        q, k = (self.l2_normed(conv, d_state * n_k, repeated) for _ in range(2))
        decay, beta = self.gates(h)
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

    def gates(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """The decay and beta from one small product (ba): a's cont, + dt bias, softplus, x A (in place); b's cont,
        its sigmoid in place."""
        n_v, n_ub = self.shape.ssm_dims[4], self.n_ub
        ba = self.op(2 * n_v * n_ub * F32, self.weight, h)
        decay = self.op(n_v * n_ub * F32, self.view(ba))
        for _ in range(3):
            decay = self.op(decay.size, decay, self.weight, inplace=True)
        beta = self.op(n_v * n_ub * F32, self.view(ba))
        return decay, self.op(beta.size, beta, inplace=True)

    def l2_normed(self, conv: Tensor, width: int, repeated: int) -> Tensor:
        """q or k out of the convolution: an RMS norm (of a view: a new tensor) and a scale in place, repeated
        to the value heads where they are more (a view of it otherwise)."""
        x = self.op(width * self.n_ub * F32, self.view(conv))
        x = self.op(x.size, x, inplace=True)
        if repeated != width:
            return self.view(self.op(repeated * self.n_ub * F32, self.view(x)))
        return self.view(x)

    def gated_attention(self, h: Tensor, inputs: Inputs, *, fused: bool) -> Tensor:
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


class Qwen35Graph(DeltaNetGraph):
    """Qwen3.5's MoE graph (src/models/qwen35moe.cpp): Qwen3-Next's, but for its DeltaNet layers' decay and beta,
    each from a product of its own (ssm_alpha: + dt bias on its reshape, a new tensor, softplus and x A in place;
    ssm_beta: the sigmoid of its reshape, a new tensor), and q and k left at the key heads: llama.cpp's fused gated
    delta net (cparams.fused_gdn_ar / _ch, on where the backend has it: the CPU's does) repeats them itself. Its
    attention's positions are M-RoPE's four a token (the positions input)."""

    repeats_heads = False

    def gates(self, h: Tensor) -> tuple[Tensor, Tensor]:
        n_v, n_ub = self.shape.ssm_dims[4], self.n_ub
        alpha = self.op(n_v * n_ub * F32, self.weight, h)
        decay = self.op(alpha.size, self.view(alpha), self.weight, inplace=True)  # + dt bias, of a view: new
        for _ in range(2):  # softplus, x A
            decay = self.op(decay.size, decay, self.weight, inplace=True)
        beta = self.op(n_v * n_ub * F32, self.weight, h)
        return self.view(decay), self.op(beta.size, self.view(beta), inplace=True)  # sigmoid of a view: new
