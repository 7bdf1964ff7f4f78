"""Built-in architecture presets: the tensor shapes of published models.

An estimate from a preset lays out every tensor the way llama.cpp's converter names and shapes it
(`gguf-py/gguf/tensor_mapping.py`), then applies llama.cpp's per-tensor quantization mix
(`quant.mix_types`), because a flat bits-per-weight average is up to 6% off (docs/ESTIMATES.md).
Shapes come from each model's published `config.json` (URL in `source`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .llama_archs import positions

Tensor = tuple[str, tuple[int, ...]]


class LlmShape(NamedTuple):
    """What the KV and compute estimates need, from a preset or a GGUF header."""

    arch: str  # llama.cpp architecture name (general.architecture)
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer (GGUF allows an array)
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()  # True where a layer uses the sliding window
    causal: bool = True  # False: encoder (embedding) model, no KV cache
    # Mixture of experts (n_expert 0: dense). The first n_layer_dense_lead layers have a dense FFN of n_ff.
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0  # one expert's FFN width
    n_ff_shexp: int = 0  # the shared experts' FFN width, all of them together (0: none)
    n_layer_dense_lead: int = 0
    moe_every: int = 1  # after the dense lead, every Nth layer has experts (interleave_moe_layer_step; 0: none)
    # Multi-head latent attention (deepseek2): the cache keeps one latent K row per token (kv_lora_rank +
    # rope dims, head_dim_k with one KV head) and no V: llama.cpp reads V as a view of K.
    mla: bool = False
    head_dim_v_mla: int = 0  # MLA: the value head after V's up-projection (value_length_mla)
    n_layer_nextn: int = 0  # trailing next-token-prediction layers: in the file, not loaded, no KV
    # Recurrent (Mamba-2) layers of a hybrid model: no KV cache; a conv and an SSM state per sequence.
    recurrent_layers: tuple[bool, ...] = ()
    n_embd_r: int = 0  # conv state per sequence and layer, f32 elements
    n_embd_s: int = 0  # SSM state per sequence and layer, f32 elements
    ssm_dims: tuple[int, ...] = ()  # (d_conv, d_inner, d_state, n_group, n_head) of the Mamba-2 mixer
    # Layers that keep a KV cache, where the architecture decides it apart from its KV heads (llama.cpp's
    # per-architecture memory filters: falcon-h1's layers attend and recur; qwen3next attends every 4th layer;
    # gemma3n's later layers reuse an earlier layer's cache). Empty: a layer of the main graph with KV heads
    # that is not recurrent.
    kv_layers: tuple[bool, ...] = ()
    recurrent_kind: str = "mamba"  # the mixer whose state recurrent_layers keep (umemc.estimate.llm)
    resident_width: int = 0  # floats per token alive through every layer beside the residual (gemma3n's altup)
    unmodelled: tuple[str, ...] = ()  # what of an unknown architecture the generic rules cannot see
    qk_norm: bool = False  # the file has per-head Q/K norms (attn_q_norm; optional in glm4moe)
    qk_norm_flat: bool = False  # its Q norm spans the whole projection (OLMo 2's), not one head
    # where a block's norms are, as its tensors say: "pre" before the attention and before the FFN; "sandwich"
    # after them too (post_attention_norm and post_ffw_norm beside attn_norm and ffn_norm); "post" only after them
    # (no attn_norm: OLMo 2); "parallel" one norm, whose output both the attention and the FFN read (no ffn_norm:
    # Cohere); "": not known (no block's tensors were read: a preset, or a file that lists none)
    block_norms: str = ""
    # The chosen experts' weights divided by their sum and scaled (expert_weights_norm / _scale: llama.cpp reads
    # them for glm4moe, deepseek2 and a few more; others normalise or not by architecture)
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0
    no_rope: bool = False  # attention without RoPE (Granite: rope.scaling.finetuned = false, as for Granite 4.0 H)
    unroped_layers: tuple[bool, ...] = ()  # per layer: attention without RoPE (Command A's global layers)
    # MLA's projections (q_lora_rank, 0 without a Q LoRA; kv_lora_rank; the RoPE'd dims; key_length_mla)
    mla_dims: tuple[int, ...] = ()
    # the router as the header says, where llama.cpp reads it (deepseek2): llama_expert_gating_func_type (0: the
    # file says nothing), expert groups (DeepSeek V3 picks experts from the best groups), a selection bias tensor
    expert_gating: int = 0
    expert_groups: int = 0
    expert_bias: bool = False
    attn_temp_scale: bool = False  # queries scaled by a per-token input (attention.temperature_scale)
    qkv_fused: tuple[bool, ...] = ()  # per layer: Q, K and V in one projection (attn_qkv); empty: none is
    experts_gate_up: bool = False  # the experts' gate and up projections in one tensor (ffn_gate_up_exps)
    ffn_gated: bool = True  # the dense FFN has a gate (ffn_gate); without one: up, activation, down (StarCoder2)
    experts_gated: bool = True  # the routed experts have a gate (ffn_gate_exps; Nemotron 3's have none)
    shexp_gated: bool = True  # the shared expert has a gate (ffn_gate_shexp)
    ffn_joint: bool = False  # the dense FFN's gate and up in one tensor (ffn_up of 2 x n_ff: Phi-3, GLM-4)
    # deepstack inputs (Qwen3-VL: n_deepstack_layers): the embeddings input is n_embd x (1 + n_deepstack) wide, and
    # the token embeddings are padded to it; the first n_deepstack layers each add one slice of it to their output
    n_deepstack: int = 0
    n_pos: int = 1  # positions a token (M-RoPE: 4, llama_hparams::n_pos_per_embd)

    @property
    def n_gqa(self) -> int:
        return self.n_head // max(1, max(self.n_head_kv))

    @property
    def n_layer_main(self) -> int:
        """The layers llama.cpp runs (block_count less the next-token-prediction layers)."""
        return self.n_layer - self.n_layer_nextn

    def has_kv(self, layer: int) -> bool:
        """llama_hparams::has_kv and the KV filters: a layer of the main graph with KV heads that the
        architecture's filter keeps (kv_layers), else that is not recurrent."""
        if layer >= self.n_layer_main or self.n_head_kv[layer] == 0:
            return False
        if self.kv_layers:
            return self.kv_layers[layer]
        return not (self.recurrent_layers and self.recurrent_layers[layer])

    def is_moe(self, layer: int) -> bool:
        every = self.moe_every
        return self.n_expert > 0 and layer >= self.n_layer_dense_lead and every > 0 and (layer + 1) % every == 0


class VisionShape(NamedTuple):
    """A llama.cpp multimodal projector (mmproj) preset: a ViT encoder plus a merger."""

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    patch: int
    merge: int
    out_embd: int

    def tensors(self) -> list[Tensor]:
        e, f, p = self.n_embd, self.n_ff, self.patch
        out: list[Tensor] = [("v.patch_embd.weight", (p, p, 3, e)), ("v.patch_embd.weight.1", (p, p, 3, e))]
        for i in range(self.n_layer):
            b = f"v.blk.{i}."
            for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
                out += [(b + t + ".weight", (e, e)), (b + t + ".bias", (e,))]
            out += [(b + "ln1.weight", (e,)), (b + "ln2.weight", (e,))]
            for t in ("ffn_up", "ffn_gate"):
                out += [(b + t + ".weight", (e, f)), (b + t + ".bias", (f,))]
            out += [(b + "ffn_down.weight", (f, e)), (b + "ffn_down.bias", (e,))]
        m = e * self.merge * self.merge
        out += [
            ("v.post_ln.weight", (e,)),
            ("mm.0.weight", (m, m)),
            ("mm.0.bias", (m,)),
            ("mm.2.weight", (m, self.out_embd)),
            ("mm.2.bias", (self.out_embd,)),
        ]
        return out


class MlaShape(NamedTuple):
    """DeepSeek-2 multi-head latent attention (config.json: q_lora_rank, kv_lora_rank, qk_*_head_dim)."""

    q_lora_rank: int  # 0: a plain attn_q (the Lite models)
    kv_lora_rank: int
    qk_nope: int
    qk_rope: int
    v_head: int


class SsmShape(NamedTuple):
    """A Mamba-2 mixer (config.json: mamba_d_conv, mamba_d_state, mamba_n_groups, mamba_n_heads, mamba_d_head)."""

    d_conv: int
    d_inner: int
    d_state: int
    n_group: int
    n_head: int

    @property
    def n_embd_r(self) -> int:  # llama_hparams::n_embd_r: the conv state drops its oldest column
        return (self.d_conv - 1) * (self.d_inner + 2 * self.n_group * self.d_state)

    @property
    def n_embd_s(self) -> int:  # llama_hparams::n_embd_s
        return self.d_state * self.d_inner


class LlmPreset(NamedTuple):
    name: str
    family: str  # "llm" | "embedding"
    shape: LlmShape
    source: str
    tied_embeddings: bool = False
    qkv_bias: bool = False
    fused_qkv: bool = False  # phi3: one attn_qkv tensor, ffn_up holds gate and up
    gemma_norms: bool = False  # gemma2/3: q/k norms and post-attention/post-FFN norms
    qk_norm: bool = False  # qwen3, qwen3moe: attn_q_norm / attn_k_norm per head
    attn_out_bias: bool = False  # gpt-oss
    sinks: bool = False  # gpt-oss: a learned attention sink per head (attn_sinks)
    post_attn_norm: bool = False  # gpt-oss, glm4moe: post_attention_norm instead of ffn_norm
    expert_bias: bool = False  # gpt-oss: biases on the router and on every expert matrix
    exp_probs_b: bool = False  # glm4moe: the router's selection bias
    mla: MlaShape | None = None
    ssm: SsmShape | None = None
    is_70b: bool = False  # llama.cpp LLM_TYPE_70B: attn_v gets at least Q5_K
    default_quant: str = "Q4_K_M"
    vision: VisionShape | None = None

    def tensors(self) -> list[Tensor]:
        if self.shape.arch == "bert":
            return _bert_tensors(self.shape)
        s = self.shape
        out: list[Tensor] = [("token_embd.weight", (s.n_embd, s.n_vocab))]
        for i in range(s.n_layer_main):
            out += self._block(i)
        out.append(("output_norm.weight", (s.n_embd,)))
        if not self.tied_embeddings:
            out.append(("output.weight", (s.n_embd, s.n_vocab)))
        for i in range(s.n_layer_main, s.n_layer):  # next-token-prediction blocks last, outside the mapped range
            out += self._block(i)
        return out

    def _block(self, i: int) -> list[Tensor]:
        s, b = self.shape, f"blk.{i}."
        out: list[Tensor] = [(b + "attn_norm.weight", (s.n_embd,))]
        if s.recurrent_layers and s.recurrent_layers[i]:
            out += self._mamba2(b)
        elif self.mla is not None:
            out += self._mla(b)
        else:
            out += self._attention(b, i)
        out.append((b + ("post_attention_norm.weight" if self.post_attn_norm else "ffn_norm.weight"), (s.n_embd,)))
        out += self._moe(b) if s.is_moe(i) else self._dense_ffn(b)
        if self.gemma_norms:
            out.append((b + "post_ffw_norm.weight", (s.n_embd,)))
        if i >= s.n_layer_main:  # next-token prediction: what the converter writes beside the block
            e = s.n_embd
            out += [
                (b + "nextn.eh_proj.weight", (2 * e, e)),
                (b + "nextn.enorm.weight", (e,)),
                (b + "nextn.hnorm.weight", (e,)),
                (b + "nextn.shared_head_norm.weight", (e,)),
            ]
        return out

    def _attention(self, b: str, i: int) -> list[Tensor]:
        s = self.shape
        q, kv = s.n_head * s.head_dim_k, s.n_head_kv[i] * s.head_dim_k
        out: list[Tensor] = []
        if self.fused_qkv:
            out.append((b + "attn_qkv.weight", (s.n_embd, q + 2 * kv)))
        else:
            out += [
                (b + "attn_q.weight", (s.n_embd, q)),
                (b + "attn_k.weight", (s.n_embd, kv)),
                (b + "attn_v.weight", (s.n_embd, kv)),
            ]
        if self.qkv_bias:
            out += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)), (b + "attn_v.bias", (kv,))]
        out.append((b + "attn_output.weight", (q, s.n_embd)))
        if self.attn_out_bias:
            out.append((b + "attn_output.bias", (s.n_embd,)))
        if self.sinks:
            out.append((b + "attn_sinks.weight", (s.n_head,)))
        if self.qk_norm or self.gemma_norms:
            out += [(b + "attn_q_norm.weight", (s.head_dim_k,)), (b + "attn_k_norm.weight", (s.head_dim_k,))]
        if self.gemma_norms:
            out.append((b + "post_attention_norm.weight", (s.n_embd,)))
        return out

    def _mla(self, b: str) -> list[Tensor]:
        s, m = self.shape, self.mla
        assert m is not None
        out: list[Tensor] = []
        hk = m.qk_nope + m.qk_rope
        if m.q_lora_rank:
            out += [
                (b + "attn_q_a_norm.weight", (m.q_lora_rank,)),
                (b + "attn_q_a.weight", (s.n_embd, m.q_lora_rank)),
                (b + "attn_q_b.weight", (m.q_lora_rank, s.n_head * hk)),
            ]
        else:
            out.append((b + "attn_q.weight", (s.n_embd, s.n_head * hk)))
        return out + [
            (b + "attn_kv_a_norm.weight", (m.kv_lora_rank,)),
            (b + "attn_kv_a_mqa.weight", (s.n_embd, m.kv_lora_rank + m.qk_rope)),
            (b + "attn_k_b.weight", (m.qk_nope, m.kv_lora_rank, s.n_head)),
            (b + "attn_v_b.weight", (m.kv_lora_rank, m.v_head, s.n_head)),
            (b + "attn_output.weight", (s.n_head * m.v_head, s.n_embd)),
        ]

    def _mamba2(self, b: str) -> list[Tensor]:
        s, m = self.shape, self.ssm
        assert m is not None
        conv = m.d_inner + 2 * m.n_group * m.d_state
        return [
            (b + "ssm_in.weight", (s.n_embd, 2 * m.d_inner + 2 * m.n_group * m.d_state + m.n_head)),
            (b + "ssm_conv1d.weight", (m.d_conv, conv)),
            (b + "ssm_conv1d.bias", (conv,)),
            (b + "ssm_dt.bias", (m.n_head,)),
            (b + "ssm_a", (1, m.n_head)),
            (b + "ssm_d", (1, m.n_head)),
            (b + "ssm_norm.weight", (m.d_inner // m.n_group, m.n_group)),
            (b + "ssm_out.weight", (m.d_inner, s.n_embd)),
        ]

    def _dense_ffn(self, b: str) -> list[Tensor]:
        s = self.shape
        if self.fused_qkv:
            return [(b + "ffn_up.weight", (s.n_embd, 2 * s.n_ff)), (b + "ffn_down.weight", (s.n_ff, s.n_embd))]
        return [
            (b + "ffn_gate.weight", (s.n_embd, s.n_ff)),
            (b + "ffn_up.weight", (s.n_embd, s.n_ff)),
            (b + "ffn_down.weight", (s.n_ff, s.n_embd)),
        ]

    def _moe(self, b: str) -> list[Tensor]:
        s = self.shape
        e, f, n = s.n_embd, s.n_ff_exp, s.n_expert
        out: list[Tensor] = [(b + "ffn_gate_inp.weight", (e, n))]
        if self.expert_bias:
            out.append((b + "ffn_gate_inp.bias", (n,)))
        if self.exp_probs_b:
            out.append((b + "exp_probs_b.bias", (n,)))
        out += [
            (b + "ffn_gate_exps.weight", (e, f, n)),
            (b + "ffn_up_exps.weight", (e, f, n)),
            (b + "ffn_down_exps.weight", (f, e, n)),
        ]
        if self.expert_bias:
            out += [
                (b + "ffn_gate_exps.bias", (f, n)),
                (b + "ffn_up_exps.bias", (f, n)),
                (b + "ffn_down_exps.bias", (e, n)),
            ]
        if s.n_ff_shexp:
            out += [
                (b + "ffn_gate_shexp.weight", (e, s.n_ff_shexp)),
                (b + "ffn_up_shexp.weight", (e, s.n_ff_shexp)),
                (b + "ffn_down_shexp.weight", (s.n_ff_shexp, e)),
            ]
        return out


def _bert_tensors(s: LlmShape) -> list[Tensor]:
    e, f = s.n_embd, s.n_ff
    out: list[Tensor] = [
        ("token_embd.weight", (e, s.n_vocab)),
        ("token_types.weight", (e, 1)),
        ("position_embd.weight", (e, s.n_ctx_train)),  # the converter drops XLM-R's 2 padding positions
        ("token_embd_norm.weight", (e,)),
        ("token_embd_norm.bias", (e,)),
    ]
    for i in range(s.n_layer):
        b = f"blk.{i}."
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out += [(b + t + ".weight", (e, e)), (b + t + ".bias", (e,))]
        out += [
            (b + "attn_output_norm.weight", (e,)),
            (b + "attn_output_norm.bias", (e,)),
            (b + "ffn_up.weight", (e, f)),
            (b + "ffn_up.bias", (f,)),
            (b + "ffn_down.weight", (f, e)),
            (b + "ffn_down.bias", (e,)),
            (b + "layer_output_norm.weight", (e,)),
            (b + "layer_output_norm.bias", (e,)),
        ]
    return out


@dataclass(frozen=True)
class TorchPreset:
    """A non-GGUF family (diffusion, speech): parameter count and measured activation peaks."""

    name: str
    family: str  # "diffusion" | "speech"
    params: int
    parts: dict[str, int]  # parameter count per component, for `explain`
    activation_bytes: dict[str, int]  # peak activations at the reference workload, by dtype
    reference: str  # the workload the activation figures were measured at
    source: str
    default_quant: str = "fp16"
    extra: dict[str, int] = field(default_factory=dict)


_SHAPE_KEYS = (
    "n_expert", "n_expert_used", "n_ff_exp", "n_ff_shexp", "n_layer_dense_lead", "n_layer_nextn",
    "expert_weights_norm", "expert_weights_scale", "no_rope",
)  # fmt: skip


def llm_preset(
    name: str,
    arch: str,
    *,
    layers: int,
    embd: int,
    ff: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    ctx: int,
    head_dim: int | None = None,
    swa: int = 0,
    swa_pattern: int = 0,
    attention_layers: tuple[int, ...] = (),
    **kw: object,
) -> LlmPreset:
    """A preset from config.json's numbers. `layers` counts every block of the file (next-token-prediction
    blocks too); `attention_layers` names the attention layers of a hybrid model, the rest are Mamba-2."""
    hd = head_dim or embd // heads
    swa_layers = tuple(swa_pattern > 0 and i % swa_pattern < swa_pattern - 1 for i in range(layers))
    extra: dict[str, object] = {k: kw.pop(k) for k in _SHAPE_KEYS if k in kw}
    if kw.get("qk_norm"):
        extra["qk_norm"] = True
    if kw.get("fused_qkv"):  # Phi-3's attn_qkv on every layer, and its gate and up in ffn_up
        extra["qkv_fused"] = (True,) * layers
        extra["ffn_joint"] = True
    hd_k = hd_v = hd
    n_kv: tuple[int, ...] = (kv_heads,) * layers
    mla = kw.get("mla")
    if isinstance(mla, MlaShape):  # the GGUF's view: one latent KV head of kv_lora_rank + rope, no V
        hd_k, hd_v, n_kv = mla.kv_lora_rank + mla.qk_rope, mla.kv_lora_rank, (1,) * layers
        dims = (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_rope, mla.qk_nope + mla.qk_rope)
        extra.update(mla=True, head_dim_v_mla=mla.v_head, mla_dims=dims)
    ssm = kw.get("ssm")
    if isinstance(ssm, SsmShape):
        recurrent = tuple(i not in attention_layers for i in range(layers))
        n_kv = tuple(0 if r else kv_heads for r in recurrent)
        extra.update(
            recurrent_layers=recurrent,
            n_embd_r=ssm.n_embd_r,
            n_embd_s=ssm.n_embd_s,
            ssm_dims=(ssm.d_conv, ssm.d_inner, ssm.d_state, ssm.n_group, ssm.n_head),
        )
    shape = LlmShape(
        arch,
        layers,
        embd,
        ff,
        heads,
        n_kv,
        hd_k,
        hd_v,
        vocab,
        ctx,
        swa,
        swa_layers if swa else (),
        causal=arch != "bert",
        ffn_gated=arch != "bert",  # BERT's FFN: up, GELU, down
        n_pos=positions(arch),
        **extra,  # type: ignore[arg-type]
    )
    return LlmPreset(name=name, shape=shape, **kw)  # type: ignore[arg-type]


_HF = "https://huggingface.co/"


def _gpt_oss(name: str, *, layers: int, n_expert: int) -> LlmPreset:
    """gpt-oss-20b and -120b differ only in depth and expert count (config.json of each)."""
    return llm_preset(
        name,
        "gpt-oss",
        layers=layers,
        embd=2880,
        ff=2880,
        heads=64,
        kv_heads=8,
        head_dim=64,
        vocab=201088,
        ctx=131072,
        swa=128,
        swa_pattern=2,
        n_expert=n_expert,
        n_expert_used=4,
        n_ff_exp=2880,
        family="llm",
        qkv_bias=True,
        attn_out_bias=True,
        sinks=True,
        post_attn_norm=True,
        expert_bias=True,
        default_quant="MXFP4_MOE",
        source=_HF + f"openai/{name}/blob/main/config.json",
    )


LLM_PRESETS: dict[str, LlmPreset] = {
    p.name: p
    for p in (
        llm_preset(
            "llama-3-8b",
            "llama",
            layers=32,
            embd=4096,
            ff=14336,
            heads=32,
            kv_heads=8,
            vocab=128256,
            ctx=8192,
            family="llm",
            source=_HF + "meta-llama/Meta-Llama-3-8B/blob/main/config.json",
        ),
        llm_preset(
            "llama-3-70b",
            "llama",
            layers=80,
            embd=8192,
            ff=28672,
            heads=64,
            kv_heads=8,
            vocab=128256,
            ctx=8192,
            family="llm",
            is_70b=True,
            source=_HF + "meta-llama/Meta-Llama-3-70B/blob/main/config.json",
        ),
        llm_preset(
            "qwen2-72b",
            "qwen2",
            layers=80,
            embd=8192,
            ff=29568,
            heads=64,
            kv_heads=8,
            vocab=152064,
            ctx=32768,
            family="llm",
            qkv_bias=True,
            is_70b=True,
            source=_HF + "Qwen/Qwen2-72B-Instruct/blob/main/config.json",
        ),
        llm_preset(
            "qwen2.5-7b",
            "qwen2",
            layers=28,
            embd=3584,
            ff=18944,
            heads=28,
            kv_heads=4,
            vocab=152064,
            ctx=32768,
            family="llm",
            qkv_bias=True,
            source=_HF + "Qwen/Qwen2.5-7B-Instruct/blob/main/config.json",
        ),
        llm_preset(
            "qwen2.5-coder-32b",
            "qwen2",
            layers=64,
            embd=5120,
            ff=27648,
            heads=40,
            kv_heads=8,
            vocab=152064,
            ctx=32768,
            family="llm",
            qkv_bias=True,
            source=_HF + "Qwen/Qwen2.5-Coder-32B-Instruct/blob/main/config.json",
        ),
        llm_preset(
            "phi-4",
            "phi3",
            layers=40,
            embd=5120,
            ff=17920,
            heads=40,
            kv_heads=10,
            vocab=100352,
            ctx=16384,
            family="llm",
            fused_qkv=True,
            source=_HF + "microsoft/phi-4/blob/main/config.json",
        ),
        # Gemma 3: 5 sliding-window layers (window 1024) then 1 global, llama.cpp set_swa_pattern(6).
        llm_preset(
            "gemma-3-27b",
            "gemma3",
            layers=62,
            embd=5376,
            ff=21504,
            heads=32,
            kv_heads=16,
            head_dim=128,
            vocab=262208,
            ctx=131072,
            swa=1024,
            swa_pattern=6,
            family="llm",
            tied_embeddings=True,
            gemma_norms=True,
            source=_HF + "google/gemma-3-27b-it/blob/main/config.json",
        ),
        llm_preset(
            "qwen2.5-vl-7b",
            "qwen2vl",
            layers=28,
            embd=3584,
            ff=18944,
            heads=28,
            kv_heads=4,
            vocab=152064,
            ctx=128000,
            family="llm",
            qkv_bias=True,
            vision=VisionShape(n_layer=32, n_embd=1280, n_ff=3420, n_head=16, patch=14, merge=2, out_embd=3584),
            source=_HF + "Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json",
        ),
        # bge-m3 is XLM-RoBERTa large: llama.cpp loads it as "bert" (no KV cache, non-causal).
        llm_preset(
            "bge-m3",
            "bert",
            layers=24,
            embd=1024,
            ff=4096,
            heads=16,
            kv_heads=16,
            vocab=250002,
            ctx=8192,
            family="embedding",
            default_quant="F16",
            source=_HF + "BAAI/bge-m3/blob/main/config.json",
        ),
        # --- The models people run on 64-128 GB unified-memory boxes in 2026 (config.json of each). ---
        # gpt-oss: alternating sliding-window (128) and full layers, sliding first (layer_types), llama.cpp
        # load_swa_pattern(2); attention sinks; experts published in MXFP4 (llama.cpp's MXFP4_MOE: experts
        # MXFP4, every other matrix Q8_0).
        _gpt_oss("gpt-oss-20b", layers=24, n_expert=32),
        _gpt_oss("gpt-oss-120b", layers=36, n_expert=128),
        llm_preset(
            "qwen3-30b-a3b",
            "qwen3moe",
            layers=48,
            embd=2048,
            ff=6144,
            heads=32,
            kv_heads=4,
            head_dim=128,
            vocab=151936,
            ctx=40960,
            n_expert=128,
            n_expert_used=8,
            n_ff_exp=768,
            family="llm",
            qk_norm=True,
            source=_HF + "Qwen/Qwen3-30B-A3B/blob/main/config.json",
        ),
        llm_preset(
            "qwen3-235b-a22b",
            "qwen3moe",
            layers=94,
            embd=4096,
            ff=12288,
            heads=64,
            kv_heads=4,
            head_dim=128,
            vocab=151936,
            ctx=40960,
            n_expert=128,
            n_expert_used=8,
            n_ff_exp=1536,
            family="llm",
            qk_norm=True,
            source=_HF + "Qwen/Qwen3-235B-A22B/blob/main/config.json",
        ),
        llm_preset(
            "qwen3-32b",
            "qwen3",
            layers=64,
            embd=5120,
            ff=25600,
            heads=64,
            kv_heads=8,
            head_dim=128,
            vocab=151936,
            ctx=40960,
            family="llm",
            qk_norm=True,
            source=_HF + "Qwen/Qwen3-32B/blob/main/config.json",
        ),
        # GLM-4.5-Air: 46 layers + 1 next-token-prediction layer (num_nextn_predict_layers), which llama.cpp
        # skips unless it drafts with it; layer 0 dense (first_k_dense_replace), one shared expert.
        llm_preset(
            "glm-4.5-air",
            "glm4moe",
            layers=47,
            embd=4096,
            ff=10944,
            heads=96,
            kv_heads=8,
            head_dim=128,
            vocab=151552,
            ctx=131072,
            n_expert=128,
            n_expert_used=8,
            n_ff_exp=1408,
            n_ff_shexp=1408,
            n_layer_dense_lead=1,
            n_layer_nextn=1,
            expert_weights_norm=True,  # norm_topk_prob
            expert_weights_scale=1.0,  # routed_scaling_factor
            family="llm",
            qkv_bias=True,
            post_attn_norm=True,
            exp_probs_b=True,
            source=_HF + "zai-org/GLM-4.5-Air/blob/main/config.json",
        ),
        # Llama 4 Scout: every layer MoE (16 experts, 1 used, 1 shared); chunked attention (8192) on 3 of 4
        # layers (llama.cpp: LLAMA_SWA_TYPE_CHUNKED, n_swa 8192, load_swa_pattern(4)).
        llm_preset(
            "llama-4-scout",
            "llama4",
            layers=48,
            embd=5120,
            ff=16384,
            heads=40,
            kv_heads=8,
            head_dim=128,
            vocab=202048,
            ctx=10485760,
            swa=8192,
            swa_pattern=4,
            n_expert=16,
            n_expert_used=1,
            n_ff_exp=8192,
            n_ff_shexp=8192,
            family="llm",
            source=_HF + "meta-llama/Llama-4-Scout-17B-16E-Instruct/blob/main/config.json",
        ),
        # Mixtral: llama.cpp loads it as "llama" with 8 experts of the full FFN width.
        llm_preset(
            "mixtral-8x7b",
            "llama",
            layers=32,
            embd=4096,
            ff=14336,
            heads=32,
            kv_heads=8,
            vocab=32000,
            ctx=32768,
            n_expert=8,
            n_expert_used=2,
            n_ff_exp=14336,
            family="llm",
            source=_HF + "mistralai/Mixtral-8x7B-Instruct-v0.1/blob/main/config.json",
        ),
        # DeepSeek-V2-Lite: MLA (kv_lora_rank 512, rope 64, no q LoRA), layer 0 dense, 64 experts (6 used) + 2
        # shared of 1408 each.
        llm_preset(
            "deepseek-v2-lite",
            "deepseek2",
            layers=27,
            embd=2048,
            ff=10944,
            heads=16,
            kv_heads=16,
            head_dim=192,
            vocab=102400,
            ctx=163840,
            n_expert=64,
            n_expert_used=6,
            n_ff_exp=1408,
            n_ff_shexp=2 * 1408,
            n_layer_dense_lead=1,
            family="llm",
            mla=MlaShape(q_lora_rank=0, kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head=128),
            source=_HF + "deepseek-ai/DeepSeek-V2-Lite-Chat/blob/main/config.json",
        ),
        # Granite 4.0 H Small: Mamba-2 mixers with attention at layers 5, 15, 25, 35 (layer_types); every
        # layer MoE (72 experts, 10 used) plus a shared expert of 8192; tied embeddings.
        llm_preset(
            "granite-4.0-h-small",
            "granitehybrid",
            layers=40,
            embd=4096,
            ff=768,
            heads=32,
            kv_heads=8,
            head_dim=128,
            vocab=100352,
            ctx=131072,
            attention_layers=(5, 15, 25, 35),
            n_expert=72,
            n_expert_used=10,
            n_ff_exp=768,
            n_ff_shexp=8192,
            family="llm",
            tied_embeddings=True,
            ssm=SsmShape(d_conv=4, d_inner=8192, d_state=128, n_group=1, n_head=128),
            no_rope=True,  # position_embedding_type "nope"
            source=_HF + "ibm-granite/granite-4.0-h-small/blob/main/config.json",
        ),
        llm_preset(
            "mistral-small-3.2-24b",
            "llama",
            layers=40,
            embd=5120,
            ff=32768,
            heads=32,
            kv_heads=8,
            head_dim=128,
            vocab=131072,
            ctx=131072,
            family="llm",
            source=_HF + "mistralai/Mistral-Small-3.2-24B-Instruct-2506/blob/main/config.json",
        ),
        llm_preset(
            "gemma-3-12b",
            "gemma3",
            layers=48,
            embd=3840,
            ff=15360,
            heads=16,
            kv_heads=8,
            head_dim=256,
            vocab=262208,
            ctx=131072,
            swa=1024,
            swa_pattern=6,
            family="llm",
            tied_embeddings=True,
            gemma_norms=True,
            source=_HF + "google/gemma-3-12b-it/blob/main/config.json",
        ),
    )
}

_MB = 1000**2
TORCH_PRESETS: dict[str, TorchPreset] = {
    p.name: p
    for p in (
        # SDXL base: UNet 2.567B, CLIP-L 123M + OpenCLIP-bigG 694M text encoders, VAE 83.65M.
        # Activations: diffusers peak at 1024x1024, batch 1 (8.96 GB bf16, 16.8 GB fp32) minus weights.
        TorchPreset(
            "sdxl",
            "diffusion",
            params=3_467_600_000,
            parts={"unet": 2_567_463_684, "text_encoders": 817_000_000, "vae": 83_653_863},
            activation_bytes={
                "fp16": 8960 * _MB - 6_935_200_000,
                "bf16": 8960 * _MB - 6_935_200_000,
                "fp32": 16800 * _MB - 13_870_400_000,
                "int8": 8960 * _MB - 6_935_200_000,
            },
            reference="1024x1024 image, batch 1",
            source=_HF + "stabilityai/stable-diffusion-xl-base-1.0 (docs/ESTIMATES.md: SDXL)",
        ),
        # Whisper large-v3: 1.55B parameters; openai-whisper fp16 measured 4.7 GB with beam 5 (large-v2,
        # same shape), faster-whisper int8 2.9 GB. Activation = measured - weights - runtime overhead.
        TorchPreset(
            "whisper-large-v3",
            "speech",
            params=1_543_490_560,
            parts={"encoder": 635_000_000, "decoder": 908_490_560},
            activation_bytes={
                "fp16": 4700 * _MB - 3_086_981_120 - 479_199_232,
                "bf16": 4700 * _MB - 3_086_981_120 - 479_199_232,
                "fp32": 2 * (4700 * _MB - 3_086_981_120 - 479_199_232),
                "int8": 2900 * _MB - 1_543_490_560 - 479_199_232,
            },
            reference="30 s window, beam 5, batch 1",
            source=_HF + "openai/whisper-large-v3/blob/main/config.json (docs/ESTIMATES.md: Whisper)",
            # whisper.cpp: decoder self-attention ctx 448, audio ctx 1500, 32+32 layers, width 1280.
            extra={"n_text_ctx": 448, "n_audio_ctx": 1500, "n_layer": 32, "n_state": 1280, "n_head": 20},
        ),
    )
}

ARCHS: tuple[str, ...] = tuple(sorted([*LLM_PRESETS, *TORCH_PRESETS]))


def family_of(arch: str) -> str:
    if arch in LLM_PRESETS:
        return LLM_PRESETS[arch].family
    return TORCH_PRESETS[arch].family
