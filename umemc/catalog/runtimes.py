"""The runtimes umemc can start, and what the stack language needs to know of each: the family of
models it serves, which family's models it may run, whether it is llama.cpp. How each is started
(its argv, health URL, pinned flags) is in umemc/compile/launchers/, one module per runtime; a test checks
that the two lists agree."""

from __future__ import annotations

# runtime -> the family of model it serves when no arch preset says otherwise
RUNTIME_FAMILY: dict[str, str] = {
    "llama-server": "llm",
    "llama-cpp-python": "llm",
    "vllm": "llm",
    "mlx": "llm",
    "whisper-server": "speech",
    "comfyui": "diffusion",
    "torch": "torch",
    "command": "command",
}
RUNTIMES: tuple[str, ...] = tuple(RUNTIME_FAMILY)

# family of a model (as its estimate found it) -> what it serves, as the gateway's /v1/models says it
KIND_OF_FAMILY: dict[str, str] = {
    "llm": "chat",
    "vision": "chat",
    "embedding": "embeddings",
    "speech": "audio",
    "diffusion": "image",
}
LLAMA_RUNTIMES = frozenset({"llama-server", "llama-cpp-python"})
# Engines that load a Hugging Face model directory (config.json + safetensors), sized from its files
ENGINE_RUNTIMES = frozenset({"vllm", "mlx"})
# the stack's kv_cache -> (vLLM's --kv-cache-dtype, bytes per element; None: the model's dtype)
VLLM_KV: dict[str, tuple[str, int | None]] = {"f16": ("auto", None), "bf16": ("auto", None), "q8_0": ("fp8", 1)}
# the stack's kv_cache -> (mlx-lm's --kv-bits, None: full precision)
MLX_KV: dict[str, int | None] = {"f16": None, "bf16": None, "q8_0": 8, "q4_0": 4}
# family of an arch preset -> the runtimes that can run it
RUNTIMES_FOR: dict[str, tuple[str, ...]] = {
    "llm": ("llama-server", "llama-cpp-python"),
    "embedding": ("llama-server", "llama-cpp-python", "torch"),
    "speech": ("whisper-server", "torch"),
    "diffusion": ("comfyui", "torch"),
}
# Sliding-window layers (Gemma 2/3, Cohere2): llama.cpp's library default is a full-size cache on every
# layer (llama_context_default_params: swa_full = true); llama-server passes swa_full = false (only the
# window is kept), llama-cpp-python's server has no setting for it and keeps the library default.
FULL_SWA_CACHE = frozenset({"llama-cpp-python"})
# How a runtime's argv turns off weight repacking on the CPU (llama-server: --no-repack / -nr);
# llama-cpp-python has no such setting.
NO_REPACK_FLAGS: dict[str, frozenset[str]] = {"llama-server": frozenset({"--no-repack", "-nr"})}
# Platform kinds whose GPU a Kubernetes pod gets from a device plugin, by its extended resource: each GPU
# model's pod holds one device (apple has no containers with Metal; cpu has no device)
GPU_RESOURCE: dict[str, str] = {
    "amd-apu": "amd.com/gpu",
    "nvidia-unified": "nvidia.com/gpu",
    "nvidia-discrete": "nvidia.com/gpu",
}
GPU_DEVICE_KINDS = frozenset(GPU_RESOURCE)


def holds_gpu_device(runtime: str, kind: str, gpu: bool | None = None) -> bool:
    """Whether a model's pod asks for the node's GPU device: wherever its memory is counted in the node's GPU window,
    which is unless its `gpu` key says false (a command worker too: one counted there and not given the GPU would
    be charged to a device another pod holds). `runtime` is every runtime's alike."""
    del runtime
    return kind in GPU_DEVICE_KINDS and gpu is not False


# Runtimes that cannot start without a weights file (their launcher modules say the same: NEEDS_MODEL_FILE)
NEEDS_MODEL_FILE = frozenset({"llama-server", "llama-cpp-python", "whisper-server", "vllm", "mlx"})
