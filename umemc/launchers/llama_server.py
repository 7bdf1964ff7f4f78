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
    out += ["--log-verbosity", "4"]  # llama.cpp's buffer lines (the drift check, calibrate) are at level 4
    if rm.mmproj_path is not None:
        out += ["--mmproj", str(rm.mmproj_path)]
    if m.estimate.facts.get("family") == "embedding":
        out.append("--embeddings")
    else:  # the gateway saves its slots' KV before evicting it and restores them after its next start
        out += ["--slot-save-path", f"{SLOTS_DIR}/{m.name}"]
    return out + ["--host", ctx.host, "--port", str(rm.port), *spec.args]
