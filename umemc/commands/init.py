"""`umemc init [-o FILE] [--platform PRESET] [--force]`: write a commented stack to start from, for the
named platform preset or for this machine as detected (a preset when one matches, else kind + memory).

Detection is `umemc doctor`'s (umemc.runtime.probes.machine): MemTotal, amdgpu's sysfs (an AMD GPU with a small
VRAM carve-out is an APU), the NVIDIA driver (a GPU without memory of its own is a GB10), Jetson's release file,
and on macOS hw.memsize and the CPU brand. The memory written is what the OS sees, never rounded up."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog.runtimes import ENGINE_RUNTIMES
from ..errors import UsageError
from ..runtime.probes.machine import Machine, detect
from ..stack.models import NAME_PATTERN
from ..stack.presets import PLATFORM_PRESETS
from ..units import GiB, MiB, gib
from .args import Args

if TYPE_CHECKING:
    from ..lockfile import LockEntry


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("init", help="write a commented stack for this machine (or a named platform preset)")
    p.add_argument("-o", "--output", default="stack.toml", metavar="FILE", help="where to write (default stack.toml)")
    p.add_argument("--platform", metavar="PRESET", choices=sorted(PLATFORM_PRESETS), help="a platform preset")
    p.add_argument("--name", default=None, help="the stack's name (default: the file name without .toml)")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.add_argument(
        "--models",
        metavar="DIR",
        default=None,
        help="a directory of GGUF files: one model each, sized from its header (default: ./models where it exists)",
    )
    p.add_argument(
        "--hf",
        action="append",
        default=[],
        metavar="OWNER/REPO/FILE.gguf",
        help="a model file on the Hugging Face Hub (repeatable): one model each, sized from its header on the Hub",
    )
    p.set_defaults(func=run)


COLD_TTL = "5m"  # Ollama's default keep_alive: what its users expect of a model started on demand


def preset_for(m: Machine) -> str | None:
    """The preset of this kind for a machine of this memory (MemTotal is a little less than the installed RAM: the
    kernel keeps some; a preset of what the OS sees matches within 1%). None for a machine with a carve-out (the
    presets assume the minimum frame buffer)."""
    if m.carveout:
        return None
    for name, p in PLATFORM_PRESETS.items():
        if p.kind == m.kind and m.memory <= p.memory * 1.01 and m.memory >= p.memory * 0.9:
            return name
    return None


def platform_table(preset: str | None, m: Machine | None) -> str:
    if preset is not None:
        p = PLATFORM_PRESETS[preset]
        window = f"{gib(p.gpu_window)} GiB" if p.gpu_window is not None else "none"
        table = (
            f"[platform]\n"
            f'preset = "{preset}"  # {p.note}\n'
            f'# it means: kind = "{p.kind}", memory = "{gib(p.memory)}GiB", os_reserve = "{gib(p.os_reserve)}GiB", '
            f"GPU window {window}; any of them may be overridden here\n"
        )
        if m is not None and m.memory < p.memory - (64 << 20):  # the OS here sees less than the preset says
            table += (
                f'memory = "{m.memory >> 20}MiB"  # what the OS sees here ({m.memory_source}): the budget '
                "never gives out memory the OS does not have\n"
            )
        return table
    assert m is not None
    from ..stack.presets import default_os_reserve

    # what the OS sees (MemTotal), never rounded up to the installed RAM: memory the kernel keeps for itself is no
    # model's; a carved box counts its carve-out beside it (the GPU has it, the OS never does)
    whole = m.memory >> 20  # MiB, rounded down
    reserve = default_os_reserve(whole * MiB)
    carve = ""
    if m.carveout:
        from ..runtime.probes.machine import gtt_total

        live = gtt_total()  # the GTT in force where the driver says it, else its default: half of what the OS sees
        gtt = live[1] if live is not None else (m.memory - m.carveout) // 2
        carve = (
            f'uma_carveout = "{round(m.carveout / GiB)}GiB"     # the BIOS\'s UMA frame buffer '
            "(mem_info_vram_total): RAM the OS never sees.\n"
            "# The GPU gets it as VRAM, plus its GTT window below; the OS and the models' CPU side get the rest.\n"
            "# Better: set UMA Frame Buffer Size (or iGPU Memory Size) to 512M in the BIOS setup, remove this "
            "line,\n# and let the GPU map system memory through its GTT (ttm.pages_limit, set by `umemc apply`).\n"
            f'gpu_window = "{gtt >> 20}MiB"       # the GTT: '
            + ("amdgpu's in force (mem_info_gtt_total)\n" if live else "amdgpu's default, half of what the OS sees\n")
        )
    return (
        f"[platform]\n"
        f'kind = "{m.kind}"            # detected: {m.why}\n'
        f'memory = "{whole}MiB"        # {m.memory_source} {m.memory - m.carveout} bytes'
        + (" + the carve-out" if m.carveout else "")
        + ": what the OS sees\n"
        f'# os_reserve = "{reserve >> 20}MiB"  # the default (min(8 GiB, memory / 8)): kept for the OS and '
        "everything outside the stack\n"
        + carve
        + (
            '# gpu_window = "…GiB"      # what the GPU may map (default: derived from memory)\n'
            if m.kind != "cpu" and not carve
            else ""
        )
    )


TEMPLATE = """# A umemc stack: the machine and the models that share its memory.
# `umemc check {file}` prints the budget; `umemc explain {file} chat` shows every figure;
# `umemc up {file}` runs it. Every key: `umemc schema`, or docs/ in the umemc repository.
version = 1
name = "{name}"

{platform}
[policy]
# safety_margin = 0.15       # share of the usable memory never budgeted
# quota_headroom = 0.10      # hard quota = estimate x (1 + quota_headroom): over it, the worker is killed
# load_below = 0.70          # cold models start only while memory pressure is below this
# evict_above = 0.90         # above this, lower-priority workers are stopped

[models.chat]
runtime = "llama-server"     # llama-server | llama-cpp-python | whisper-server | comfyui | torch | command
model = "models/Meta-Llama-3-8B-Instruct-Q4_K_M.gguf"  # read for an exact estimate when present
arch = "llama-3-8b"          # used while the file is absent
context = 8192               # tokens per sequence
parallel = 1                 # concurrent sequences; the KV cache is sized for all of them
kv_cache = "q8_0"            # half the KV memory of f16
priority = 80                # 0-100: higher survives eviction longer
mode = "hot"                 # hot: started by `umemc up`; cold: started on the first request

# [models.embed]
# runtime = "llama-server"
# model = "models/bge-m3-F16.gguf"
# arch = "bge-m3"
# mode = "cold"
# priority = 40
"""


@dataclass(frozen=True)
class InitArgs(Args):
    output: str
    platform: str | None
    name: str | None
    force: bool
    models: str | None
    hf: list[str]


def run(ns: argparse.Namespace) -> int:
    args = InitArgs.of(ns)
    from ..records import write_atomic

    out = Path(args.output)
    found = scaffold(out, args)
    if out.exists() and not args.force:
        raise UsageError(f"{out} exists: choose another -o, or --force to replace it")
    if args.platform:
        platform = platform_table(args.platform, None)
        said = f"platform preset {args.platform}"
    else:
        m = detect()
        preset = preset_for(m)
        platform = platform_table(preset, m)
        said = f"this machine: {m.why}, {gib(m.memory)} GiB" + (f" (preset {preset})" if preset else "")
    name = args.name or (out.stem.lower().replace(".", "-") if out.stem != "stack" else "my-stack")
    if not re.fullmatch(NAME_PATTERN, name):
        raise UsageError(f"stack name {name!r} must match {NAME_PATTERN}: give --name")
    text = TEMPLATE.format(file=out.name, name=name, platform=platform)
    if found:
        text = text[: text.index("[models.chat]")] + "".join(m.toml() for m in found)
        said += f", {len(found)} model(s) found: " + ", ".join(m.name for m in found)
        base = [m.name for m in found if m.family == "llm" and m.no_template is not None]
        if base:
            said += (
                f"; {', '.join(base)} carr{'ies' if len(base) == 1 else 'y'} no chat template (likely a base model: "
                "it continues text, ask it with /v1/completions)"
            )
    write_atomic(out, text, mode=0o644)
    locks = {f.name: f.lock for f in found if f.lock is not None}
    if locks:
        from .. import lockfile

        lockfile.save(out, {**lockfile.load(out), **locks})
    print(f"wrote {out} for {said}; next: umemc check {out}")
    return 0


@dataclass(frozen=True)
class Found:
    """One model init found: a GGUF file here or on the Hub, sized from its header."""

    name: str
    key: str  # model | hf
    value: str  # the path (relative to the stack) or the Hub spelling
    runtime: str
    family: str  # llm | embedding
    weights: int
    what: str  # the header's architecture, type and layers, for the comment
    context: int
    mmproj: str | None = None
    hot: bool = False
    lock: LockEntry | None = None  # a Hub file's header, recorded so that `check` needs no network later
    no_template: str | None = None  # the file has no chat template: the built-in its architecture uses, else ""
    size: str | None = None  # the header's size label, lower case ("270m"): tells two of one family apart

    def toml(self) -> str:
        from ..stack.types import toml_string
        from ..units import human

        lines = [
            f"[models.{self.name}]",
            f'runtime = "{self.runtime}"',
            f"{self.key} = {toml_string(self.value)}  # {human(self.weights)} of weights: {self.what}",
        ]
        if self.mmproj:
            lines.append(f"mmproj = {toml_string(self.mmproj)}")
        if self.family == "llm":
            lines += [f"context = {self.context}"]
            if self.runtime not in ENGINE_RUNTIMES:  # an engine's f16 cache: MLX's 8-bit one serves one request at once
                lines.append('kv_cache = "q8_0"')
        if self.no_template:
            lines.append(f'chat_template = "{self.no_template}"  # the file has none; llama.cpp\'s built-in for it')
        elif self.no_template is not None:
            lines.append('# chat_template = "..."  # the file has none: name a llama.cpp built-in or a .jinja file')
        lines += [
            f"priority = {80 if self.hot else 40 if self.family == 'embedding' else 50}",
            f'mode = "{"hot" if self.hot else "cold"}"' + ("" if self.hot else "  # started on its first request"),
        ]
        if not self.hot:  # as Ollama does with a model it loaded for a request
            lines.append(f'ttl = "{COLD_TTL}"  # stopped after {COLD_TTL} idle; remove it to keep it until evicted')
        return "\n" + "\n".join(lines) + "\n"


def scaffold(out: Path, args: InitArgs) -> list[Found]:
    """The models of a directory of GGUF files and of the Hub files named, each sized; the largest language
    model that carries a chat template hot (a file without one is likely a base model: it continues text rather
    than answering a chat), else the largest language model; the rest cold."""
    from ..errors import RuntimeFailure

    here = out.parent if str(out.parent) else Path(".")
    directory = Path(args.models) if args.models else here / "models"
    found = _local(directory, here) if args.models or directory.is_dir() else []
    if args.models or directory.is_dir():
        found += _engine_dirs(directory, here)
    if args.models and not found:
        raise UsageError(f"umemc init: no GGUF model file and no Hugging Face model directory in {args.models}")
    for spelling in args.hf:
        try:
            found.append(_on_hub(spelling))
        except RuntimeFailure as exc:
            raise RuntimeFailure(f"umemc init: {spelling}: {exc}") from None
    names: set[str] = set()
    unique = []
    families = [f.name for f in found]
    for f in found:
        # two files of one family (two sizes, two quantizations): the size tells them apart, then a number
        first = f"{f.name}-{f.size}" if f.size and families.count(f.name) > 1 else f.name
        name, n = first, 2
        while name in names:
            name, n = f"{first[:60]}-{n}", n + 1
        names.add(name)
        unique.append(replace(f, name=name))
    llms = [f for f in unique if f.family == "llm"]
    chat = [f for f in llms if f.no_template is None] or llms  # a chat template says: made to answer a chat
    hot = max(chat, key=lambda f: f.weights).name if chat else None
    return [replace(f, hot=f.name == hot) for f in unique]


def _local(directory: Path, stack_dir: Path) -> list[Found]:
    import os

    from ..estimate.gguf_file import NotGguf, read
    from ..hub.ref import SPLIT

    files = sorted(p for p in directory.rglob("*.gguf") if p.is_file())
    facts = {}
    for p in files:
        m = SPLIT.match(p.name)
        if m and m.group("no") != "00001":
            continue  # a split model is its first part
        try:
            facts[p] = read(p)
        except NotGguf:
            continue
    projectors = {p.parent: p for p, f in facts.items() if f.shape is None and f.vision is not None}
    out = []
    for p, f in facts.items():
        if f.shape is None:
            continue
        rel = os.path.relpath(p.resolve(), stack_dir.resolve())
        proj = projectors.get(p.parent)
        name = _name(p.name, f.basename)
        out.append(_found(name, "model", rel, f, None if proj is None else os.path.relpath(proj, stack_dir)))
    return out


def _engine_dirs(directory: Path, stack_dir: Path) -> list[Found]:
    """The Hugging Face model directories under `directory` (config.json beside *.safetensors), for the engine of
    this machine: MLX on a Mac, vLLM elsewhere."""
    import os

    from ..catalog.hfdir import NotAModel, is_model_dir, read
    from ..runtime.probes import hostroot

    engine = "mlx" if hostroot.host_os() == "darwin" else "vllm"
    out = []
    for config in _configs(directory):
        if not is_model_dir(config.parent):
            continue
        try:
            model = read(config.parent)
        except (NotAModel, OSError):
            continue
        a = model.attention
        kind = str(model.config.get("model_type") or "model")
        quant = model.quantization.get("bits")
        what = f"{kind}, {f'{quant}-bit' if quant else model.dtype}, {a.n_layer} layers"
        out.append(
            Found(
                _name(config.parent.name),
                "model",
                os.path.relpath(os.path.abspath(config.parent), os.path.abspath(stack_dir)),
                engine,
                "llm",
                model.tensor_bytes,
                what,
                min(8192, a.max_position or 8192),
            )
        )
    return out


def _configs(directory: Path) -> list[Path]:
    """Every config.json under `directory`, a directory linked in (a model kept elsewhere) included, each real
    directory once (a link back up is no loop)."""
    import os

    seen, out = set(), []
    for root, dirs, files in os.walk(directory, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        if "config.json" in files:
            out.append(Path(root) / "config.json")
    return sorted(out)


def _on_hub(spelling: str) -> Found:
    from ..errors import RuntimeFailure
    from ..estimate.gguf_file import read
    from ..estimate.hub_header import lock_entry
    from ..hub.ref import HubFailure, RefError, parse
    from ..hub.remote import header_copy_path

    try:
        ref = parse(spelling)
    except RefError as exc:
        raise UsageError(f"umemc init: --hf {spelling}: {exc}" + (f" ({exc.hint})" if exc.hint else "")) from None
    try:
        entry = lock_entry(ref)
    except HubFailure as exc:
        raise RuntimeFailure(str(exc)) from None
    assert entry.hub is not None
    facts = read(header_copy_path(ref, entry.hub.commit))
    return replace(_found(_name(Path(ref.path).name, facts.basename), "hf", spelling, facts, None), lock=entry)


def _found(name: str, key: str, value: str, f: object, mmproj: str | None) -> Found:
    from ..estimate.gguf_file import GgufFacts

    assert isinstance(f, GgufFacts) and f.shape is not None
    s = f.shape
    family = "llm" if s.causal else "embedding"  # an encoder (bert and kin): no KV cache, an embeddings server
    what = f"{f.general_arch}, {f.file_type or 'mixed types'}, {s.n_layer} layers"
    context = min(8192, s.n_ctx_train or 8192)
    from ..catalog.chat_templates import BY_ARCH

    no_template = BY_ARCH.get(f.general_arch, "") if family == "llm" and f.chat_template is False else None
    size = re.sub(r"[^a-z0-9]+", "-", f.size_label.lower()).strip("-") if f.size_label else None
    return Found(
        name,
        key,
        value,
        "llama-server",
        family,
        f.tensor_bytes,
        what,
        context,
        mmproj,
        no_template=no_template,
        size=size or None,
    )


def _name(filename: str, family: str | None = None) -> str:
    """A model's name, which clients will ask for: its family as the file's header names it (general.basename:
    `gemma-3` -> `gemma3`, `SmolLM2` -> `smollm2`), else from the file's name (`Qwen3-30B-A3B-Q4_K_M.gguf` ->
    `qwen3-30b-a3b-q4_k_m`)."""
    from ..hub.ref import SPLIT

    if family:
        name = re.sub(r"[^a-z0-9_-]+", "-", family.lower()).strip("-_")
        name = re.sub(r"(?<=[a-z])-(?=[0-9])", "", name)  # gemma-3 -> gemma3, as the family is said
        if name and name[0].isalpha():
            return name[:63].rstrip("-_")
    m = SPLIT.match(filename)
    stem = m.group("stem") if m else filename.removesuffix(".gguf")
    name = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-_")
    name = name if name and name[0].isalpha() else f"m-{name}"
    return name[:63].rstrip("-_")
