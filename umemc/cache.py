"""umemc's cache directory: what it learnt of things outside the stack that it can learn again (the GGUF headers
of Hub files, the `--help` of runtimes), never a result. UMEMC_CACHE_DIR, else $XDG_CACHE_HOME/umemc, else
~/.cache/umemc."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    explicit = os.environ.get("UMEMC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "umemc"


def write_atomic(path: Path, text: str) -> None:
    """Best effort: a cache that cannot be written is a cache that is not kept."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
