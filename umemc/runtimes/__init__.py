"""How each runtime is started: one module per runtime, each pinning every memory-relevant flag so
the process allocates what the estimate assumed. Registered in RUNTIMES (pre-commit's
`languages/` pattern); the flag spelling of each runtime lives in its module only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..budget import ModelPlan, Plan
from . import comfyui, command, llama_cpp_python, llama_server, torch_worker, whisper_server


@dataclass(frozen=True)
class Context:
    plan: Plan
    python: str  # the interpreter umemc runs under: umemc's own programs and torch workers


class Runtime(Protocol):
    NAME: str
    HEALTH: str | None  # default health URL path; None: the port accepting connections
    FLAGS_MATCH: str  # the upstream version whose flag spelling argv() uses
    PINNED: tuple[str, ...]  # flags whose presence in `--help` preflight checks

    def argv(self, m: ModelPlan, ctx: Context) -> list[str]: ...


RUNTIMES: dict[str, Runtime] = {
    r.NAME: r for r in (llama_server, llama_cpp_python, whisper_server, comfyui, torch_worker, command)
}


def argv_for(m: ModelPlan, ctx: Context) -> list[str]:
    return RUNTIMES[m.model.spec.runtime].argv(m, ctx)


def health_path(m: ModelPlan) -> str | None:
    spec = m.model.spec
    return spec.health if spec.health is not None else RUNTIMES[spec.runtime].HEALTH
