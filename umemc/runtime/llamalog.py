"""llama.cpp's own report of what it allocated, read from a worker's log: the lines
`<device> <kind> buffer size = N MiB` (llama-model.cpp, llama-context.cpp, llama-kv-cache.cpp,
llama-memory-recurrent.cpp), and on Metal the GPU's working-set limit (ggml-metal's device init). Used by
`umemc calibrate` and by the enforcer's drift and GPU-limit checks."""

from __future__ import annotations

import re

from ..lockfile import LOG_FIGURE, MAX_BYTES, BufferReport

# llama.cpp builds before mid-2025 print a model's weights as `llm_load_tensors:      CUDA0 buffer size = N MiB` (no
# kind: llama.cpp's llm_load_tensors of those builds), their context as `llama_new_context_with_model:`
_BUFFER = re.compile(rf"(\S+)\s+(?:(model|KV|RS|compute|output) )?buffer size =\s+{LOG_FIGURE} MiB\b")
# A model (re)load and a context (re)creation start their reports afresh (llama-model.cpp load_tensors,
# llama-context.cpp's constructor); inside one report, a model with sliding-window layers logs two KV caches
# (llama-kv-cache-iswa.cpp: the full-size and the windowed one), a hybrid a KV cache and a recurrent state.
_MODEL_LOAD = ("load_tensors: loading model tensors", "llama_model_loader: loaded meta data")
_NEW_CONTEXT = re.compile(r"llama_context: constructing llama_context|llama_new_context_with_model: n_ctx\s+=")
_SUMMED = ("kv", "rs", "model")
MiB = 1024 * 1024


def parse_buffers(log: str) -> BufferReport:
    """{device: {model|kv|rs|compute|output: bytes}} of the last model load and the last context: a reloaded
    model or context prints its lines again, and that report replaces the earlier one; within one report the
    lines of several caches (or weight buffers) on one device add up."""
    model: BufferReport = {}
    context: BufferReport = {}
    for line in log.splitlines():
        if any(mark in line for mark in _MODEL_LOAD):
            model = {}
        elif _NEW_CONTEXT.search(line):
            context = {}
        m = _BUFFER.search(line)
        if m is None:
            continue
        device, kind, size = m.group(1), (m.group(2) or "model").lower(), round(float(m.group(3)) * MiB)
        if size > MAX_BYTES:  # no machine's: not a report of one
            continue
        slot = (model if kind == "model" else context).setdefault(device, {})
        slot[kind] = slot.get(kind, 0) + size if kind in _SUMMED else size
    out: BufferReport = {}
    for part in (model, context):
        for device, kinds in part.items():
            out.setdefault(device, {}).update(kinds)
    return out


_WORKING_SET = re.compile(rf"recommendedMaxWorkingSetSize\s*=\s*{LOG_FIGURE} MB\b")


def metal_working_set(log: str) -> int | None:
    """Metal's recommendedMaxWorkingSetSize (what macOS lets the GPU keep resident: iogpu.wired_limit_mb, or its
    default when 0), in bytes, from the last `ggml_metal_device_init: recommendedMaxWorkingSetSize  = 26800.60 MB`
    of a llama.cpp log (ggml-metal prints the size / 1e6 with two decimals); None where the log has none."""
    found = _WORKING_SET.findall(log)
    return round(float(found[-1]) * 1e6) if found else None
