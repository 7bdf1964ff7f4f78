"""The runtimes umemc can start, and what the stack language needs to know of each: the family of
models it serves, which family's models it may run, whether it is llama.cpp. How each is started
(its argv, health URL, pinned flags) is in umemc/launchers/, one module per runtime; a test checks
that the two lists agree."""

from __future__ import annotations

# runtime -> the family of model it serves when no arch preset says otherwise
RUNTIME_FAMILY: dict[str, str] = {
    "llama-server": "llm",
    "llama-cpp-python": "llm",
    "whisper-server": "speech",
    "comfyui": "diffusion",
    "torch": "torch",
    "command": "command",
}
RUNTIMES: tuple[str, ...] = tuple(RUNTIME_FAMILY)
LLAMA_RUNTIMES = frozenset({"llama-server", "llama-cpp-python"})
# family of an arch preset -> the runtimes that can run it
RUNTIMES_FOR: dict[str, tuple[str, ...]] = {
    "llm": ("llama-server", "llama-cpp-python"),
    "embedding": ("llama-server", "llama-cpp-python", "torch"),
    "speech": ("whisper-server", "torch"),
    "diffusion": ("comfyui", "torch"),
}
