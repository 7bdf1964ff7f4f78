"""Platform facts measured on real machines, shared by the compile side (the presets, a stack's default GPU window)
and the runtime (preflight, `umemc doctor`): each with the public report it comes from."""

from __future__ import annotations

from typing import NamedTuple

from .units import GiB


class AppleDefault(NamedTuple):
    bytes: int
    measured: bool  # Macs of this memory were measured to give it; else the nearest measured rule, an estimate
    source: str


# macOS's default GPU wired limit (iogpu.wired_limit_mb = 0; Metal's recommendedMaxWorkingSetSize) as measured Macs
# report it, by installed memory (GiB): 2/3 of RAM at 16 and 32 GiB (10922.67 and 21845.34 MiB:
# abetlen/llama-cpp-python#687, ollama/ollama#434, ggml-org/llama.cpp#2011), 3/4 at 96 GiB (73728 MiB:
# ggml-org/llama.cpp#3213), and 107.52 GiB at 128 GiB on two Macs of different chips (antirez/ds4#893; 0.84 of RAM,
# not 3/4). Between measured sizes the rule of the next larger measured Mac (of the largest, above 128 GiB) is an
# estimate, said as one: 3/4 of RAM from 33 to 96 GiB is also what macOS's older rule gave.
APPLE_MEASURED: dict[int, tuple[int, int, str]] = {
    16: (2, 3, "abetlen/llama-cpp-python#687"),
    32: (2, 3, "ollama/ollama#434, ggml-org/llama.cpp#2011"),
    96: (3, 4, "ggml-org/llama.cpp#3213"),
    128: (21, 25, "antirez/ds4#893"),
}


def apple_default_window(memory: int) -> AppleDefault:
    """macOS's default GPU wired limit for a Mac of `memory` bytes: measured where Macs of that size were, else by
    the rule of the next larger measured size (of the largest above it) as an estimate."""
    gib = memory / GiB
    size = min((s for s in APPLE_MEASURED if s >= gib - 0.5), default=max(APPLE_MEASURED))
    num, den, source = APPLE_MEASURED[size]
    measured = abs(gib - size) < 0.5
    how = source if measured else f"the rule measured at {size} GiB ({source}), not measured at this size"
    return AppleDefault(memory * num // den, measured, how)
