"""How each runtime is started: one module per runtime, each pinning every memory-relevant flag so
the process allocates what the estimate assumed. Registered in RUNTIMES (pre-commit's
`languages/` pattern); the flag spelling of each runtime lives in its module only."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

from ...budget.plan import ModelPlan, Plan
from . import comfyui, command, llama_cpp_python, llama_server, mlx, torch_worker, vllm, whisper_server

if TYPE_CHECKING:
    from ...helptext import Help


class Context(NamedTuple):
    plan: Plan
    python: str  # the interpreter umemc runs under: umemc's own programs and torch workers
    host: str = "127.0.0.1"  # the address servers bind: loopback under supervisord, 0.0.0.0 in a pod
    local: bool = True  # the runtimes are the ones installed here (False: a container image's, the newest)

    def help_of(self, argv0: str, module: str | None = None) -> Help | None:
        """What the installed runtime says of itself (its --help and version; cached), so its argv is spelled
        for it; None where it is not installed here or not run here (the launcher spells for its newest)."""
        if not self.local:
            return None
        from ...helptext import probe

        return probe(argv0, module)


class Runtime(Protocol):
    NAME: str
    HEALTH: str | None  # default health URL path; None: the port accepting connections
    FLAGS_MATCH: str  # the upstream version whose flag spelling argv() uses
    PINNED: tuple[str, ...]  # flags whose presence in `--help` preflight checks
    NEEDS_MODEL_FILE: bool  # cannot start without a weights file
    REPORTS_BUFFERS: bool  # its log states llama.cpp's buffer sizes
    HELP_MODULE: str | None  # its --help is `python -m HELP_MODULE --help`

    def argv(self, m: ModelPlan, ctx: Context) -> list[str]: ...


RUNTIMES: dict[str, Runtime] = {
    r.NAME: r for r in (llama_server, llama_cpp_python, vllm, mlx, whisper_server, comfyui, torch_worker, command)
}


def argv_for(m: ModelPlan, ctx: Context) -> list[str]:
    return RUNTIMES[m.model.spec.runtime].argv(m, ctx)


def runtime_of(m: ModelPlan) -> Runtime:
    return RUNTIMES[m.model.spec.runtime]


def pinned_flags(m: ModelPlan, argv: list[str]) -> list[str]:
    """The flags of the worker's argv that its installed runtime's --help must list (preflight: a bundle spelled
    for one release and run with another is refused before it starts)."""
    module = runtime_of(m)
    spelled = getattr(module, "pinned", None)
    return spelled(argv, len(m.model.spec.args)) if spelled is not None else list(module.PINNED)


def dry_run_args(m: ModelPlan, argv: list[str]) -> list[str] | None:
    """What llama.cpp's dry run (umemc.estimate.dryrun) is given for this worker: the memory-relevant part of its
    compiled argv, in the runtime's own spelling; None for a runtime that is not llama.cpp."""
    module = {"llama-server": llama_server, "llama-cpp-python": llama_cpp_python}.get(m.model.spec.runtime)
    return None if module is None else module.dry_run_args(argv)


def help_argv(m: ModelPlan, argv: list[str]) -> list[str]:
    """How preflight asks the runtime for its --help (argv[0] is the runtime's executable)."""
    module = runtime_of(m).HELP_MODULE
    if m.model.spec.runtime == "comfyui":  # its main.py, from the checkout (the program's directory)
        return [*argv[:2], "--help"]
    return [*argv[:1], *(["-m", module] if module else []), "--help"]


def health_path(m: ModelPlan) -> str | None:
    spec = m.model.spec
    return spec.health if spec.health is not None else RUNTIMES[spec.runtime].HEALTH
