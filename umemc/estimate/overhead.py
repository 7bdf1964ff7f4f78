"""Per-process runtime overhead: what a worker holds beyond its model buffers (interpreter,
libraries, driver context, allocator slack)."""

from __future__ import annotations

from ..units import MiB
from .figures import Figure

# GPU driver context per process: Ollama budgets 457 MiB for CUDA/ROCm and 512 MiB for Metal
# (docs/ESTIMATES.md, "Other model families"). No GPU on kind = cpu.
GPU_CONTEXT = {
    "amd-apu": 457 * MiB,
    "nvidia-unified": 457 * MiB,
    "nvidia-discrete": 457 * MiB,
    "apple": 512 * MiB,
    "cpu": 0,
}

# Process resident memory beyond the buffers, measured on CPU (bench/accuracy.py, RESULTS.md):
# the llama.cpp server binary with its libraries; llama-cpp-python adds the interpreter, numpy
# and its FastAPI server; a torch worker the interpreter plus torch's CPU libraries.
PROCESS_BASE = {
    "llama-server": 150 * MiB,  # gguf-parser's RAM overhead for llama.cpp (docs/ESTIMATES.md)
    "whisper-server": 150 * MiB,
    "llama-cpp-python": 100 * MiB,  # measured: 72 MiB resident beyond its buffers (umemc calibrate, 0.3.36)
    "torch": 450 * MiB,
    "comfyui": 600 * MiB,
}


def overhead_figure(runtime: str, kind: str) -> Figure:
    base, ctx = PROCESS_BASE.get(runtime, 0), GPU_CONTEXT[kind]
    parts = [Figure("process", base, f"{runtime} process resident beyond its buffers", {"runtime": runtime})]
    if ctx:
        parts.append(Figure("gpu context", ctx, f"GPU driver context on {kind}", {"kind": kind}))
    return Figure.total("overhead", parts)
