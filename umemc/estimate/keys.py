"""What an answer recorded in a stack's lock (STACK.calibration.json) is an answer for: the settings that change what
a model allocates. The one place they are spelled: `umemc calibrate` and llama.cpp's dry run record them with an
answer, and the estimator uses a recorded answer only while they are still what the stack says."""

from __future__ import annotations

from typing import Any

from ..stack.resolved import LoadedStack, ResolvedModel


def llama(loaded: LoadedStack, m: ResolvedModel) -> dict[str, object]:
    """A llama.cpp worker's measured run (umemc calibrate)."""
    s = m.spec
    return {
        "runtime": s.runtime,
        "context": s.context,
        "parallel": s.parallel,
        "ubatch": s.ubatch,
        "kv_cache": s.kv_cache,
        "flash_attn": s.flash_attn,
        "mmap": m.mmap,
        "mlock": s.mlock,
        "kind": loaded.platform.kind,
    }


def dry_run(loaded: LoadedStack, m: ResolvedModel) -> dict[str, object]:
    """llama.cpp's own dry run: a measured run's key, the runtime's executable and its extra argv (an -ot,
    --no-repack or --swa-full there changes what llama.cpp allocates)."""
    return llama(loaded, m) | {"bin": m.spec.bin, "args": list(m.spec.args)}


def torch(loaded: LoadedStack, m: ResolvedModel) -> dict[str, object]:
    """A torch worker's measured warm-up."""
    s = m.spec
    return {
        "runtime": s.runtime,
        "module": s.module,
        "quant": m.quant,
        "image_size": s.image_size,
        "batch": s.batch,
        "audio_seconds": s.audio_seconds,
        "kind": loaded.platform.kind,
    }


def changes(recorded: dict[str, Any], current: dict[str, object], keys: tuple[str, ...] | None = None) -> list[str]:
    """How the recorded key differs from the current one, said key by key (over `keys`, default the current key's:
    a dry run is compared over what was recorded with it, so a key a later umemc adds does not void it)."""
    over = tuple(current) if keys is None else keys
    return [f"{k} {recorded.get(k)!r} -> {current.get(k)!r}" for k in over if recorded.get(k) != current.get(k)]
