"""llama.cpp's llama-server. Flag spelling as of llama.cpp b6500+ (2025-09: `-fa` takes on|off|auto)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import model_flag

if TYPE_CHECKING:
    from ..budget import ModelPlan
    from . import Context

NAME = "llama-server"
HEALTH = "/health"
FLAGS_MATCH = "llama.cpp b6500 (2025-09) and later"
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
    "--mlock",
    "--no-mmap",
    "--mmproj",
    "--host",
    "--port",
)
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
        "0" if ctx.plan.loaded.platform.kind == "cpu" else ALL_LAYERS,
    ]
    if spec.mlock:
        out.append("--mlock")
    if not rm.mmap:
        out.append("--no-mmap")
    if rm.mmproj_path is not None:
        out += ["--mmproj", str(rm.mmproj_path)]
    if m.estimate.facts.get("family") == "embedding":
        out.append("--embeddings")
    return out + ["--host", ctx.host, "--port", str(rm.port), *spec.args]
