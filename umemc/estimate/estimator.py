"""Per-model memory estimates: every figure with the formula and inputs behind it."""

from __future__ import annotations

from ..catalog.runtimes import ENGINE_RUNTIMES, LLAMA_RUNTIMES
from ..stack.resolved import LoadedStack, ResolvedModel
from .figures import Estimate
from .llama import estimate_llama
from .other import apply_measured_peak, estimate_command, estimate_torch, estimate_whisper_cpp


def estimate_model(loaded: LoadedStack, model: ResolvedModel) -> Estimate:
    if model.spec.runtime in LLAMA_RUNTIMES:
        est = estimate_llama(loaded, model)
    elif model.spec.runtime in ENGINE_RUNTIMES and model.engine is not None:
        from .engines import estimate_engine

        est = estimate_engine(loaded, model)
    elif model.spec.runtime == "whisper-server":
        est = estimate_whisper_cpp(loaded, model)
    elif model.spec.runtime in ("torch", "comfyui") and model.spec.arch is not None:
        est = estimate_torch(loaded, model)
    else:
        est = estimate_command(loaded, model)
    if model.spec.runtime in ("torch", "comfyui"):
        est = apply_measured_peak(loaded, model, est)
    return est


def estimate_stack(loaded: LoadedStack) -> dict[str, Estimate]:
    return {name: estimate_model(loaded, m) for name, m in loaded.models.items()}
