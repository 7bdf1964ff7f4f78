"""Estimates for whisper.cpp, torch-family workers (diffusion, speech, embeddings) and opaque
`command` workers."""

from __future__ import annotations

from ..catalog.archs import LLM_PRESETS, TORCH_PRESETS, TorchPreset
from ..catalog.quant import BLOCK, TORCH_DTYPES, WHISPER_TYPES
from ..stack.resolved import LoadedStack, ResolvedModel
from .figures import Estimate, Figure
from .finish import finish
from .llm import F32
from .overhead import overhead_figure


def estimate_command(loaded: LoadedStack, m: ResolvedModel) -> Estimate:
    """Only `memory = …` tells the size: every component is unknown, the total is explicit."""
    none = Figure("unknown", 0, "not estimated: the size is given explicitly")
    return finish(loaded, m, "explicit", none, none, none, none, [], {"family": m.family})


def estimate_whisper_cpp(loaded: LoadedStack, m: ResolvedModel) -> Estimate:
    spec = m.spec
    preset = TORCH_PRESETS.get(spec.arch or "")
    gtype = WHISPER_TYPES[m.quant or "f16"]
    if m.model_present and m.model_path is not None and m.model_path.is_file():
        weights = Figure(
            "weights",
            m.model_path.stat().st_size,
            "size of the ggml model file (weights + vocab)",
            {"file": str(m.model_path)},
        )
        source = "gguf"
    elif preset is not None:
        block, size = BLOCK[gtype]
        weights = Figure(
            "weights",
            preset.params * size // block,
            "parameters x bytes per parameter of the type",
            {"parameters": preset.params, "type": m.quant or "f16"},
        )
        source = "arch"
    else:
        return estimate_command(loaded, m)
    dims = (preset or TORCH_PRESETS["whisper-large-v3"]).extra
    n_layer, n_state, n_head = dims["n_layer"], dims["n_state"], dims["n_head"]
    kv_cross = dims["n_audio_ctx"] * n_layer * n_state * 2 * 2
    kv_self = dims["n_text_ctx"] * n_layer * n_state * 2 * 2
    kv = Figure(
        "kv",
        kv_cross + kv_self,
        "cross: audio_ctx x layers x width x 2 (k,v) x 2 bytes + "
        "self: text_ctx x layers x width x 2 x 2 bytes (one decoder)",
        {"audio_ctx": dims["n_audio_ctx"], "text_ctx": dims["n_text_ctx"], "layers": n_layer, "width": n_state},
    )
    attn = 0 if spec.flash_attn else dims["n_audio_ctx"] ** 2 * n_head * F32
    enc = Figure(
        "encoder graph",
        attn + 8 * dims["n_audio_ctx"] * n_state * F32 + 2 * 3000 * n_state * F32,
        "audio_ctx² x heads x 4 (scores, without flash attention) + 8 activations of audio_ctx x "
        "width x 4 + conv 2 x 3000 x width x 4",
        {"flash_attn": spec.flash_attn},
    )
    compute = Figure.total("compute", [enc])
    overhead = overhead_figure(spec.runtime, loaded.platform.kind)
    return finish(loaded, m, source, weights, kv, compute, overhead, [], {"family": "speech", "type": m.quant})


def estimate_torch(loaded: LoadedStack, m: ResolvedModel) -> Estimate:
    spec = m.spec
    dtype = m.quant or "fp16"
    nbytes = TORCH_DTYPES[dtype]
    if spec.arch in LLM_PRESETS:
        weights, act = _torch_encoder(m, dtype)
    else:
        preset = TORCH_PRESETS[spec.arch or ""]
        weights = Figure(
            "weights",
            preset.params * nbytes,
            "parameters x bytes per parameter",
            {"parameters": preset.params, "dtype": dtype, **{f"{k} params": v for k, v in preset.parts.items()}},
        )
        act = _activation(preset, dtype, spec.image_size, spec.batch, spec.audio_seconds)
    kv = Figure("kv", 0, "no KV cache held between requests")
    overhead = overhead_figure(spec.runtime, loaded.platform.kind)
    warnings = []
    if m.family == "speech" and dtype == "int8":
        warnings.append(
            loaded.source.warning(
                ("models", m.name, "quant"),
                "speech model at int8: practitioners keep speech at 8 bits or more; check word error rate",
            )
        )
    return finish(
        loaded,
        m,
        "arch",
        weights,
        kv,
        Figure.total("compute", [act]),
        overhead,
        warnings,
        {"family": m.family, "dtype": dtype},
    )


def _activation(preset: TorchPreset, dtype: str, image_size: int, batch: int, audio_seconds: float) -> Figure:
    base = preset.activation_bytes[dtype]
    if preset.family == "diffusion":
        scale = (image_size / 1024) ** 2 * batch
        return Figure(
            "activations",
            int(base * scale),
            "peak activations at the reference workload x (image_size/1024)² x batch",
            {"reference": preset.reference, "reference bytes": base, "image_size": image_size, "batch": batch},
        )
    return Figure(
        "activations",
        base * batch,
        "peak activations at the reference workload x batch; whisper pads "
        "every window to 30 s, so longer audio is processed window by window",
        {"reference": preset.reference, "reference bytes": base, "batch": batch, "audio_seconds": audio_seconds},
    )


def _torch_encoder(m: ResolvedModel, dtype: str) -> tuple[Figure, Figure]:
    """An embedding model (e.g. bge-m3) under torch: parameters from the preset's tensors."""
    preset = LLM_PRESETS[m.spec.arch or ""]
    params = 0
    for _, shape in preset.tensors():
        n = 1
        for d in shape:
            n *= d
        params += n
    nbytes = TORCH_DTYPES[dtype]
    s = preset.shape
    weights = Figure(
        "weights",
        params * nbytes,
        "parameters (from the preset's tensor shapes) x bytes per parameter",
        {"parameters": params, "dtype": dtype},
    )
    tokens = m.spec.context * m.spec.batch
    scores = m.spec.batch * m.spec.context**2 * s.n_head * nbytes
    act = Figure(
        "activations",
        scores + 4 * tokens * s.n_ff * nbytes,
        "attention scores batch x context² x heads x dtype + 4 x tokens x n_ff x dtype",
        {"context": m.spec.context, "batch": m.spec.batch, "heads": s.n_head},
    )
    return weights, act


def apply_measured_peak(loaded: LoadedStack, m: ResolvedModel, est: Estimate) -> Estimate:
    """A torch worker calibrated by running its own warm-up: its measured peak replaces the estimate
    (the parts keep the estimated weights; the rest of the peak is activations). An explicit
    `memory` still wins, with a warning comparing the two."""
    from dataclasses import replace

    from ..units import human
    from . import keys

    entry = loaded.calibration.get(m.name)
    if entry is None or entry.measured is None or entry.measured.peak_bytes is None:
        return est
    at = ("models", m.name)
    changes = keys.changes(entry.flags, keys.torch(loaded, m))
    if changes:
        w = loaded.source.warning(at, "calibration ignored: " + ", ".join(changes), what="table")
        return replace(est, warnings=(*est.warnings, w))
    peak = entry.measured.peak_bytes
    if m.spec.memory is not None:
        w = loaded.source.warning(
            at + ("memory",), f"measured peak {human(peak)} (calibration) against memory = {human(m.spec.memory)}"
        )
        return replace(est, warnings=(*est.warnings, w))
    rest = max(0, peak - est.weights.bytes - est.overhead.bytes)
    compute = Figure(
        "compute",
        rest,
        "measured peak resident after the worker's warm-up minus weights and overhead (calibration)",
        {"peak": peak, "measured": entry.measured.at},
    )
    gpu = (
        est.gpu
        if loaded.platform.kind == "cpu"
        else Figure("gpu", est.weights.bytes + rest, "weights + measured activations")
    )
    return replace(
        est,
        source="measured",
        compute=compute,
        kv=Figure("kv", 0, "no KV cache held between requests"),
        gpu=gpu,
        explicit=None,
    )
