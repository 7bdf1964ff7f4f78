"""`<stack>.calibration.json`: what the real runtime measured, and the stack's lock.

For each llama.cpp-family model with a real file it records
- the file's identity (size, mtime, sha256 of its first 4 MiB) and its GGUF header facts (tensor
  bytes, types, shapes, metadata) — the *lock*: `umemc check` on a CI runner without the weights
  still uses exact sizes (source "lock"), and verifies them wherever the file is present;
- the memory-relevant flags it was started with and llama.cpp's own buffer report plus the
  process's resident memory after a warm-up request — the *calibration*: used instead of the
  estimate (source "measured") while the key still matches, ignored with a warning naming what
  changed otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .catalog.archs import LlmShape
from .estimate.gguf_file import GgufFacts

FORMAT, VERSION = "umemc-calibration", 1
HEAD_BYTES = 4 * 1024 * 1024
FLAG_KEYS = ("runtime", "context", "parallel", "ubatch", "kv_cache", "flash_attn", "mmap", "mlock", "kind")
# RS: a hybrid model's recurrent state (llama-memory-recurrent.cpp), counted with the KV cache as umemc does
_BUFFER = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")
MiB = 1024 * 1024


def path_for(stack: Path) -> Path:
    return stack.with_name(stack.stem + ".calibration.json")


def identity(path: Path) -> dict[str, Any]:
    st = path.stat()
    h = hashlib.sha256()
    with path.open("rb") as f:
        h.update(f.read(HEAD_BYTES))
    return {"size": st.st_size, "sha256_head": h.hexdigest()}


def header(facts: GgufFacts) -> dict[str, Any]:
    return {
        "tensor_bytes": facts.tensor_bytes,
        "n_tensors": facts.n_tensors,
        "type_counts": facts.type_counts,
        "file_type": facts.file_type,
        "general_arch": facts.general_arch,
        "shape": None if facts.shape is None else asdict(facts.shape),
        "repack_bytes": facts.repack_bytes,
        "skipped_bytes": facts.skipped_bytes,
    }


def facts_from_lock(entry: dict[str, Any], path: str) -> GgufFacts:
    h = entry["header"]
    shape = None
    if h["shape"] is not None:
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in h["shape"].items()}
        shape = LlmShape(**fields)
    return GgufFacts(
        path=path,
        tensor_bytes=h["tensor_bytes"],
        n_tensors=h["n_tensors"],
        type_counts=h["type_counts"],
        file_type=h["file_type"],
        shape=shape,
        general_arch=h["general_arch"],
        repack_bytes=h.get("repack_bytes", 0),
        skipped_bytes=h.get("skipped_bytes", 0),
    )


def parse_buffers(log: str) -> dict[str, dict[str, int]]:
    """llama.cpp's `<device> <kind> buffer size = N MiB` lines: {device: {model|kv|compute|output: bytes}}.
    A reloaded context prints its lines again: the last report of each buffer counts."""
    out: dict[str, dict[str, int]] = {}
    for device, kind, mib in _BUFFER.findall(log):
        out.setdefault(device, {})[kind.lower()] = round(float(mib) * MiB)
    return out


def totals(buffers: dict[str, dict[str, int]]) -> dict[str, int]:
    out = {"model": 0, "kv": 0, "compute": 0, "output": 0}
    for kinds in buffers.values():
        for kind, size in kinds.items():
            out["kv" if kind == "rs" else kind] += size
    return out


def host_bytes(buffers: dict[str, dict[str, int]]) -> int:
    """Buffers in host memory (they are part of the process's RSS): devices named CPU*."""
    return sum(sum(k.values()) for d, k in buffers.items() if d.upper().startswith("CPU"))


def load(stack: Path) -> dict[str, Any]:
    path = path_for(stack)
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        return {}
    return dict(doc.get("models", {}))


def save(stack: Path, models: dict[str, Any]) -> Path:
    path = path_for(stack)
    doc = {"format": FORMAT, "version": VERSION, "models": dict(sorted(models.items()))}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def flag_changes(recorded: dict[str, Any], current: dict[str, Any], keys: tuple[str, ...] = FLAG_KEYS) -> list[str]:
    return [f"{k} {recorded.get(k)!r} -> {current.get(k)!r}" for k in keys if recorded.get(k) != current.get(k)]
