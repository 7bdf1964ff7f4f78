"""The resolved stack, what every stage after load reads: the platform, each model, each node, the stack."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .load import Source
from .models import ModelSpec, Stack
from .presets import UNIFIED_KINDS

if TYPE_CHECKING:
    from ..catalog.hfdir import HfModel
    from ..lockfile import LockEntry


class ResolvedPlatform(NamedTuple):
    preset: str | None
    kind: str
    memory: int
    os_reserve: int
    gpu_window: int | None  # None on kind = cpu
    cpu_cores: int | None = None
    uma_carveout: int | None = None  # amd-apu: VRAM carved out of RAM by the BIOS (the GPU's besides its GTT)

    @property
    def unified(self) -> bool:
        return self.kind in UNIFIED_KINDS


class ResolvedModel(NamedTuple):
    name: str
    spec: ModelSpec
    family: str  # llm | embedding | speech | diffusion | torch | command
    quant: str | None  # canonical spelling, None where the file decides
    model_path: Path | None
    model_present: bool
    mmproj_path: Path | None
    mmproj_present: bool
    mmap: bool
    max_concurrency: int
    port: int
    chat_template_file: Path | None = None  # `chat_template` given as a Jinja file (a built-in name stays in spec)
    # vLLM/MLX: its Hugging Face directory as read once here (the downloaded one, else the sparse copy of it on the
    # Hub its headers sized); None for other runtimes, or where memory = … sizes a model the Hub could not
    engine: HfModel | None = None


@dataclass(frozen=True)
class LoadedStack:
    """The validated, resolved stack; frozen: the stages after load (budget, advice, compile) only read it, and a
    view of it (one node's, fewer models) is a new one."""

    path: Path
    source: Source
    stack: Stack
    platform: ResolvedPlatform
    models: dict[str, ResolvedModel]
    warnings: tuple[str, ...]
    calibration: dict[str, LockEntry] = field(default_factory=dict)  # <stack>.calibration.json, by model
    # a stack with [nodes]: each machine (file order); `platform` is then the first node's, and
    # for_node() gives the stack as seen on one of them (models resolved for its platform)
    nodes: dict[str, ResolvedNode] = field(default_factory=dict)
    fetched: tuple[str, ...] = ()  # models whose Hub header was read for this load
    # with [nodes]: every model resolved once per node kind (at load: a model resolves alike on every platform of a
    # kind, whatever its memory), so a node's view is a lookup, never a second validation
    by_kind: dict[str, dict[str, ResolvedModel]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.stack.name

    def for_node(self, node: str, models: list[str] | None = None) -> LoadedStack:
        """This stack on one node: its platform, and the named models (default all) as resolved for its kind."""
        n = self.nodes[node]
        resolved = self.by_kind[n.platform.kind]
        chosen = {name: resolved[name] for name in (list(self.models) if models is None else models)}
        return LoadedStack(self.path, self.source, self.stack, n.platform, chosen, (), self.calibration)


@dataclass(frozen=True)
class ResolvedNode:
    name: str
    platform: ResolvedPlatform
    labels: dict[str, str]
    gpu_devices: int | None = None  # pods that may hold its GPU at once (None: not counted)
    images: dict[str, str] = field(default_factory=dict)  # container image by runtime (--target kubernetes)
    address: str = "127.0.0.1"  # where the other nodes reach it (its RPC servers listen there)
    rpc_port: int = 50052  # the first port of its RPC servers
    gateway_port: int | None = None  # its gateway's port (None: the stack's gateway.port)
