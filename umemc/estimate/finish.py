"""The last step of every estimate: the GPU-window share and the explicit override."""

from __future__ import annotations

from ..stack.resolved import LoadedStack, ResolvedModel
from ..units import with_gib
from .figures import Estimate, Figure


def finish(
    loaded: LoadedStack,
    m: ResolvedModel,
    source: str,
    weights: Figure,
    kv: Figure,
    compute: Figure,
    overhead: Figure,
    warnings: list[str],
    facts: dict[str, object],
) -> Estimate:
    if loaded.platform.kind == "cpu":
        gpu = Figure("gpu", 0, 'kind = "cpu": nothing in a GPU window')
    else:
        how = "weights + kv + compute: " + _on_gpu(m.spec.runtime)
        gpu = Figure("gpu", weights.bytes + kv.bytes + compute.bytes, how)
    explicit = m.spec.memory
    if explicit is not None:
        source = "explicit"
        if weights.bytes > explicit:
            warnings = [
                *warnings,
                loaded.source.warning(
                    ("models", m.name, "memory"),
                    f"memory = {with_gib(explicit)} is below the weights alone ({with_gib(weights.bytes)}, from "
                    f"{_what(m)}): the worker would be killed at its hard quota while loading; remove memory to use "
                    "the estimate",
                ),
            ]
        if loaded.platform.kind != "cpu":
            gpu = Figure("gpu", explicit, "explicit memory, all of it assumed to be in the GPU window")
    if m.spec.gpu is False and loaded.platform.kind != "cpu":
        gpu = Figure("gpu", 0, "gpu = false: the worker uses no GPU, nothing in the GPU window")
    return Estimate(m.name, source, weights, kv, compute, overhead, gpu, explicit, facts, tuple(warnings))


def _what(m: ResolvedModel) -> str:
    return "the file's header" if m.model_present else f'arch = "{m.spec.arch}"'


# What puts the whole model in the GPU window, in each runtime's own terms.
_GPU_HOW = {
    "llama-server": "every layer offloaded (-ngl 999)",
    "llama-cpp-python": "every layer offloaded (--n_gpu_layers -1)",
    "whisper-server": "the encoder and decoder on the GPU (whisper.cpp's default)",
    "comfyui": "the diffusion model, text encoders and VAE in GPU memory (ComfyUI keeps them there within "
    "--reserve-vram)",
    "torch": "the module's parameters and activations on the GPU device",
}


def _on_gpu(runtime: str) -> str:
    return _GPU_HOW.get(runtime, "all of it on the GPU")
