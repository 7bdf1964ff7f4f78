"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, extra [server]).
Flag spelling as of llama-cpp-python 0.3.x (settings fields as --snake_case options)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import model_flag

if TYPE_CHECKING:
    from ..budget import ModelPlan
    from . import Context

NAME = "llama-cpp-python"
HEALTH = "/v1/models"  # the server has no /health
FLAGS_MATCH = "llama-cpp-python 0.3.x"
NEEDS_MODEL_FILE = True  # cannot start without a weights file
REPORTS_BUFFERS = True  # its log states llama.cpp's buffer sizes (drift check)
HELP_MODULE: str | None = "llama_cpp.server"  # `python -m MODULE --help` instead of `ARGV0 --help`
PINNED = (
    "--model",
    "--n_ctx",
    "--n_ubatch",
    "--n_batch",
    "--flash_attn",
    "--type_k",
    "--type_v",
    "--use_mmap",
    "--use_mlock",
    "--n_gpu_layers",
    "--logits_all",
    "--host",
    "--port",
)
# ggml type ids (ggml.h enum ggml_type) that --type_k/--type_v take.
GGML_TYPE_ID = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}


def _bool(value: bool) -> str:
    return "true" if value else "false"


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    spec, rm = m.model.spec, m.model
    kv = str(GGML_TYPE_ID[spec.kv_cache])
    out = [
        spec.bin or ctx.python,
        "-m",
        "llama_cpp.server",
        *model_flag("--model", rm),
        "--n_ctx",
        str(spec.context),
        "--n_ubatch",
        str(spec.ubatch),
        "--n_batch",
        str(spec.ubatch),
        "--flash_attn",
        _bool(spec.flash_attn),
        "--type_k",
        kv,
        "--type_v",
        kv,
        "--use_mmap",
        _bool(rm.mmap),
        "--use_mlock",
        _bool(spec.mlock),
        "--n_gpu_layers",
        "0" if ctx.plan.platform.kind == "cpu" else "-1",
        # the server defaults to logits_all = true: it keeps n_vocab x 4 bytes of logits for every
        # token of the context (+265 MiB per 1000 tokens at a 32k vocabulary, measured); off, the
        # process holds what llama.cpp's buffers say
        "--logits_all",
        "false",
    ]
    if m.estimate.facts.get("family") == "embedding":
        out += ["--embedding", "true"]
    return out + ["--host", ctx.host, "--port", str(rm.port), *spec.args]


def dry_run_args(argv: list[str]) -> list[str]:
    """The server's own arguments (after `-m llama_cpp.server`): umemc.dryrun's helper parses them with the
    server's own settings parser, so the dry run builds the model the server would."""
    i = argv.index("llama_cpp.server") if "llama_cpp.server" in argv else 0
    return argv[i + 1 :]
