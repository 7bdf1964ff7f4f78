"""mlx-lm's OpenAI-compatible server (`python -m mlx_lm.server`; `bin` is the interpreter of MLX's environment).

mlx-lm has no context limit of its own: a sequence's cache grows as it goes. umemc pins what bounds the rest: the
sequences decoded at once (--decode-concurrency = parallel) and prefilled at once, the tokens of one prefill step
(--prefill-step-size = ubatch, which sizes its activations) and its cache of finished requests (--prompt-cache-bytes
= prompt_cache; with 0 none is kept). The hard quota holds a request longer than `context`. Spelled as mlx-lm
0.28-0.32's --help spells them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...budget.plan import ModelPlan
    from . import Context

NAME = "mlx"
HEALTH = "/health"
FLAGS_MATCH = "mlx-lm 0.32"
NEEDS_MODEL_FILE = True  # cannot start without its model directory
REPORTS_BUFFERS = False  # its log states llama.cpp's buffer sizes (drift check)
HELP_MODULE: str | None = "mlx_lm.server"  # `python -m MODULE --help` instead of `ARGV0 --help`
PINNED = (
    "--model",
    "--host",
    "--port",
    "--decode-concurrency",
    "--prompt-concurrency",
    "--prefill-step-size",
    "--prompt-cache-size",
    "--prompt-cache-bytes",
)
MODULE = "mlx_lm.server"


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    from ...catalog.runtimes import MLX_KV

    spec, rm = m.model.spec, m.model
    out = [
        spec.bin or "python3",
        "-m",
        MODULE,
        "--model",
        str(rm.model_path),
        "--host",
        ctx.host,
        "--port",
        str(rm.port),
        "--decode-concurrency",
        str(spec.parallel),
        "--prompt-concurrency",
        str(spec.parallel),
        "--prefill-step-size",
        str(spec.ubatch),
        "--prompt-cache-size",
        "10" if spec.prompt_cache else "0",
        "--prompt-cache-bytes",
        str(spec.prompt_cache),
    ]
    bits = MLX_KV[spec.kv_cache]
    if bits is not None:  # a quantized cache: mlx-lm then serves one request at a time
        out += ["--kv-bits", str(bits)]
    return out + list(spec.args)
