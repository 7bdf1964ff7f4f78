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
    # llama-server: measured (`umemc calibrate`: resident after a warm-up request less its buffers) on CPU with the
    # llama.cpp the tests build: SmolLM2-135M 19.7 MiB (49,152 tokens of vocabulary), Gemma 3 270M 43.1 MiB
    # (262,144): the binary and its threads, and the tokenizer's vocabulary. A fixed part and a part per token
    # above both (LLAMA_SERVER_PER_TOKEN), where no measurement of the model is recorded; gguf-parser's flat
    # 150 MiB was 3.5 to 7.6 times the measured figure.
    "llama-server": 24 * MiB,
    "whisper-server": 150 * MiB,
    "llama-cpp-python": 100 * MiB,  # measured: 72 MiB resident beyond its buffers (umemc calibrate, 0.3.36)
    "torch": 450 * MiB,
    # vLLM 0.32's CPU backend: its API server, engine core and worker processes, each with torch, resident beyond the
    # weights, KV cache and activations (bench/engines.py: 2,431 MiB in all for SmolLM2-135M with 90 MiB of KV)
    "vllm": 2100 * MiB,
    # mlx-lm 0.32's server on MLX's CPU build: the interpreter, MLX, the tokenizer (bench/engines.py)
    "mlx": 150 * MiB,
    "comfyui": 600 * MiB,
}


LLAMA_SERVER_PER_TOKEN = 96  # bytes of llama-server's resident memory per vocabulary token (above)


def overhead_figure(runtime: str, kind: str, n_vocab: int = 0, prompt_cache: int = 0) -> Figure:
    base, ctx = PROCESS_BASE.get(runtime, 0), GPU_CONTEXT[kind]
    inputs: dict[str, object] = {"runtime": runtime}
    how = f"{runtime} process resident beyond its buffers"
    if runtime == "llama-server" and n_vocab:
        base += n_vocab * LLAMA_SERVER_PER_TOKEN
        inputs["vocabulary"] = n_vocab
        how += (
            f": {PROCESS_BASE[runtime] // MiB} MiB and {LLAMA_SERVER_PER_TOKEN} bytes per vocabulary token, a default "
            "(`umemc calibrate` measures this model's)"
        )
    parts = [Figure("process", base, how, inputs)]
    if prompt_cache:
        how_cache = (
            "mlx-lm's cache of finished requests' KV (prompt_cache: --prompt-cache-bytes)"
            if runtime == "mlx"
            else "llama-server's cache of prompts in host memory (prompt_cache: --cache-ram, filled as prompts come)"
        )
        parts.append(Figure("prompt cache", prompt_cache, how_cache, {"prompt_cache": prompt_cache}))
    if ctx:
        parts.append(Figure("gpu context", ctx, f"GPU driver context on {kind}", {"kind": kind}))
    return Figure.total("overhead", parts)
