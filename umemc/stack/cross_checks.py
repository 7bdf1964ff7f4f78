"""The checks that span several keys of a stack, each raising at the key it names (file:line:col, a hint): names
and reserved names, placement and splits, ports, aliases, the policy's and the gateway's settings, sysctl keys,
a model's environment, its runtime's keys, its quantization and what sizes it."""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING

from ..catalog.quant import FILE_TYPES
from ..catalog.runtimes import ENGINE_RUNTIMES, LLAMA_RUNTIMES
from ..chars import CONTROL, kube_name
from ..names import OWN_PROGRAMS
from ..units import gib
from .load import Document, Source, close_matches
from .models import NAME_PATTERN, ModelSpec, Stack
from .resolved import ResolvedNode, ResolvedPlatform
from .types import toml_repr

if TYPE_CHECKING:
    pass

FIRST_PORT = 10001
MAX_PORT = 65535
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SYSCTL_KEY = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_-]+)+$")


_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_problem(key: str, value: str) -> str | None:
    """Kubernetes' label rules (apimachinery validation): [prefix/]name, name <= 63 characters of
    alphanumerics, '-', '_', '.', starting and ending alphanumeric; prefix a DNS subdomain <= 253; value
    empty or like a name."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"label key prefix {prefix!r} is not a DNS subdomain"
    if not _LABEL_NAME.fullmatch(name):
        return f"label name {name!r}: at most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric"
    if not _LABEL_VALUE.fullmatch(value):
        return f"label value {value!r}: at most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric"
    return None


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check_placement_keys(stack: Stack, src: Source, nodes: dict[str, ResolvedNode]) -> None:
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


HOSTNAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*$")
RESERVED = OWN_PROGRAMS  # umemc's own processes


def check_names(stack: Stack, src: Source) -> None:
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


_DECIMAL = re.compile(r"\s*[0-9.]+\s*(k|m|g|t)b\s*", re.IGNORECASE)


def decimal_memory(table: object, platform: ResolvedPlatform, src: Source, at: tuple[str, ...]) -> list[str]:
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


def check_policy(stack: Stack, src: Source) -> None:
    pol = stack.policy
    if pol.load_below >= pol.evict_above:
        raise src.error(
            ("policy", "load_below"),
            f"must be below evict_above ({pol.load_below} >= {pol.evict_above})",
            "the gap between them is the hysteresis that stops load/evict oscillation",
        )


def check_gateway(stack: Stack, src: Source) -> None:
    gw = stack.gateway
    try:
        loopback = ipaddress.ip_address(gw.host).is_loopback
    except ValueError:
        if not HOSTNAME.fullmatch(gw.host):
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


def check_sysctl(stack: Stack, src: Source) -> None:
    for key, value in stack.sysctl.items():
        if not _SYSCTL_KEY.fullmatch(key):
            raise src.error(
                ("sysctl", key), f"not a sysctl name: {toml_repr(key)}", 'write e.g. "vm.swappiness" = 10', what="key"
            )
        if isinstance(value, str) and not re.fullmatch(r"[A-Za-z0-9_ .:+-]*", value):
            raise src.error(("sysctl", key), "value has characters a sysctl.d file cannot carry")


def assign_ports(stack: Stack, src: Source) -> dict[str, int]:
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


def check_aliases(stack: Stack, src: Source) -> None:
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


def check_template_name(doc: Document, spec: ModelSpec, key: tuple[str, ...], value: str) -> None:
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


def doc_token_env(doc: Document) -> str | None:
    gateway = doc.data.get("gateway")
    return gateway.get("token_env") if isinstance(gateway, dict) else None


def check_env(spec: ModelSpec, src: Source, at: tuple[str, ...], token_env: str | None) -> None:
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


def check_runtime_keys(spec: ModelSpec, src: Source, at: tuple[str, ...]) -> None:
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


def check_min_quant(spec: ModelSpec, src: Source, at: tuple[str, ...]) -> None:
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


def check_size_source(spec: ModelSpec, src: Source, at: tuple[str, ...], *, model_present: bool) -> None:
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
