"""Any command (`runtime = "command"`): the argv as given, `{port}` replaced by the port and `{host}` by the
address to bind (loopback under supervisord, every address in a pod)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import placed

if TYPE_CHECKING:
    from ...budget.plan import ModelPlan
    from . import Context

NAME = "command"
HEALTH = None  # healthy when its port accepts connections (or just RUNNING without a port)
FLAGS_MATCH = "-"
NEEDS_MODEL_FILE = False  # cannot start without a weights file
REPORTS_BUFFERS = False  # its log states llama.cpp's buffer sizes (drift check)
HELP_MODULE: str | None = None  # `python -m MODULE --help` instead of `ARGV0 --help`
PINNED: tuple[str, ...] = ()


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    return placed(m.model.spec.command or [], m.model.port, ctx.host)
