"""llama.cpp's llama-server. Flag spelling of the llama.cpp that llama-cpp-python 0.3.36 vendors (2026-10):
`-fa` takes on|off|auto, and `--load-mode none|mmap|mlock|mmap+mlock` replaced `--no-mmap` and `--mlock`
(preflight refuses an older llama-server that does not list the pinned flags in its --help)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import model_flag

if TYPE_CHECKING:
    from ..budget import ModelPlan
    from . import Context

NAME = "llama-server"
HEALTH = "/health"
FLAGS_MATCH = "llama.cpp with --load-mode (2026-10) and later"
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
SLOTS_DIR = "@UMEMC_STATE@/slots"  # filled in by the exec wrapper (umemc.runtime.wrap.fill_state)
LOAD_MODE = {(False, False): "none", (True, False): "mmap", (False, True): "mlock", (True, True): "mmap+mlock"}
ALL_LAYERS = "999"  # more than any model has: every layer offloaded (the estimate assumes it)


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    spec, rm = m.model.spec, m.model
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
        "-fa",
        "on" if spec.flash_attn else "off",
        "-ctk",
        spec.kv_cache,
        "-ctv",
        spec.kv_cache,
        "-ngl",
        "0" if ctx.plan.platform.kind == "cpu" else ALL_LAYERS,
    ]
    out += ["--load-mode", LOAD_MODE[(rm.mmap, spec.mlock)]]
    # llama.cpp's tools default to --fit on: at start they shrink unset parameters (context, offloaded layers) to
    # the free device memory. Every one is set here, and the model umemc budgeted is the model that runs.
    out += ["--fit", "off"]
    out += ["--log-verbosity", "4"]  # llama.cpp's buffer lines (the drift check, calibrate) are at level 4
    if rm.mmproj_path is not None:
        out += ["--mmproj", str(rm.mmproj_path)]
    if m.estimate.facts.get("family") == "embedding":
        out.append("--embeddings")
    else:  # the gateway saves its slots' KV before evicting it and restores them after its next start
        out += ["--slot-save-path", f"{SLOTS_DIR}/{m.name}"]
    return out + ["--host", ctx.host, "--port", str(rm.port), *spec.args]


# The flags of argv() that decide what llama.cpp allocates, with how many values each takes: llama-fit-params
# (the same tree's dry-run tool, umemc.dryrun) accepts these and refuses the server's own (--host, --port,
# --slot-save-path, --jinja...). The stack's `args` pass through when they are among them.
MEMORY_FLAGS = {
    "-m": 1, "-c": 1, "-np": 1, "-ub": 1, "-b": 1, "-fa": 1, "-ctk": 1, "-ctv": 1, "-ngl": 1, "--load-mode": 1,
    "--no-repack": 0, "-nr": 0, "--override-tensor": 1, "-ot": 1, "--n-cpu-moe": 1, "-ncmoe": 1, "--cpu-moe": 0,
    "-cmoe": 0, "--swa-full": 0, "--kv-unified": 0, "-kvu": 0, "--no-kv-offload": 0, "-nkvo": 0,
    "--tensor-split": 1, "-ts": 1, "--split-mode": 1, "-sm": 1, "--main-gpu": 1, "-mg": 1, "--device": 1,
    "-dev": 1, "--no-op-offload": 0, "--ctx-size": 1, "--parallel": 1, "--ubatch-size": 1, "--batch-size": 1,
    "--flash-attn": 1, "--cache-type-k": 1, "--cache-type-v": 1, "--n-gpu-layers": 1, "--gpu-layers": 1,
    "--rope-scaling": 1, "--rope-scale": 1, "--yarn-orig-ctx": 1, "--embeddings": 0, "--pooling": 1,
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
