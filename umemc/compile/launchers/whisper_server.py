"""whisper.cpp's whisper-server. Flag spelling as of whisper.cpp 1.7 (2025). Greedy decoding with
one decoder is pinned (`-bo 1 -bs 1`): the estimate sizes the self-attention cache for one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import model_flag

if TYPE_CHECKING:
    from ...budget.plan import ModelPlan
    from . import Context

NAME = "whisper-server"
HEALTH = "/health"
FLAGS_MATCH = "whisper.cpp 1.7"
NEEDS_MODEL_FILE = True  # cannot start without a weights file
REPORTS_BUFFERS = False  # its log states llama.cpp's buffer sizes (drift check)
HELP_MODULE: str | None = None  # `python -m MODULE --help` instead of `ARGV0 --help`
PINNED = ("--model", "--host", "--port", "--best-of", "--beam-size", "--flash-attn")


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    spec, rm = m.model.spec, m.model
    out = [spec.bin or "whisper-server", *model_flag("--model", rm), "--best-of", "1", "--beam-size", "1"]
    if spec.flash_attn:
        out.append("--flash-attn")
    return out + ["--host", ctx.host, "--port", str(rm.port), *spec.args]
