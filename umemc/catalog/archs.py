"""Built-in architecture presets: the tensor shapes of published models.

An estimate from a preset lays out every tensor the way llama.cpp's converter names and shapes it
(`gguf-py/gguf/tensor_mapping.py`), then applies llama.cpp's per-tensor quantization mix
(`quant.mix_types`), because a flat bits-per-weight average is up to 6% off (docs/ESTIMATES.md).
Shapes come from each model's published `config.json` (URL in `source`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Tensor = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class LlmShape:
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

    @property
    def n_gqa(self) -> int:
        return self.n_head // max(1, max(self.n_head_kv))


@dataclass(frozen=True)
class VisionShape:
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


@dataclass(frozen=True)
class LlmPreset:
    name: str
    family: str  # "llm" | "embedding"
    shape: LlmShape
    source: str
    tied_embeddings: bool = False
    qkv_bias: bool = False
    fused_qkv: bool = False  # phi3: one attn_qkv tensor, ffn_up holds gate and up
    gemma_norms: bool = False  # gemma2/3: q/k norms and post-attention/post-FFN norms
    is_70b: bool = False  # llama.cpp LLM_TYPE_70B: attn_v gets at least Q5_K
    default_quant: str = "Q4_K_M"
    vision: VisionShape | None = None

    def tensors(self) -> list[Tensor]:
        if self.shape.arch == "bert":
            return _bert_tensors(self.shape)
        s = self.shape
        out: list[Tensor] = [("token_embd.weight", (s.n_embd, s.n_vocab))]
        for i in range(s.n_layer):
            out += self._block(i)
        out.append(("output_norm.weight", (s.n_embd,)))
        if not self.tied_embeddings:
            out.append(("output.weight", (s.n_embd, s.n_vocab)))
        return out

    def _block(self, i: int) -> list[Tensor]:
        s, b = self.shape, f"blk.{i}."
        q, kv = s.n_head * s.head_dim_k, s.n_head_kv[i] * s.head_dim_k
        out: list[Tensor] = [(b + "attn_norm.weight", (s.n_embd,))]
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
        if self.gemma_norms:
            out += [
                (b + "attn_q_norm.weight", (s.head_dim_k,)),
                (b + "attn_k_norm.weight", (s.head_dim_k,)),
                (b + "post_attention_norm.weight", (s.n_embd,)),
            ]
        out.append((b + "ffn_norm.weight", (s.n_embd,)))
        if self.fused_qkv:
            out.append((b + "ffn_up.weight", (s.n_embd, 2 * s.n_ff)))
        else:
            out += [(b + "ffn_gate.weight", (s.n_embd, s.n_ff)), (b + "ffn_up.weight", (s.n_embd, s.n_ff))]
        out.append((b + "ffn_down.weight", (s.n_ff, s.n_embd)))
        if self.gemma_norms:
            out.append((b + "post_ffw_norm.weight", (s.n_embd,)))
        return out


def _bert_tensors(s: LlmShape) -> list[Tensor]:
    e, f = s.n_embd, s.n_ff
    out: list[Tensor] = [
        ("token_embd.weight", (e, s.n_vocab)),
        ("token_types.weight", (e, 1)),
        ("position_embd.weight", (e, s.n_ctx_train + 2)),
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


def _llm(
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
    **kw: object,
) -> LlmPreset:
    hd = head_dim or embd // heads
    swa_layers = tuple(swa_pattern > 0 and i % swa_pattern < swa_pattern - 1 for i in range(layers))
    shape = LlmShape(
        arch,
        layers,
        embd,
        ff,
        heads,
        (kv_heads,) * layers,
        hd,
        hd,
        vocab,
        ctx,
        swa,
        swa_layers if swa else (),
        causal=arch != "bert",
    )
    return LlmPreset(name=name, shape=shape, **kw)  # type: ignore[arg-type]


_HF = "https://huggingface.co/"
LLM_PRESETS: dict[str, LlmPreset] = {
    p.name: p
    for p in (
        _llm(
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
        _llm(
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
        _llm(
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
        _llm(
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
        _llm(
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
        _llm(
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
        _llm(
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
        _llm(
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
        _llm(
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
