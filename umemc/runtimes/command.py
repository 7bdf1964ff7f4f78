"""Any command (`runtime = "command"`): the argv as given, `{port}` replaced by the port."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..budget import ModelPlan
    from . import Context

NAME = "command"
HEALTH = None  # healthy when its port accepts connections (or just RUNNING without a port)
FLAGS_MATCH = "-"
PINNED: tuple[str, ...] = ()


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    port = str(m.model.port)
    return [part.replace("{port}", port) for part in (m.model.spec.command or [])]
