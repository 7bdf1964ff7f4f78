"""Checks that span several keys, and the defaults that depend on other keys (platform presets,
mmap by platform, ports, quant names). Produces the LoadedStack every later stage reads."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..catalog.archs import LLM_PRESETS, TORCH_PRESETS, family_of
from ..catalog.gguf import is_gguf
from ..catalog.quant import FILE_TYPES, TORCH_DTYPES, WHISPER_TYPES
from ..catalog.runtimes import ENGINE_RUNTIMES, GPU_DEVICE_KINDS, LLAMA_RUNTIMES, RUNTIME_FAMILY, RUNTIMES_FOR
from ..chars import CONTROL, kube_name
from ..names import OWN_PROGRAMS
from ..units import gib, human
from . import engine_keys
from .load import Document, Source, close_matches, read_document, validate
from .models import NAME_PATTERN, ModelSpec, Platform, Stack
from .presets import PLATFORM_PRESETS, UNIFIED_KINDS, default_gpu_window, default_os_reserve
from .types import toml_repr

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..catalog.hfdir import HfModel
    from ..hub.ref import HfRef
    from ..lockfile import LockEntry

FIRST_PORT = 10001
MAX_PORT = 65535
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SYSCTL_KEY = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_-]+)+$")


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
    _check_names(stack, src)
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
        doc.warnings += _decimal_memory(doc.data.get("platform"), platform, src, ("platform",))
    _check_placement_keys(stack, src, nodes)
    _check_policy(stack, src)
    _check_gateway(stack, src)
    _check_sysctl(stack, src)
    ports = _ports(stack, src)
    _check_aliases(stack, src)
    fetched, unasked = _ask_hub(doc, stack, locks, hub)
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


def _ask_hub(
    doc: Document, stack: Stack, locks: dict[str, LockEntry], hub: Callable[[HfRef], LockEntry] | None
) -> tuple[list[str], dict[str, str]]:
    """Lock entries for the Hub models that are not on disk and not (or no longer) in the lock, read from the
    Hub into `locks`; returns the models read, and why the Hub was not asked or could not answer, by model."""
    from ..hub.ref import HubFailure, RefError, matches, parse

    fetched: list[str] = []
    unasked: dict[str, str] = {}
    for name, spec in stack.models.items():
        if spec.hf is None or spec.runtime not in LLAMA_RUNTIMES:
            continue
        try:
            ref = parse(spec.hf, spec.hf_revision)
        except RefError:
            continue  # _model says what is wrong with it
        if _local(doc, spec.model or str(ref.local_path(stack.models_dir))).exists():
            continue
        entry = locks.get(name)
        if entry is not None and entry.header is not None and matches(entry.hub, ref):
            continue
        if hub is None:
            unasked[name] = "the Hub was not asked"
            continue
        try:
            locks[name] = hub(ref)
        except HubFailure as exc:
            unasked[name] = str(exc)
            continue
        fetched.append(name)
    return fetched, unasked


def _local(doc: Document, value: str) -> Path:
    return (doc.path.parent / value).resolve() if not Path(value).is_absolute() else Path(value)


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
        doc.warnings += _decimal_memory(raw.get(name), platform, src, at)
        for key, value in node.labels.items():
            problem = label_problem(key, value)
            if problem:
                raise src.error(at + ("labels", key), problem, "Kubernetes label syntax: [prefix/]name = value")
        if not node.labels and not _DNS_SUBDOMAIN.fullmatch(name):
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
        if not (_is_ip(address) or _HOSTNAME.fullmatch(address)):
            raise src.error(
                at + ("address",),
                f"bad address {toml_repr(address)}: not an IP address or a host name",
                'e.g. address = "10.0.0.2"',
            )
        if _is_ip(address) and ipaddress.ip_address(address).is_unspecified:
            raise src.error(
                at + ("address",),
                f"{toml_repr(address)} is no address another node can reach (it means any of this node's)",
                "give the address the other nodes reach this node at, e.g. 10.0.0.2",
            )
        out[name] = ResolvedNode(
            name, platform, dict(node.labels), gpu, dict(node.images), address, node.rpc_port, node.gateway_port
        )
    return out


_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_problem(key: str, value: str) -> str | None:
    """Kubernetes' label rules (apimachinery validation): [prefix/]name, name <= 63 characters of
    alphanumerics, '-', '_', '.', starting and ending alphanumeric; prefix a DNS subdomain <= 253; value
    empty or like a name."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"label key prefix {prefix!r} is not a DNS subdomain"
    if not _LABEL_NAME.fullmatch(name):
        return f"label name {name!r}: at most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric"
    if not _LABEL_VALUE.fullmatch(value):
        return f"label value {value!r}: at most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric"
    return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _check_placement_keys(stack: Stack, src: Source, nodes: dict[str, ResolvedNode]) -> None:
    for name, spec in stack.models.items():
        at = ("models", name)
        if spec.split:
            _check_split(spec, src, at, nodes)
        if spec.node is not None and spec.nodes is not None:
            raise src.error(at + ("nodes",), "give node (a pin) or nodes (an allowed set), not both")
        wanted = [spec.node] if spec.node is not None else list(spec.nodes or [])
        key = "node" if spec.node is not None else "nodes"
        if wanted and not nodes:
            raise src.error(at + (key,), "the stack has no [nodes]: a single machine runs every model", "remove it")
        if spec.nodes is not None and not spec.nodes:
            raise src.error(at + ("nodes",), "empty: give at least one node, or remove the key for any node")
        for i, n in enumerate(wanted):
            if n not in nodes:
                close = close_matches(n, nodes)
                hint = f"did you mean '{close[0]}'?" if close else f"one of {', '.join(nodes)}"
                path = at + (key,) if spec.node is not None else at + (key, i)
                raise src.error(path, f"no node {toml_repr(n)} in [nodes]", hint)


def _check_split(spec: ModelSpec, src: Source, at: tuple[str, ...], nodes: dict[str, ResolvedNode]) -> None:
    """split = true: llama.cpp's RPC backend splits a llama-server model by layers across nodes; the helpers' RPC
    servers run for as long as the stack does, so the model is hot."""
    if not nodes:
        raise src.error(at + ("split",), "the stack has no [nodes]: there is nothing to split across", "remove it")
    if spec.runtime != "llama-server":
        raise src.error(
            at + ("split",),
            f'runtime = "{spec.runtime}" cannot be split: only llama-server runs llama.cpp\'s RPC backend',
            'remove split, or use runtime = "llama-server"',
        )
    if spec.mode != "hot":
        raise src.error(
            at + ("split",),
            "a split model is hot: its parts on the other nodes are held for as long as the stack runs",
            'set mode = "hot", or remove split',
        )
    allowed = [spec.node] if spec.node is not None else list(spec.nodes or nodes)
    if len(allowed) < 2:
        raise src.error(at + ("split",), "it may run on one node only: a split needs two or more", "give nodes = [...]")


_HOSTNAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*$")
RESERVED = OWN_PROGRAMS  # umemc's own processes


def _check_names(stack: Stack, src: Source) -> None:
    seen: dict[str, str] = {}
    for name in stack.models:
        if name in RESERVED or kube_name(name) in RESERVED:
            own = "" if name in RESERVED else f" (as {toml_repr(kube_name(name))}, its Kubernetes name)"
            raise src.error(
                ("models", name),
                f"{toml_repr(name)} is reserved for umemc's own program{own}",
                "choose another model name",
                what="key",
            )
        if not re.fullmatch(NAME_PATTERN, name):
            raise src.error(
                ("models", name),
                f"bad model name {toml_repr(name)}: must match {NAME_PATTERN}",
                "it becomes a supervisord program name and a file name: lowercase letters, "
                "digits, '-' and '_', starting with a letter",
                what="key",
            )
        kube = kube_name(name)  # its Kubernetes object name (DNS-1123 has no '_', ends alphanumeric)
        if kube in seen:
            raise src.error(
                ("models", name),
                f"{toml_repr(name)} and {toml_repr(seen[kube])} are the same Kubernetes name {toml_repr(kube)} "
                "('_' becomes '-', a '-' at the end goes)",
                "rename one of them",
                what="key",
            )
        seen[kube] = name


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


_DECIMAL = re.compile(r"\s*[0-9.]+\s*(k|m|g|t)b\s*", re.IGNORECASE)


def _decimal_memory(table: object, platform: ResolvedPlatform, src: Source, at: tuple[str, ...]) -> list[str]:
    """A machine sold as "64 GB" has 64 GiB of RAM; "64GB" in a stack is 10^9-byte units (59.6 GiB).
    Accepted, but said once, with the figure every report uses."""
    raw = table.get("memory") if isinstance(table, dict) else None
    if not isinstance(raw, str) or not _DECIMAL.fullmatch(raw):
        return []
    return [
        src.warning(
            at + ("memory",),
            f'"{raw}" is {platform.memory} bytes = {gib(platform.memory)} GiB (GB/TB are powers of 10); '
            f"RAM comes in powers of two: a machine sold as {raw.strip()} has "
            f'"{raw.strip()[:-2].strip()}{raw.strip()[-2].upper()}iB"',
        )
    ]


_WINDOW_HINT = {
    "amd-apu": 'the GTT limit the kernel allows (ttm.pages_limit x 4 KiB), e.g. "112GiB"',
    "apple": 'the Metal wired limit (iogpu.wired_limit_mb), e.g. "107.5GiB"',
    "nvidia-discrete": 'the card\'s VRAM, e.g. "24GiB"',
}


def _check_policy(stack: Stack, src: Source) -> None:
    pol = stack.policy
    if pol.load_below >= pol.evict_above:
        raise src.error(
            ("policy", "load_below"),
            f"must be below evict_above ({pol.load_below} >= {pol.evict_above})",
            "the gap between them is the hysteresis that stops load/evict oscillation",
        )


def _check_gateway(stack: Stack, src: Source) -> None:
    gw = stack.gateway
    try:
        loopback = ipaddress.ip_address(gw.host).is_loopback
    except ValueError:
        if not _HOSTNAME.fullmatch(gw.host):
            raise src.error(
                ("gateway", "host"),
                f"not an IP address or host name: {toml_repr(gw.host)}",
                'e.g. "127.0.0.1" (default), "0.0.0.0" or "::"',
            ) from None
        loopback = gw.host == "localhost"
    if not loopback and not gw.token_env:
        raise src.error(
            ("gateway", "host"),
            f"binding {gw.host} needs a token",
            'set token_env = "NAME_OF_AN_ENV_VAR" holding the bearer token',
        )
    if gw.token_env is not None and not _ENV_KEY.fullmatch(gw.token_env):
        raise src.error(("gateway", "token_env"), f"not a valid environment variable name: {toml_repr(gw.token_env)}")


def _check_sysctl(stack: Stack, src: Source) -> None:
    for key, value in stack.sysctl.items():
        if not _SYSCTL_KEY.fullmatch(key):
            raise src.error(
                ("sysctl", key), f"not a sysctl name: {toml_repr(key)}", 'write e.g. "vm.swappiness" = 10', what="key"
            )
        if isinstance(value, str) and not re.fullmatch(r"[A-Za-z0-9_ .:+-]*", value):
            raise src.error(("sysctl", key), "value has characters a sysctl.d file cannot carry")


def _ports(stack: Stack, src: Source) -> dict[str, int]:
    used: dict[int, str] = {}
    if stack.gateway.enabled:
        used[stack.gateway.port] = "gateway.port"
    for name, spec in stack.models.items():
        if spec.port is None:
            continue
        if spec.port in used:
            raise src.error(("models", name, "port"), f"port {spec.port} is already used by {used[spec.port]}")
        used[spec.port] = f"models.{name}.port"
    out, next_port = {}, FIRST_PORT
    for name, spec in stack.models.items():
        if spec.port is not None:
            out[name] = spec.port
            continue
        while next_port in used:
            next_port += 1
        if next_port > MAX_PORT:
            raise src.error(
                ("models", name),
                f"no port left to assign (the next free one would be {next_port})",
                "give this model an explicit port = 1024-65535",
                what="table",
            )
        out[name] = next_port
        used[next_port] = f"models.{name}"
    return out


def _check_aliases(stack: Stack, src: Source) -> None:
    """Every name routes to one model, except a `serves` name, which the models that list it share."""
    seen = {name: f"models.{name}" for name in stack.models}
    for name, spec in stack.models.items():
        for i, alias in enumerate(spec.aliases):
            if alias in seen:
                raise src.error(
                    ("models", name, "aliases", i), f"alias {toml_repr(alias)} is already used by {seen[alias]}"
                )
            seen[alias] = f"models.{name}.aliases"
    for name, spec in stack.models.items():
        for i, shared in enumerate(spec.serves):
            if shared in seen:
                raise src.error(
                    ("models", name, "serves", i),
                    f"{toml_repr(shared)} is already {seen[shared]}: a shared name must be one of its own",
                    "use a name no model and no alias has",
                )
            if spec.serves.index(shared) != i:
                raise src.error(("models", name, "serves", i), f"{toml_repr(shared)} is listed twice")
            if not shared or CONTROL.search(shared):
                raise src.error(("models", name, "serves", i), "must be a printable name")


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
    _check_env(spec, src, at, doc_token_env(doc))
    _check_runtime_keys(spec, src, at)
    if spec.runtime in ENGINE_RUNTIMES:
        engine_keys.check_keys(spec, src, at)
    (model_value, model_at), (mmproj_value, mmproj_at) = _hub_files(spec, src, at, models_dir)
    family = family_of(spec.arch) if spec.arch else RUNTIME_FAMILY[spec.runtime]
    if spec.arch and spec.runtime != "command" and spec.runtime not in RUNTIMES_FOR[family]:
        raise src.error(
            at + ("arch",),
            f'{spec.arch} ({family}) cannot run on runtime = "{spec.runtime}"',
            f"use runtime = {' or '.join(toml_repr(r) for r in RUNTIMES_FOR[family])}",
        )
    quant = _quant(spec, src, at)
    _check_min_quant(spec, src, at)
    locked = lock is not None and lock.header is not None and spec.runtime in LLAMA_RUNTIMES
    sized_from: Path | None = None
    model_path: Path | None
    on_hub = spec.runtime in ENGINE_RUNTIMES and spec.hf is not None
    if on_hub and model_value is not None and not _local(doc, model_value).exists():
        model_path, model_present = _local(doc, model_value), False
        sized_from = engine_keys.on_hub(doc, spec, model_at, model_path)
    else:
        model_path, model_present = _file(
            doc,
            model_value,
            model_at,
            spec,
            llama=spec.runtime in LLAMA_RUNTIMES,
            locked=locked,
            hub=_hub_note(lock, hub_problem) if spec.hf and spec.runtime in LLAMA_RUNTIMES else None,
        )
    mmproj_path, mmproj_present = _file(doc, mmproj_value, mmproj_at, spec, llama=True, is_mmproj=True)
    engine_dir = model_path if model_present else sized_from
    engine = None
    if spec.runtime in ENGINE_RUNTIMES and engine_dir is not None:
        engine = engine_keys.check_dir(spec, src, at, model_at, engine_dir)
    _check_size_source(spec, src, at, model_present=model_present or locked or engine is not None)
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
        _chat_template(doc, spec, at),
        engine,
    )


def _chat_template(doc: Document, spec: ModelSpec, at: tuple[str, ...]) -> Path | None:
    """`chat_template`: a Jinja file (its path, which must be a file) or a built-in name of llama.cpp's; only
    llama.cpp runtimes have one."""
    from ..catalog.chat_templates import LLAMA_CPP_PYTHON, is_file

    value, src, key = spec.chat_template, doc.source, at + ("chat_template",)
    if value is None:
        return None
    if spec.runtime not in LLAMA_RUNTIMES:
        raise src.error(key, f'runtime = "{spec.runtime}" takes no chat template', "only llama.cpp runtimes apply one")
    if spec.runtime == "llama-cpp-python" and (is_file(value) or value not in LLAMA_CPP_PYTHON):
        raise src.error(
            key,
            "llama-cpp-python's server takes no template file, only a built-in name"
            if is_file(value)
            else f"llama-cpp-python's server has no built-in template {toml_repr(value)}",
            f'one of {", ".join(sorted(LLAMA_CPP_PYTHON))}, or runtime = "llama-server"',
        )
    if not is_file(value):
        _check_template_name(doc, spec, key, value)
        return None
    path = _local(doc, value)
    kind = _not_regular(path) or ("a directory" if path.is_dir() else None)
    if not path.exists() or kind is not None:
        raise src.error(key, f"no template file at {path}" + (f" ({kind})" if kind else ""))
    return path


def _check_template_name(doc: Document, spec: ModelSpec, key: tuple[str, ...], value: str) -> None:
    """A llama.cpp built-in name: umemc's list, or (a newer build's name) the list the installed llama-server's
    --help gives; anything else is refused with the nearest name."""
    from ..catalog.chat_templates import BUILTIN, listed

    if spec.runtime != "llama-server" or value in BUILTIN:
        return
    from ..helptext import probe

    installed = probe(spec.bin or "llama-server")
    if installed is not None and value in (listed(installed.text) or ()):
        return
    near = close_matches(value, BUILTIN)
    hint = f"did you mean {toml_repr(near[0])}?" if near else "a name `llama-server --help` lists, or a .jinja file"
    raise doc.source.error(key, f"not a llama.cpp built-in chat template: {toml_repr(value)}", hint)


Named = tuple[str | None, tuple[str, ...]]  # a file's path as the stack gives it, and the key that names it


def _hub_files(spec: ModelSpec, src: Source, at: tuple[str, ...], models_dir: str) -> tuple[Named, Named]:
    """The model's and the projector's files (the stack's `model`/`mmproj`, else where `umemc pull` puts
    `hf`/`mmproj_hf`), each with the key that names it; the Hub spellings checked."""
    from ..hub.ref import RefError, check_revision, parse

    try:
        check_revision(spec.hf_revision)
    except RefError as exc:
        raise src.error(at + ("hf_revision",), str(exc), exc.hint) from None
    for key in ("hf", "mmproj_hf"):
        value = getattr(spec, key)
        if value is None:
            continue
        if spec.runtime in ("command", "torch"):
            raise src.error(
                at + (key,),
                f'runtime = "{spec.runtime}" loads no single model file',
                "download it yourself and name its directory in the worker's own arguments",
            )
        if spec.runtime in ENGINE_RUNTIMES and key == "mmproj_hf":
            raise src.error(at + (key,), f'runtime = "{spec.runtime}" loads no projector file', "remove mmproj_hf")
        try:
            ref = _hub_ref(spec, value)
        except RefError as exc:
            raise src.error(at + (key,), str(exc), exc.hint) from None
        local = spec.model if key == "hf" else spec.mmproj
        if local is not None and ref.path and len(ref.parts) > 1 and Path(local).name != Path(ref.path).name:
            raise src.error(
                at + ("model" if key == "hf" else "mmproj",),
                f"a split GGUF keeps its parts' names: must end in {Path(ref.path).name}",
                "llama.cpp finds the other parts beside the first by their names",
            )
    if spec.hf_revision is not None and spec.hf is None and spec.mmproj_hf is None:
        raise src.error(at + ("hf_revision",), "is the revision of hf or mmproj_hf; neither is given")

    def named(local: str | None, hub: str | None, key: str) -> Named:
        if local is not None or hub is None:
            return local, at + (key,)
        if spec.runtime in ENGINE_RUNTIMES:  # a whole repository: MODELS_DIR/owner/name
            from ..hub.directory import local_dir

            return str(local_dir(_hub_ref(spec, hub), models_dir)), at + ("hf",)
        return str(parse(hub, spec.hf_revision).local_path(models_dir)), at + (
            f"{key}_hf" if key == "mmproj" else "hf",
        )

    return named(spec.model, spec.hf, "model"), named(spec.mmproj, spec.mmproj_hf, "mmproj")


def _hub_ref(spec: ModelSpec, value: str) -> HfRef:
    """`hf` as the runtime loads it: a file (owner/name/path) for llama.cpp and whisper.cpp, a whole repository
    (owner/name) for vLLM and MLX."""
    from ..hub.directory import parse_repo
    from ..hub.ref import parse

    return parse_repo(value, spec.hf_revision) if spec.runtime in ENGINE_RUNTIMES else parse(value, spec.hf_revision)


def _hub_note(lock: LockEntry | None, problem: str | None) -> tuple[str | None, str | None]:
    """How a Hub file not yet downloaded is sized (from its header on the Hub), or why the Hub did not."""
    if problem is None and lock is not None and lock.hub is not None and lock.header is not None:
        h = lock.hub
        size = sum(p.size for p in h.parts)
        return (
            f"its GGUF header on the Hub ({h.repo} at {h.commit[:12]}, {human(h.header_bytes)} of {human(size)} read)",
            None,
        )
    return None, problem or "no answer"


def doc_token_env(doc: Document) -> str | None:
    gateway = doc.data.get("gateway")
    return gateway.get("token_env") if isinstance(gateway, dict) else None


def _check_env(spec: ModelSpec, src: Source, at: tuple[str, ...], token_env: str | None) -> None:
    for key in spec.env:
        if not _ENV_KEY.fullmatch(key):
            raise src.error(
                at + ("env", key),
                f"not a valid environment variable name: {toml_repr(key)}",
                "letters, digits and '_', not starting with a digit",
                what="key",
            )
        if key.startswith("UMEMC_"):
            raise src.error(
                at + ("env", key),
                "is umemc's own: every worker gets UMEMC_MODEL, UMEMC_HOST, UMEMC_PORT, UMEMC_STATE and "
                "UMEMC_QUOTA_*_BYTES "
                "from the plan (and UMEMC_ENV_* carries the model's env to it)",
                "give the variable another name",
                what="key",
            )
        if key == token_env:
            raise src.error(
                at + ("env", key),
                "is the gateway's token variable (gateway.token_env): workers never receive the gateway's token",
                "give the worker its own variable",
                what="key",
            )
    for i, key in enumerate(spec.public_env):
        if key not in spec.env:
            known = ", ".join(sorted(spec.env)) or "none"
            raise src.error(
                at + ("public_env", i),
                f"{toml_repr(key)} is not a key of env (keys: {known})",
                "public_env names env keys whose values are not secret",
            )


def _check_runtime_keys(spec: ModelSpec, src: Source, at: tuple[str, ...]) -> None:
    rt = spec.runtime
    if rt == "command":
        if spec.command is None:
            raise src.error(
                at + ("command",),
                'required key is missing for runtime = "command"',
                'command = ["python", "-m", "my_worker", "--port", "{port}"]',
                what="table",
            )
        if not spec.command[0].strip():
            raise src.error(
                at + ("command", 0),
                "must name a program (got an empty string)",
                'command = ["python", "-m", "my_worker", "--port", "{port}"]',
            )
        if spec.memory is None:
            raise src.error(
                at + ("memory",),
                'required key is missing for runtime = "command"',
                'nothing else tells its size: memory = "4GiB"',
                what="table",
            )
    elif spec.command is not None:
        raise src.error(
            at + ("command",),
            'only used with runtime = "command"',
            "use bin and args to change how a runtime is started",
            what="key",
        )
    if rt == "torch" and spec.module is None:
        raise src.error(
            at + ("module",),
            'required key is missing for runtime = "torch"',
            'module = "my_package.worker" (run as python -m)',
            what="table",
        )
    if rt == "llama-cpp-python" and spec.parallel != 1:
        raise src.error(
            at + ("parallel",),
            f"llama-cpp-python serves one sequence (got {spec.parallel})",
            'use runtime = "llama-server" for parallel slots',
        )
    if spec.health is not None and not spec.health.startswith("/"):
        raise src.error(at + ("health",), f"must be a URL path starting with '/' (got {toml_repr(spec.health)})")
    if spec.mmproj is not None and rt not in LLAMA_RUNTIMES:
        raise src.error(at + ("mmproj",), "only used with llama.cpp runtimes", what="key")


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


def _check_min_quant(spec: ModelSpec, src: Source, at: tuple[str, ...]) -> None:
    if spec.min_quant is None:
        return
    if spec.runtime not in LLAMA_RUNTIMES:
        raise src.error(at + ("min_quant",), f'a GGUF file type: not used for runtime = "{spec.runtime}"', "remove it")
    if spec.min_quant.upper() not in FILE_TYPES:
        close = close_matches(spec.min_quant.upper(), FILE_TYPES)
        raise src.error(
            at + ("min_quant",),
            f"unknown GGUF file type {toml_repr(spec.min_quant)}",
            f"did you mean '{close[0]}'?" if close else f"one of {', '.join(FILE_TYPES)}",
        )


def _file(
    doc: Document,
    value: str | None,
    at: tuple[str, ...],
    spec: ModelSpec,
    *,
    llama: bool,
    is_mmproj: bool = False,
    locked: bool = False,
    hub: tuple[str | None, str | None] | None = None,
) -> tuple[Path | None, bool]:
    if value is None:
        return None, False
    src = doc.source
    path = _local(doc, value)
    if path.is_dir() or not path.exists():
        if path.is_dir() and not llama:
            return path, True  # torch/comfyui model directories
        if hub is not None:
            sized, problem = hub
            return _not_downloaded(doc, path, at, spec, locked=locked, sized=sized, problem=problem), False
        fallback = (
            f"the header {doc.path.stem}.calibration.json recorded (not confirmed against the file)"
            if locked
            else _fallback(spec, is_mmproj=is_mmproj)
        )
        if fallback is None and is_mmproj:  # one rule with model files: a missing file is said, not fatal
            doc.warnings.append(
                src.warning(
                    at,
                    f"file not found: {path}; the projector is not counted (no arch preset has one for it): "
                    'give memory = "…" or the file',
                )
            )
            return path, False
        if fallback is None:
            raise src.error(
                at,
                f"file not found: {path}",
                'give arch = "<preset>" as a fallback, or memory = "…"' if not is_mmproj else None,
            )
        doc.warnings.append(src.warning(at, f"file not found, estimating from {fallback}"))
        return path, False
    kind = _not_regular(path)
    if kind:  # opening a FIFO would wait for a writer forever; a device or socket is no model either
        raise src.error(at, f"not a regular file: {path} is {kind}", "name the model's file itself")
    if llama:
        try:
            ok = is_gguf(path)
        except OSError as exc:
            raise src.error(at, f"cannot read {path}: {exc.strerror}") from None
        if not ok:
            raise src.error(at, f"not a GGUF file: {path}", "llama.cpp runtimes load .gguf files")
    return path, True


def _not_downloaded(
    doc: Document,
    path: Path,
    at: tuple[str, ...],
    spec: ModelSpec,
    *,
    locked: bool,
    sized: str | None,
    problem: str | None,
) -> Path:
    """A Hub model not on disk yet: sized from its header on the Hub, else from another fallback (said), else
    an error that says how to get it."""
    src, pull = doc.source, f"`umemc pull {doc.source.file}` downloads it"
    if sized is not None:
        doc.warnings.append(src.warning(at, f"not downloaded yet ({path}): sized from {sized}; {pull}"))
        return path
    fallback = f"the lock in {doc.path.stem}.calibration.json" if locked else _fallback(spec, is_mmproj=False)
    if fallback is None:
        raise src.error(
            at,
            f"not downloaded yet ({path}), and the Hub could not size it: {problem}",
            f'{pull}; or give arch = "<preset>" as a fallback, or memory = "…"',
        )
    doc.warnings.append(
        src.warning(
            at, f"not downloaded yet ({path}); the Hub could not size it: {problem}; estimating from {fallback}"
        )
    )
    return path


def _not_regular(path: Path) -> str | None:
    """What a path that exists is, when it is not a regular file (nor a directory): never opened."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), None)


def _fallback(spec: ModelSpec, *, is_mmproj: bool) -> str | None:
    if is_mmproj:
        preset = LLM_PRESETS.get(spec.arch or "")
        return f'the projector of arch = "{spec.arch}"' if preset and preset.vision else None
    if spec.memory is not None:
        return "memory = (explicit)"
    if spec.arch is not None:
        return f'arch = "{spec.arch}"'
    return None


def _check_size_source(spec: ModelSpec, src: Source, at: tuple[str, ...], *, model_present: bool) -> None:
    if spec.memory is not None:
        if spec.memory == 0:
            raise src.error(at + ("memory",), "must be > 0")
        return
    if spec.arch is None and not (
        model_present and spec.runtime in (*LLAMA_RUNTIMES, *ENGINE_RUNTIMES, "whisper-server")
    ):
        raise src.error(
            at,
            "no size source: give a model file, an arch preset, or memory",
            'e.g. arch = "llama-3-8b" or memory = "6GiB"',
            what="table",
        )
