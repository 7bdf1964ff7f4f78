"""ComfyUI (`main.py` in its checkout; `cwd` is the checkout, `bin` its Python). ComfyUI sizes
itself from the device's total memory; `--reserve-vram` leaves the rest of the GPU window to the
other workers, so ComfyUI's own model management stays inside its quota."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...units import GiB

if TYPE_CHECKING:
    from ...budget.plan import ModelPlan
    from . import Context

NAME = "comfyui"
HEALTH = "/system_stats"
FLAGS_MATCH = "ComfyUI 0.3.x"
NEEDS_MODEL_FILE = False  # cannot start without a weights file
REPORTS_BUFFERS = False  # its log states llama.cpp's buffer sizes (drift check)
HELP_MODULE: str | None = None  # `python -m MODULE --help` instead of `ARGV0 --help`
PINNED = ("--listen", "--port", "--reserve-vram")


def reserve_gib(m: ModelPlan, ctx: Context) -> float:
    window = ctx.plan.platform.gpu_window or ctx.plan.platform.memory
    return max(0.0, (window - m.quota_hard) / GiB)


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    spec, rm = m.model.spec, m.model
    return [
        spec.bin or "python3",
        "main.py",
        "--listen",
        ctx.host,
        "--port",
        str(rm.port),
        "--reserve-vram",
        f"{reserve_gib(m, ctx):.2f}",
        *spec.args,
    ]
