"""A Python worker module (`runtime = "torch"`), run as `python -m MODULE`; it reads its port and
quota from the environment umemc sets (UMEMC_HOST, UMEMC_PORT, UMEMC_QUOTA_*); `{host}` and `{port}` in its
args are replaced too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import placed

if TYPE_CHECKING:
    from ...budget.plan import ModelPlan
    from . import Context

NAME = "torch"
HEALTH = "/health"
FLAGS_MATCH = "umemc worker protocol 1"
NEEDS_MODEL_FILE = False  # cannot start without a weights file
REPORTS_BUFFERS = False  # its log states llama.cpp's buffer sizes (drift check)
HELP_MODULE: str | None = None  # `python -m MODULE --help` instead of `ARGV0 --help`
PINNED: tuple[str, ...] = ()


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    spec = m.model.spec
    return [spec.bin or ctx.python, "-m", str(spec.module), *placed(spec.args, m.model.port, ctx.host)]
