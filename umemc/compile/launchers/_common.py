"""Pieces the runtime modules share."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...stack.resolve import ResolvedModel


def model_flag(flag: str, rm: ResolvedModel) -> list[str]:
    """[flag, path] for the weights file; nothing when the stack names none (sized from an arch
    preset only): `umemc up` refuses such a worker in preflight unless it runs --simulate."""
    return [flag, str(rm.model_path)] if rm.model_path is not None else []


def placed(args: list[str], port: int | None, host: str) -> list[str]:
    """The args with `{port}` and `{host}` replaced by the worker's port and the address it binds."""
    return [a.replace("{port}", str(port)).replace("{host}", host) for a in args]
