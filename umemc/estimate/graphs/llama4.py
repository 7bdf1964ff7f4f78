"""Llama 4's reserve graph."""

from __future__ import annotations

from umemc.catalog.archs import LlmShape

from ..allocator import Tensor
from .decoder import F32, I32, Caches, Graph, Inputs, Kv


class Llama4Graph(Graph):
    """Llama 4's graph (src/models/llama4.cpp). Three layers of four attend in chunks (8192 tokens) to their own,
    smaller cache (llama-kv-cache-iswa.cpp: its own cell indices and mask); the fourth attends to the whole cache
    without RoPE, its queries scaled by a per-token input instead (temperature tuning). Q, K and V are made in
    that order, each RoPE'd layer's Q and K normed without a weight (not for the 128-expert model); a quantized
    cache turns them after all three. Experts: the router's logits, their sigmoid, the top k chosen on the
    logits, the chosen weights applied to the input before the experts (weight_before_ffn), and a shared expert as
    wide as a routed one beside them, the two added. Without a window (a file's sliding_window = 0) one cache,
    and only the last layer goes without RoPE."""

    @classmethod
    def replays(cls, shape: LlmShape) -> bool:
        """Llama 4 with routed experts, on every layer or every interleave_moe_layer_step-th (Maverick), Q, K and V
        projected apart."""
        return not any(shape.recurrent_layers) and shape.n_expert_used > 0 and not shape.qkv_fused

    def build(self, caches: Caches, n_out: int, *, rotated: bool) -> None:
        self.no_rope_every = 4 if any(self.shape.swa_layers) else self.shape.n_layer  # n_no_rope_layer_step
        self.temperature = Tensor(self.n_ub * F32)  # the no-RoPE layers' query scale
        self.extra_inputs.append(self.temperature)
        super().build(caches, n_out, rotated=rotated)

    def attend_layer(self, layer: int, h: Tensor, inputs: Inputs) -> Tensor:
        kv = self.cache_of(layer, inputs)
        roped = (layer + 1) % self.no_rope_every != 0
        return self.attend4(h, kv, inputs.pos if roped else self.temperature, roped=roped)

    def attend4(self, h: Tensor, kv: Kv, by: Tensor, *, roped: bool) -> Tensor:
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
