"""llama.cpp's own report of what it allocated, read from a worker's log: the lines
`<device> <kind> buffer size = N MiB` (llama-model.cpp, llama-context.cpp, llama-kv-cache.cpp,
llama-memory-recurrent.cpp). Used by `umemc calibrate` and by the enforcer's drift check."""

from __future__ import annotations

import re

from ..lockfile import BufferReport

_BUFFER = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")
MiB = 1024 * 1024


def parse_buffers(log: str) -> BufferReport:
    """{device: {model|kv|rs|compute|output: bytes}}. A reloaded context prints its lines again: the last
    report of each buffer counts."""
    out: BufferReport = {}
    for device, kind, mib in _BUFFER.findall(log):
        out.setdefault(device, {})[kind.lower()] = round(float(mib) * MiB)
    return out
