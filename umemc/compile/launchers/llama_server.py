"""llama.cpp's llama-server, spelled for the build that is installed: its `--help` (umemc.helptext, read once per
binary) says which spelling it takes. The newest (llama.cpp 2026-10, the one llama-cpp-python 0.3.36 vendors):
`--load-mode none|mmap|mlock|mmap+mlock` instead of `--no-mmap`/`--mlock`, `-fa on|off|auto` instead of the
`-fa` switch, `--fit off` (builds from 2025-12 fit unset parameters to free memory by default). Older builds get
their own spelling; what they cannot do at all is refused (a projector without `--mmproj`), what umemc can do
without is left out (`--slot-save-path`: the gateway then keeps no KV slots across an eviction). Where no
llama-server is installed (a bundle built for another machine, Kubernetes images) the newest spelling is used,
and preflight checks on the machine that runs it that its --help lists every flag the bundle passes."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

from ...catalog.chat_templates import jinja
from ._common import llama_threads, model_flag

if TYPE_CHECKING:
    from ...budget.plan import ModelPlan
    from ...helptext import Help
    from . import Context

NAME = "llama-server"
HEALTH = "/health"
FLAGS_MATCH = "llama.cpp with --load-mode (2026-10) and later; older builds spelled as their --help says"
NEEDS_MODEL_FILE = True  # cannot start without a weights file
REPORTS_BUFFERS = True  # its log states llama.cpp's buffer sizes (drift check)
HELP_MODULE: str | None = None  # `python -m MODULE --help` instead of `ARGV0 --help`
PINNED = (
    "--ctx-size",
    "--parallel",
    "--ubatch-size",
    "--batch-size",
    "--flash-attn",
    "--cache-type-k",
    "--cache-type-v",
    "--n-gpu-layers",
    "--load-mode",
    "--mmproj",
    "--host",
    "--port",
    "--slot-save-path",
    "--log-verbosity",
    "--fit",
)
# the long name of every flag argv() passes (preflight looks for these in the installed --help)
LONG = {
    "-m": "--model", "-c": "--ctx-size", "-np": "--parallel", "-ub": "--ubatch-size", "-b": "--batch-size",
    "-fa": "--flash-attn", "-ctk": "--cache-type-k", "-ctv": "--cache-type-v", "-ngl": "--n-gpu-layers",
}  # fmt: skip
REQUIRED = ("--parallel", "--ubatch-size", "--cache-type-k", "--cache-type-v", "--n-gpu-layers")
SLOTS_DIR = "@UMEMC_STATE@/slots"  # filled in by the exec wrapper (umemc.runtime.wrap.fill_state)
LOAD_MODE = {(False, False): "none", (True, False): "mmap", (False, True): "mlock", (True, True): "mmap+mlock"}
MIB = 1024 * 1024
ALL_LAYERS = "999"  # more than any model has: every layer offloaded (the estimate assumes it)


class Dialect(NamedTuple):
    """What an installed llama-server takes (the newest spelling where none is installed here)."""

    version: str = "newest"
    load_mode: bool = True  # --load-mode (else --no-mmap / --mlock)
    fa_value: bool = True  # -fa on|off|auto (else -fa is a switch: present means on)
    fit: bool = True  # --fit (and it defaults to on: umemc turns it off)
    verbosity: bool = True  # --log-verbosity
    slot_save: bool = True  # --slot-save-path
    mmproj: bool = True  # --mmproj
    embeddings: str = "--embeddings"
    alias: bool = True  # --alias (the name its answers give the model)
    template_file: bool = True  # --chat-template-file
    jinja_default: bool = True  # --no-jinja exists: Jinja chat templates are on unless turned off
    cache_ram: bool = True  # --cache-ram: a host-memory cache of prompts' KV (8 GiB unless told)
    missing: tuple[str, ...] = ()  # flags umemc cannot do without

    @classmethod
    def of(cls, h: Help | None) -> Dialect:
        if h is None:
            return cls()
        return cls(
            version=h.version,
            load_mode=h.has("--load-mode"),
            fa_value="on|off" in h.line("--flash-attn"),
            fit=h.has("--fit"),
            verbosity=h.has("--log-verbosity"),
            slot_save=h.has("--slot-save-path"),
            mmproj=h.has("--mmproj"),
            embeddings="--embeddings" if h.has("--embeddings") else "--embedding",
            alias=h.has("--alias"),
            template_file=h.has("--chat-template-file"),
            jinja_default=h.has("--no-jinja"),
            cache_ram=h.has("--cache-ram"),
            missing=tuple(f for f in REQUIRED if not h.has(f)),
        )


def dialect(m: ModelPlan, ctx: Context) -> Dialect:
    return Dialect.of(ctx.help_of(m.model.spec.bin or "llama-server"))


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    spec, rm = m.model.spec, m.model
    d = dialect(m, ctx)
    _refuse(m, ctx, d)
    out = [
        spec.bin or "llama-server",
        *model_flag("-m", rm),
        "-c",
        str(spec.context * spec.parallel),
        "-np",
        str(spec.parallel),
        "-ub",
        str(spec.ubatch),
        "-b",
        str(max(spec.ubatch, 2048)),
        *_flash_attn(spec.flash_attn, d),
        "-ctk",
        spec.kv_cache,
        "-ctv",
        spec.kv_cache,
        "-ngl",
        "0" if ctx.plan.platform.kind == "cpu" or spec.gpu is False else ALL_LAYERS,
    ]
    if m.split is not None:  # llama.cpp's RPC servers on the other nodes hold the blocks after (or before) its own
        split = m.split.args()
        out = out[:-2] + split
    if d.load_mode:
        out += ["--load-mode", LOAD_MODE[(rm.mmap, spec.mlock)]]
    else:
        out += [*([] if rm.mmap else ["--no-mmap"]), *(["--mlock"] if spec.mlock else [])]
    # llama.cpp's tools default to --fit on: at start they shrink unset parameters (context, offloaded layers) to
    # the free device memory. Every one is set here, and the model umemc budgeted is the model that runs.
    out += ["--fit", "off"] if d.fit else []
    # llama.cpp's buffer lines (the drift check, calibrate) are at level 4
    out += ["--log-verbosity", "4"] if d.verbosity else []
    if rm.mmproj_path is not None:
        out += ["--mmproj", str(rm.mmproj_path)]
    # its answers name the model as the stack does, not by the GGUF's file name or path (the gateway renames
    # them to what each client asked for; this is for a client that reaches the worker's port itself)
    out += ["--alias", m.name] if d.alias else []
    if rm.chat_template_file is not None:
        out += ["--chat-template-file", str(rm.chat_template_file)]
    elif spec.chat_template is not None:
        # a built-in name is applied by llama.cpp's own formatter, which runs only with Jinja off (with Jinja on, the
        # default since --no-jinja exists, the name itself is taken as the template's text), and a server with Jinja
        # off refuses every request with tools: where umemc has the format as Jinja, Jinja stays on with that text
        own = jinja(spec.chat_template) if d.jinja_default else None
        if own is not None:
            out += ["--chat-template", own]
        else:
            out += [*(["--no-jinja"] if d.jinja_default else []), "--chat-template", spec.chat_template]
    # the prompt cache in host memory grows to what it is given (8 GiB by default): what the stack counts
    out += ["--cache-ram", str(spec.prompt_cache // MIB)] if d.cache_ram else []
    if m.estimate.facts.get("family") == "embedding":
        out.append(d.embeddings)
    elif d.slot_save:  # the gateway saves its slots' KV before evicting it and restores them after its next start
        out += ["--slot-save-path", f"{SLOTS_DIR}/{m.name}"]
    threads = llama_threads(m, ctx)
    return out + ["--host", ctx.host, "--port", str(rm.port), *(["-t", str(threads)] if threads else []), *spec.args]


def _flash_attn(on: bool, d: Dialect) -> list[str]:
    if d.fa_value:
        return ["-fa", "on" if on else "off"]
    return ["-fa"] if on else []  # a switch, off by default


def _refuse(m: ModelPlan, ctx: Context, d: Dialect) -> None:
    """What the installed llama-server cannot do at all, located at the key that asks for it."""
    source, at = ctx.plan.source, ("models", m.name)
    which = f"this llama-server ({m.model.spec.bin or 'llama-server'}, version {d.version})"
    hint = "update llama.cpp (the server of a build from 2025-05 or later takes every flag umemc needs)"
    if d.missing:
        raise source.error(at + ("runtime",), f"{which} is too old: its --help lists no {', '.join(d.missing)}", hint)
    if m.model.mmproj_path is not None and not d.mmproj:
        raise source.error(at + ("mmproj",), f"{which} takes no --mmproj: it cannot load a vision projector", hint)
    if any(a.split("=", 1)[0] in ("--cache-ram", "-cram") for a in m.model.spec.args):
        raise source.error(
            at + ("args",), "--cache-ram in args: its memory would not be counted", 'give prompt_cache = "…" instead'
        )
    if m.model.chat_template_file is not None and not d.template_file:
        raise source.error(at + ("chat_template",), f"{which} takes no --chat-template-file", hint)


def pinned(argv: list[str], extra: int) -> list[str]:
    """The flags of a compiled argv that the installed --help must list, by their long names (the stack's own
    `args`, the last `extra` items, are the user's)."""
    return [LONG.get(a, a) for a in flags_of(argv, extra)]


def flags_of(argv: list[str], extra: int) -> list[str]:
    own = argv[1 : len(argv) - extra] if extra else argv[1:]
    return [a for a in own if re.fullmatch(r"--?[A-Za-z][\w-]*", a)]


# The flags of argv() that decide what llama.cpp allocates, with how many values each takes: llama-fit-params
# (the same tree's dry-run tool, umemc.estimate.dryrun) accepts these and refuses the server's own (--host, --port,
# --slot-save-path, --jinja...). The stack's `args` pass through when they are among them.
MEMORY_FLAGS = {
    "-m": 1, "-c": 1, "-np": 1, "-ub": 1, "-b": 1, "-fa": 1, "-ctk": 1, "-ctv": 1, "-ngl": 1, "--load-mode": 1,
    "--no-repack": 0, "-nr": 0, "--override-tensor": 1, "-ot": 1, "--n-cpu-moe": 1, "-ncmoe": 1, "--cpu-moe": 0,
    "-cmoe": 0, "--swa-full": 0, "--kv-unified": 0, "-kvu": 0, "--no-kv-offload": 0, "-nkvo": 0,
    "--tensor-split": 1, "-ts": 1, "--split-mode": 1, "-sm": 1, "--main-gpu": 1, "-mg": 1, "--device": 1,
    "-dev": 1, "--no-op-offload": 0, "--ctx-size": 1, "--parallel": 1, "--ubatch-size": 1, "--batch-size": 1,
    "--flash-attn": 1, "--cache-type-k": 1, "--cache-type-v": 1, "--n-gpu-layers": 1, "--gpu-layers": 1,
    "--rope-scaling": 1, "--rope-scale": 1, "--yarn-orig-ctx": 1, "--embeddings": 0, "--pooling": 1, "--rpc": 1,
}  # fmt: skip


def dry_run_args(argv: list[str]) -> list[str]:
    """The memory-relevant part of a compiled argv, for llama-fit-params (argv[0] dropped)."""
    out, i = [], 1
    while i < len(argv):
        arity = MEMORY_FLAGS.get(argv[i].split("=", 1)[0])
        if arity is None or "=" in argv[i]:
            out += [argv[i]] if arity is not None else []
            i += 1
            continue
        out += argv[i : i + 1 + arity]
        i += 1 + arity
    return out
