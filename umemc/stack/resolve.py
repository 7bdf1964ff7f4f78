"""Checks that span several keys, and the defaults that depend on other keys (platform presets,
mmap by platform, ports, quant names). Produces the LoadedStack every later stage reads."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..catalog.archs import LLM_PRESETS, TORCH_PRESETS, family_of
from ..catalog.quant import FILE_TYPES, TORCH_DTYPES, WHISPER_TYPES
from ..catalog.runtimes import ENGINE_RUNTIMES, GPU_DEVICE_KINDS, LLAMA_RUNTIMES, RUNTIME_FAMILY, RUNTIMES_FOR
from ..units import human
from . import engine_keys
from .cross_checks import (
    DNS_SUBDOMAIN,
    HOSTNAME,
    assign_ports,
    check_aliases,
    check_env,
    check_gateway,
    check_min_quant,
    check_names,
    check_placement_keys,
    check_policy,
    check_runtime_keys,
    check_size_source,
    check_sysctl,
    decimal_memory,
    doc_token_env,
    is_ip,
    label_problem,
)
from .load import Document, Source, close_matches, read_document, validate
from .locate import ask_hub, hub_files, hub_note, model_file, stack_path, template_file
from .models import NAME_PATTERN, ModelSpec, Platform, Stack
from .presets import PLATFORM_PRESETS, UNIFIED_KINDS, default_gpu_window, default_os_reserve
from .resolved import LoadedStack, ResolvedModel, ResolvedNode, ResolvedPlatform
from .types import toml_repr

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..hub.ref import HfRef
    from ..lockfile import LockEntry


def load_stack(
    path: Path,
    shown: str | None = None,
    locks: dict[str, LockEntry] | None = None,
    hub: Callable[[HfRef], LockEntry] | None = None,
) -> LoadedStack:
    """The whole load stage: read, parse, validate, check, resolve. `locks`: the stack's lock entries when the
    caller holds newer ones than its file (llama.cpp's answers it could not write). `hub`: how to size a
    model named on the Hub (`hf`) that is neither on disk nor in the lock (umemc.estimate.hub_header.lock_entry,
    which reads its header over the network); without it such a model is sized as if the Hub were unreachable."""
    from .. import lockfile

    doc = read_document(path, shown)
    stack = validate(doc)
    src = doc.source
    locks = dict(lockfile.load(path) if locks is None else locks)
    check_names(stack, src)
    nodes = _nodes(stack, doc)
    if nodes:
        platform = next(iter(nodes.values())).platform
    elif stack.platform is None:
        raise src.error(
            ("platform",),
            "required key is missing",
            "describe the machine in [platform] (a preset, or kind + memory), or several in [nodes.NAME]",
            what="table",
        )
    else:
        platform = _platform(stack.platform, src, ("platform",))
        doc.warnings += decimal_memory(doc.data.get("platform"), platform, src, ("platform",))
    check_placement_keys(stack, src, nodes)
    check_policy(stack, src)
    check_gateway(stack, src)
    check_sysctl(stack, src)
    ports = assign_ports(stack, src)
    check_aliases(stack, src)
    fetched, unasked = ask_hub(doc, stack, locks, hub)
    models = {
        name: _model(doc, name, spec, platform, ports[name], locks.get(name), stack.models_dir, unasked.get(name))
        for name, spec in stack.models.items()
    }
    by_kind = {platform.kind: models} if nodes else {}
    for node in nodes.values():
        kind = node.platform.kind
        if kind not in by_kind:  # what load already said is not said again per kind
            quiet = replace(doc, warnings=[])
            by_kind[kind] = {
                name: _model(quiet, name, spec, node.platform, ports[name], locks.get(name), stack.models_dir)
                for name, spec in stack.models.items()
            }
    return LoadedStack(path, src, stack, platform, models, tuple(doc.warnings), locks, nodes, tuple(fetched), by_kind)


def _nodes(stack: Stack, doc: Document) -> dict[str, ResolvedNode]:
    src, out = doc.source, {}
    if stack.nodes and stack.platform is not None:
        raise src.error(
            ("platform",),
            "a stack with [nodes] describes its machines there",
            "move [platform]'s keys into the [nodes.NAME] tables, or remove [nodes]",
            what="table",
        )
    raw_nodes = doc.data.get("nodes")
    raw: dict[str, Any] = raw_nodes if isinstance(raw_nodes, dict) else {}
    for name, node in stack.nodes.items():
        at = ("nodes", name)
        if not re.fullmatch(NAME_PATTERN, name):
            raise src.error(at, f"bad node name {toml_repr(name)}: must match {NAME_PATTERN}", what="key")
        platform = _platform(node, src, at)
        doc.warnings += decimal_memory(raw.get(name), platform, src, at)
        for key, value in node.labels.items():
            problem = label_problem(key, value)
            if problem:
                raise src.error(at + ("labels", key), problem, "Kubernetes label syntax: [prefix/]name = value")
        if not node.labels and not DNS_SUBDOMAIN.fullmatch(name):
            raise src.error(
                at,
                f"a node without labels is found by its hostname (kubernetes.io/hostname = {toml_repr(name)}), "
                "and a hostname cannot contain '_'",
                f'name the node as its hostname, or give labels = {{ "umemc.io/node" = "{name.replace("_", "-")}" }}',
                what="table",
            )
        devices = node.gpu_devices
        if devices is None and platform.kind in GPU_DEVICE_KINDS:
            devices = 1
        for runtime in node.images:
            if runtime not in RUNTIME_FAMILY:
                raise src.error(
                    at + ("images", runtime),
                    f"unknown runtime {toml_repr(runtime)}",
                    f"one of {', '.join(RUNTIME_FAMILY)}",
                    what="key",
                )
        gpu = None if platform.kind == "apple" else devices
        address = "127.0.0.1" if node.address is None else node.address
        if not (is_ip(address) or HOSTNAME.fullmatch(address)):
            raise src.error(
                at + ("address",),
                f"bad address {toml_repr(address)}: not an IP address or a host name",
                'e.g. address = "10.0.0.2"',
            )
        if is_ip(address) and ipaddress.ip_address(address).is_unspecified:
            raise src.error(
                at + ("address",),
                f"{toml_repr(address)} is no address another node can reach (it means any of this node's)",
                "give the address the other nodes reach this node at, e.g. 10.0.0.2",
            )
        out[name] = ResolvedNode(
            name, platform, dict(node.labels), gpu, dict(node.images), address, node.rpc_port, node.gateway_port
        )
    return out


def _platform(p: Platform, src: Source, at: tuple[str, ...]) -> ResolvedPlatform:
    preset = PLATFORM_PRESETS[p.preset] if p.preset else None
    kind = p.kind or (preset.kind if preset else None)
    memory = p.memory if p.memory is not None else (preset.memory if preset else None)
    if kind is None or memory is None:
        missing = "kind" if kind is None else "memory"
        raise src.error(
            at + (missing,),
            "required key is missing (no preset given)",
            f"set preset = one of {', '.join(PLATFORM_PRESETS)}, or give kind and memory",
            what="table",
        )
    if memory <= 0:
        raise src.error(at + ("memory",), "must be > 0")
    os_reserve = (
        p.os_reserve if p.os_reserve is not None else (preset.os_reserve if preset else default_os_reserve(memory))
    )
    if os_reserve >= memory:
        raise src.error(at + ("os_reserve",), f"must be less than memory ({human(os_reserve)} >= {human(memory)})")
    same_machine = preset is not None and preset.kind == kind and preset.memory == memory
    window = p.gpu_window if p.gpu_window is not None else (preset.gpu_window if preset and same_machine else None)
    if kind == "cpu":
        if p.gpu_window is not None:
            raise src.error(at + ("gpu_window",), 'not used for kind = "cpu"', "remove it")
        window = None
    elif window is None:
        window = default_gpu_window(kind, memory, os_reserve)
        if window is None:
            raise src.error(
                at + ("gpu_window",),
                f'required key is missing for kind = "{kind}"',
                _WINDOW_HINT[kind],
                what="table",
            )
    if window is not None and window <= 0:
        raise src.error(at + ("gpu_window",), "must be > 0")
    if window is not None and kind in UNIFIED_KINDS and window > memory:
        raise src.error(
            at + ("gpu_window",),
            f"larger than memory ({human(window)} > {human(memory)})",
            "on a unified-memory machine the GPU maps system RAM",
        )
    cores = p.cpu_cores if p.cpu_cores is not None else (preset.cpu_cores if preset else None)
    carve = p.uma_carveout
    if carve is not None and kind != "amd-apu":
        raise src.error(at + ("uma_carveout",), f'a BIOS carve-out of an AMD APU: not used for kind = "{kind}"')
    if carve is not None and carve + os_reserve >= memory:
        raise src.error(
            at + ("uma_carveout",),
            f"leaves nothing to the OS: {human(carve)} carved out + {human(os_reserve)} os_reserve >= "
            f"{human(memory)} of memory",
        )
    if carve is not None and window is not None and window + carve > memory:
        raise src.error(
            at + ("gpu_window",),
            f"the GTT maps the RAM the carve-out leaves: at most {human(memory - carve)} here (memory - uma_carveout)",
        )
    return ResolvedPlatform(p.preset, kind, memory, os_reserve, window, cores, carve or None)


_WINDOW_HINT = {
    "amd-apu": 'the GTT limit the kernel allows (ttm.pages_limit x 4 KiB), e.g. "112GiB"',
    "apple": 'the Metal wired limit (iogpu.wired_limit_mb), e.g. "107.5GiB"',
    "nvidia-discrete": 'the card\'s VRAM, e.g. "24GiB"',
}


def _model(
    doc: Document,
    name: str,
    spec: ModelSpec,
    platform: ResolvedPlatform,
    port: int,
    lock: LockEntry | None,
    models_dir: str,
    hub_problem: str | None = None,
) -> ResolvedModel:
    src, at = doc.source, ("models", name)
    check_env(spec, src, at, doc_token_env(doc))
    check_runtime_keys(spec, src, at)
    if spec.runtime in ENGINE_RUNTIMES:
        engine_keys.check_keys(spec, src, at)
    (model_value, model_at), (mmproj_value, mmproj_at) = hub_files(spec, src, at, models_dir)
    family = family_of(spec.arch) if spec.arch else RUNTIME_FAMILY[spec.runtime]
    if spec.arch and spec.runtime != "command" and spec.runtime not in RUNTIMES_FOR[family]:
        raise src.error(
            at + ("arch",),
            f'{spec.arch} ({family}) cannot run on runtime = "{spec.runtime}"',
            f"use runtime = {' or '.join(toml_repr(r) for r in RUNTIMES_FOR[family])}",
        )
    quant = _quant(spec, src, at)
    check_min_quant(spec, src, at)
    locked = lock is not None and lock.header is not None and spec.runtime in LLAMA_RUNTIMES
    sized_from: Path | None = None
    model_path: Path | None
    on_hub = spec.runtime in ENGINE_RUNTIMES and spec.hf is not None
    if on_hub and model_value is not None and not stack_path(doc, model_value).exists():
        model_path, model_present = stack_path(doc, model_value), False
        sized_from = engine_keys.on_hub(doc, spec, model_at, model_path)
    else:
        model_path, model_present = model_file(
            doc,
            model_value,
            model_at,
            spec,
            llama=spec.runtime in LLAMA_RUNTIMES,
            locked=locked,
            hub=hub_note(lock, hub_problem) if spec.hf and spec.runtime in LLAMA_RUNTIMES else None,
        )
    mmproj_path, mmproj_present = model_file(doc, mmproj_value, mmproj_at, spec, llama=True, is_mmproj=True)
    engine_dir = model_path if model_present else sized_from
    engine = None
    if spec.runtime in ENGINE_RUNTIMES and engine_dir is not None:
        engine = engine_keys.check_dir(spec, src, at, model_at, engine_dir)
    check_size_source(spec, src, at, model_present=model_present or locked or engine is not None)
    mmap = spec.mmap if spec.mmap is not None else not platform.unified
    return ResolvedModel(
        name,
        spec,
        family,
        quant,
        model_path,
        model_present,
        mmproj_path,
        mmproj_present,
        mmap,
        spec.max_concurrency or spec.parallel,
        port,
        template_file(doc, spec, at),
        engine,
    )


def _quant(spec: ModelSpec, src: Source, at: tuple[str, ...]) -> str | None:
    if spec.quant is None:
        if spec.arch in LLM_PRESETS and spec.runtime in LLAMA_RUNTIMES:
            return None  # the file's own type, else the preset default (estimate decides)
        if spec.arch is not None and spec.arch in TORCH_PRESETS:
            return TORCH_PRESETS[spec.arch].default_quant if spec.runtime != "whisper-server" else "f16"
        return None
    names: tuple[str, ...]
    if spec.runtime in LLAMA_RUNTIMES:
        names, what = tuple(FILE_TYPES), "GGUF file type"
    elif spec.runtime == "whisper-server":
        names, what = tuple(WHISPER_TYPES), "whisper.cpp model type"
    elif spec.runtime in ("torch", "comfyui"):
        names, what = tuple(TORCH_DTYPES), "torch dtype"
    else:
        return spec.quant
    for n in names:
        if n.lower() == spec.quant.lower():
            return n
    close = close_matches(spec.quant.upper() if names[0].isupper() else spec.quant.lower(), names)
    hint = f"did you mean '{close[0]}'?" if close else f"one of {', '.join(names)}"
    raise src.error(at + ("quant",), f'unknown {what} {toml_repr(spec.quant)} for runtime = "{spec.runtime}"', hint)
