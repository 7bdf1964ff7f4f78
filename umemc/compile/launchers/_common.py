"""Pieces the runtime modules share."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...budget.plan import ModelPlan
    from ...stack.resolved import ResolvedModel
    from . import Context


def model_flag(flag: str, rm: ResolvedModel) -> list[str]:
    """[flag, path] for the weights file; nothing when the stack names none (sized from an arch
    preset only): `umemc up` refuses such a worker in preflight unless it runs --simulate."""
    return [flag, str(rm.model_path)] if rm.model_path is not None else []


def placed(args: list[str], port: int | None, host: str) -> list[str]:
    """The args with `{port}` and `{host}` replaced by the worker's port and the address it binds."""
    return [a.replace("{port}", str(port)).replace("{host}", host) for a in args]


def llama_threads(m: ModelPlan, ctx: Context) -> int | None:
    """The CPU threads a llama.cpp worker is given: its share of the machine's cores by priority among the llama.cpp
    workers that run at once (the hot ones; a cold one as it joins them). Untold, llama.cpp takes a thread per core
    (OMP_NUM_THREADS does not reach its thread pool), and workers that each take every core slow one another down
    (bench/threads.py). None where the stack names no cores (`cpu_cores`, or its preset's): llama.cpp's own default
    then."""
    from ...catalog.runtimes import LLAMA_RUNTIMES

    cores = ctx.plan.platform.cpu_cores
    if not cores:
        return None
    llama = [x for x in ctx.plan.models.values() if x.model.spec.runtime in LLAMA_RUNTIMES and x.part_of is None]
    together = [x for x in llama if x.hot and x.name != m.name] + [m]
    share = cores * max(1, m.priority) / sum(max(1, x.priority) for x in together)
    return max(1, min(cores, round(share)))
