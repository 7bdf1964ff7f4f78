"""Estimates for the llama.cpp runtimes (llama-server, llama-cpp-python)."""
from __future__ import annotations

from ..stack.resolve import LoadedStack, ResolvedModel
from .archs import LLM_PRESETS, LlmShape, VisionShape
from .figures import Estimate, Figure
from .gguf_file import GgufFacts, NotGguf
from .gguf_file import read as read_gguf
from .llm import compute_figure, kv_figure, projector_from_preset, vision_compute_figure, weights_from_preset
from .finish import finish
from .overhead import overhead_figure
from .quant import FILE_TYPE_BITS

_WANTS = {"embedding": ("F16", "embedding models lose recall when quantized below F16"),
          "vision": ("Q8_0", "vision models lose accuracy below Q8 (practitioners saw ~15 mAP points at Q4)")}


def estimate_llama(loaded: LoadedStack, m: ResolvedModel) -> Estimate:
    spec, at = m.spec, ("models", m.name)
    warnings: list[str] = []
    facts = _read(loaded, m.model_path, at + ("model",)) if m.model_present else None
    preset = LLM_PRESETS.get(spec.arch or "")
    if facts is not None:
        if facts.shape is None:
            raise loaded.source.error(at + ("model",), f"GGUF has no {facts.general_arch}.block_count: "
                                      "not a language model", "a projector goes in mmproj")
        shape, source, ftype = facts.shape, "gguf", facts.file_type or "?"
        weights = Figure("weights", facts.tensor_bytes, "sum of tensor bytes in the GGUF header (exact)",
                         {"file": str(m.model_path), "tensors": facts.n_tensors, "file type": ftype,
                          "tensor types": ", ".join(f"{k}:{v}" for k, v in facts.type_counts.items())})
        if m.quant and facts.file_type and m.quant != facts.file_type:
            warnings.append(loaded.source.warning(at + ("quant",), f"quant = \"{m.quant}\" but the file is "
                                                  f"{facts.file_type}; the estimate uses the file"))
    elif preset is not None:
        shape, source, ftype = preset.shape, "arch", m.quant or preset.default_quant
        weights = weights_from_preset(preset, ftype)
    else:  # memory = … only, file absent: nothing to compute from
        return _explicit_only(loaded, m)
    vision = _vision(loaded, m, facts, preset)
    weights_parts = [weights] + ([vision[0]] if vision else [])
    kv = kv_figure(shape, spec.context, spec.parallel, spec.ubatch, spec.kv_cache)
    compute_parts = [compute_figure(shape, spec.context, spec.parallel, spec.ubatch, spec.flash_attn)]
    if vision:
        compute_parts.append(vision[1])
    overhead = overhead_figure(spec.runtime, loaded.platform.kind)
    family = "embedding" if not shape.causal else ("vision" if vision else "llm")
    warnings += _warnings(loaded, m, shape, ftype, family)
    return finish(loaded, m, source, Figure.total("weights", weights_parts), kv,
                   Figure.total("compute", compute_parts), overhead, warnings,
                   {"file type": ftype, "family": family, "n_ctx_train": shape.n_ctx_train})


def _read(loaded: LoadedStack, path: object, at: tuple[str, ...]) -> GgufFacts:
    try:
        return read_gguf(path)  # type: ignore[arg-type]
    except NotGguf as exc:
        raise loaded.source.error(at, str(exc)) from None


def _vision(loaded: LoadedStack, m: ResolvedModel, facts: GgufFacts | None, preset: object) -> tuple[Figure, Figure] | None:
    spec = m.spec
    vshape: VisionShape | None = getattr(preset, "vision", None)
    if m.mmproj_present:
        proj = _read(loaded, m.mmproj_path, ("models", m.name, "mmproj"))
        weights = Figure("projector", proj.tensor_bytes, "sum of tensor bytes in the mmproj GGUF header (exact)",
                         {"file": str(m.mmproj_path), "tensors": proj.n_tensors})
        vshape = proj.vision or vshape
    elif vshape is not None and (spec.mmproj is not None or preset is not None):
        weights = projector_from_preset(vshape, spec.arch or "")
    else:
        return None
    if vshape is None:
        return weights, Figure("projector compute", 0, "unknown encoder shape (no clip.vision keys)")
    return weights, vision_compute_figure(vshape, spec.image_size, spec.flash_attn)


def _warnings(loaded: LoadedStack, m: ResolvedModel, shape: LlmShape, ftype: str, family: str) -> list[str]:
    spec, at, src, out = m.spec, ("models", m.name), loaded.source, []
    want = _WANTS.get(family)
    if want and FILE_TYPE_BITS.get(ftype, 99) < FILE_TYPE_BITS[want[0]]:
        out.append(src.warning(at + ("quant",), f"{family} model quantized to {ftype}: {want[1]}; consider {want[0]}"))
    if spec.kv_cache not in ("f16", "f32", "bf16") and not spec.flash_attn:
        out.append(src.warning(at + ("kv_cache",), f"kv_cache = \"{spec.kv_cache}\" without flash attention: "
                               "llama.cpp refuses a quantized V cache unless flash_attn = true"))
    if shape.n_ctx_train and spec.context > shape.n_ctx_train:
        out.append(src.warning(at + ("context",), f"context {spec.context} is above the model's trained "
                               f"context {shape.n_ctx_train}: quality degrades without RoPE scaling"))
    if not shape.causal and spec.context > spec.ubatch:
        out.append(src.warning(at + ("ubatch",), f"embedding inputs must fit one ubatch: inputs longer than "
                               f"{spec.ubatch} tokens will be rejected (context is {spec.context})"))
    return out


def _explicit_only(loaded: LoadedStack, m: ResolvedModel) -> Estimate:
    from .other import estimate_command

    return estimate_command(loaded, m)
