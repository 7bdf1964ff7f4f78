"""What umemc knows of each llama.cpp architecture beyond the GGUF keys every one shares: one record per
architecture (`ArchFacts`), the one place a per-architecture rule of the header reading
(umemc.estimate.gguf_file) and of the hand estimate's formulas (umemc.estimate.llm) lives. An architecture not
named here follows the generic rules, and `check` says so at the model's key. Whether its reserve graph is written
out is its recipe's (umemc.estimate.graphs.recipes): the graph, not a fact of the header.

Each rule's source in llama.cpp is named beside it (src/models/<arch>.cpp load_arch_hparams, src/llama-model.cpp);
the measured ones (logits_below, moe_extra, mixer_extra) are calibrations against llama.cpp's own buffer report
(bench/accuracy.py), said as such.
"""

from __future__ import annotations

from typing import NamedTuple


class ArchFacts(NamedTuple):
    # its KV cache (and recurrent state) follow llama.cpp's own rules here, and its compute graph is the generic
    # transformer's or written out: `check` says nothing of it
    modelled: bool = False
    # llama.cpp gives it no memory (llama_model::create_memory): no KV cache, attention over the batch
    encoder: bool = False
    # the sliding-window layout llama.cpp hard-codes when the file gives no pattern (load_swa_pattern(n,
    # dense_first)): layer i slides unless i % n == n - 1 (dense_first: unless i % n == 0); 0: none known
    window_period: int = 0
    window_dense_first: bool = False
    forced_window: int = 0  # a window llama.cpp imposes whatever the file says, unless it says 0
    window_depth: int = 0  # llama.cpp slides windows only in a model of this depth (0: any depth)
    rope_on_windows: bool = False  # RoPE on the sliding-window layers only: the others attend without positions
    mrope: str = ""  # four positions a token (M-RoPE): "always", or "sections" where the file has rope sections
    rope_switch: bool = False  # rope.scaling.finetuned = false turns RoPE off (Granite)
    # how its layers divide between attention and a recurrent mixer (llama_hparams::is_recr and the memory
    # filters): "recurrent" every layer recurs; "parallel" every layer attends and recurs side by side; "interval"
    # every interval-th layer attends (unless the file lists them); "ffn-only" a layer with an FFN width neither
    # attends nor recurs; "zero-kv" the recurrent layers are those with 0 KV heads; "shared-kv" later layers read
    # an earlier layer's cache (attention.shared_kv_layers)
    layers: str = ""
    interval: int = 0
    kv_from: int = 0  # layers from this one on read an earlier layer's cache (n_layer_kv_from_start)
    mixer: str = ""  # its recurrent mixer where the keys do not say it: "deltanet", "lightning"
    altup: bool = False  # Gemma 3n's altup streams and per-layer inputs, alive through every layer
    # n_embd-wide blocks the logits land above, measured at full size (with an f16 cache, a quantized one); 0, 0:
    # the dense rule
    logits_below: tuple[int, int] = (0, 0)
    moe_extra: int = 0  # n_embd-wide activations an MoE layer keeps beyond its experts' outputs (measured)
    mixer_extra: int = 0  # n_embd-wide activations a mixer layer keeps beside its own tensors (measured)
    gated_query: bool = False  # the query and an output gate in one projection, held through the attention


_MODELLED = ArchFacts(modelled=True)
_ENCODER = ArchFacts(modelled=True, encoder=True)

ARCH_FACTS: dict[str, ArchFacts] = {
    **{
        a: _MODELLED
        for a in (
            "llama", "mistral3", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "gemma", "command-r",
            "starcoder2",
        )
    },
    # DeepSeek V2/V3: its latent attention's output stays beside the experts (measured)
    "deepseek2": ArchFacts(modelled=True, logits_below=(10, 10), moe_extra=3),
    "qwen2vl": ArchFacts(modelled=True, mrope="always"),
    "qwen3vl": ArchFacts(modelled=True, mrope="always"),
    "qwen3vlmoe": ArchFacts(modelled=True, mrope="always"),
    "paddleocr": ArchFacts(mrope="always"),
    "qwen3tts": ArchFacts(mrope="always"),
    "glm4": ArchFacts(modelled=True, mrope="sections"),
    "glm4moe": ArchFacts(modelled=True, mrope="sections", logits_below=(4, 3)),
    "hunyuan-vl": ArchFacts(mrope="sections"),
    "bailingmoe3": ArchFacts(mrope="sections", layers="zero-kv"),
    "gemma2": ArchFacts(modelled=True, window_period=2),
    "gemma3": ArchFacts(modelled=True, window_period=6),
    "gemma3n": ArchFacts(window_period=5, kv_from=20, altup=True),
    "gemma4": ArchFacts(layers="shared-kv"),
    "cohere2": ArchFacts(modelled=True, window_period=4, rope_on_windows=True),  # src/models/cohere2.cpp
    "cohere2moe": ArchFacts(window_period=4, window_dense_first=True),
    "smallthinker": ArchFacts(window_period=4, window_dense_first=True),
    # EXAONE 4.0: windows in the 32B model (64 layers) only; the 1.2B attends to the whole context everywhere
    # (src/models/exaone4.cpp: swa_type set where n_layer is 64)
    "exaone4": ArchFacts(modelled=True, window_period=4, window_depth=64, rope_on_windows=True),
    "olmo2": ArchFacts(modelled=True, window_period=4),
    "gpt-oss": ArchFacts(modelled=True, window_period=2, logits_below=(5, 3), moe_extra=2),
    # Llama 4 attends in chunks of 8192 tokens on its chunked layers whatever the file says (unless it says 0)
    "llama4": ArchFacts(modelled=True, window_period=4, forced_window=8192, logits_below=(6, 3)),
    "granite": ArchFacts(modelled=True, rope_switch=True),
    "granitemoe": ArchFacts(modelled=True, rope_switch=True),
    "granitehybrid": ArchFacts(
        modelled=True, rope_switch=True, layers="zero-kv", logits_below=(4, 4), mixer_extra=4
    ),
    **{a: ArchFacts(layers="recurrent") for a in ("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")},
    "falcon-h1": ArchFacts(layers="parallel"),
    **{
        a: ArchFacts(layers="interval", interval=4, mixer="deltanet", mrope=mrope, gated_query=True)
        for a, mrope in (("qwen3next", ""), ("qwen35", "always"), ("qwen35moe", "always"), ("qwen4exp", "always"))
    },
    "minimax-01": ArchFacts(layers="interval", interval=8, mixer="lightning"),
    "nemotron_h": ArchFacts(layers="ffn-only"),
    "nemotron_h_moe": ArchFacts(layers="ffn-only"),
    **{a: ArchFacts(layers="zero-kv") for a in ("jamba", "lfm2", "lfm2moe", "plamo2", "kimi-linear", "kimi-k3")},
    "glm5-next": ArchFacts(layers="zero-kv"),
    **{a: _ENCODER for a in ("bert", "nomic-bert", "jina-bert-v2")},
    # no memory either, but their graphs' compute is not measured here: the encoder rules, said
    **{
        a: ArchFacts(encoder=True)
        for a in (
            "nomic-bert-moe", "jina-bert-v3", "neo-bert", "eurobert", "modern-bert", "dream", "llada", "llada-moe",
            "rnd1",
        )
    },
    "gemma-embedding": ArchFacts(modelled=True, encoder=True, window_period=6),
}  # fmt: skip
_NONE = ArchFacts()
MROPE_POSITIONS = 4  # GGML_MROPE_SECTIONS


def facts(arch: str) -> ArchFacts:
    """The record of an architecture; one with no rules of its own gets the generic record (nothing known)."""
    return ARCH_FACTS.get(arch, _NONE)


def layers_known(arch: str) -> bool:
    """Its KV cache and recurrent state follow llama.cpp's own per-architecture rules here, though its compute
    graph may not be modelled."""
    f = facts(arch)
    return bool(f.layers or f.kv_from)


def positions(arch: str, sections: list[int] | None = None) -> int:
    """Positions a token: four under M-RoPE (always for some architectures; for others where the file has rope
    sections, its first two non-zero: llama_hparams::use_mrope), else one."""
    mrope = facts(arch).mrope
    if mrope == "always":
        return MROPE_POSITIONS
    if mrope == "sections" and sections and len(sections) > 1 and int(sections[0]) > 0 and int(sections[1]) > 0:
        return MROPE_POSITIONS
    return 1
