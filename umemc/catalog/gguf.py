"""The GGUF file signature (ggml's gguf.h: the first four bytes of every GGUF file)."""

from __future__ import annotations

from pathlib import Path

GGUF_MAGIC = b"GGUF"


def is_gguf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC
