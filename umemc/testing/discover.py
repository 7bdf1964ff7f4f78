"""Sparse GGUFs of architectures umemc has no preset for, laid out by llama.cpp itself.

A model's metadata (its architecture's keys, from the published config) decides every tensor's shape; which
tensors an architecture needs is llama.cpp's loader's knowledge (src/models/<arch>.cpp, load_arch_tensors). So
the layout is asked of llama.cpp: a GGUF with the keys and the tensors found so far is loaded with no_alloc
(nothing is read or allocated) and its error names the next tensor it wants (`missing tensor 'X'`, `tensor 'X'
not found`) or the shape it expected (`tensor 'X' has wrong shape; expected 512, 2048, got ...`), until it loads.
Tensors a published file has that llama.cpp does not insist on (an untied output, biases) are offered
(`optional`): kept where llama.cpp loads them. Discovery runs on a small vocabulary (fast: a few ms a load);
the real one is put back into every dimension that held it. The tensors are then written with llama.cpp's
quantization mix of the chosen file type (umemc.catalog.quant.mix_types) and no data (holes), like
umemc.testing.sparsegguf.

The loads run in a llama-cpp-python interpreter (a subprocess: the benchmark's may not be umemc's), whose log
callback is synchronous: llama.cpp's own tools log through a thread that an abort can cut off.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..catalog.quant import mix_types, tensor_bytes
from .sparsegguf import FILE_TYPE_ID
from .tinygguf import add_vocabulary

Shape = tuple[int, ...]
DISCOVERY_VOCAB = 1031  # a prime no other dimension of a model is: every dimension equal to it is the vocabulary


@dataclass(frozen=True)
class ArchSpec:
    """A model of an architecture: its GGUF keys (without the `<arch>.` prefix) and vocabulary."""

    name: str
    arch: str  # general.architecture
    keys: dict[str, Any]
    n_vocab: int
    source: str
    optional: tuple[str, ...] = ("output.weight",)  # "blk.N." expands to every block
    general: dict[str, Any] = field(default_factory=dict)  # general.* keys


_LOADER = r"""
import ctypes, json, sys
from llama_cpp import llama_cpp as L
LOG = []
@L.llama_log_callback
def _log(level, text, user):
    LOG.append(text.decode("utf-8", "replace"))
L.llama_log_set(_log, ctypes.c_void_p(0))
L.llama_backend_init()
for line in sys.stdin:
    LOG.clear()
    p = L.llama_model_default_params()
    p.no_alloc = True
    p.load_mode = L.LLAMA_LOAD_MODE_NONE
    m = L.llama_model_load_from_file(line.strip().encode(), p)
    if m:  # the graph too: a tensor the loader calls optional may be one the graph needs (a crash here)
        c = L.llama_context_default_params()
        c.n_ctx = 512
        ctx = L.llama_init_from_model(m, c)
        if ctx:
            L.llama_free(ctx)
        L.llama_model_free(m)
    print(json.dumps({"ok": bool(m), "log": "".join(LOG)}), flush=True)
"""
_MISSING = re.compile(r"(?:missing tensor '([^']+)'|tensor '([^']+)' not found)")
_SHAPE = re.compile(r"tensor '([^']+)' has wrong shape; expected\s+([\d, ]+), got")
_LOADING = re.compile(r"loading tensor (\S+)")
_KEY = re.compile(r"key not found in model: (\S+)")


class LayoutError(Exception):
    pass


def discover(spec: ArchSpec, work: Path, python: str) -> dict[str, Shape]:
    """Every tensor llama.cpp loads for `spec`, in load order, with its shape (ggml order, ne0 first), at the
    real vocabulary size."""
    n_layer = int(spec.keys["block_count"])
    tensors: dict[str, Shape] = {"token_embd.weight": (1,)}
    for pattern in spec.optional:
        for name in _expand(pattern, n_layer):
            tensors[name] = (1,)
    kinds: dict[str, Shape] = {}
    path = work / f"{spec.name}.layout.gguf"
    loader = subprocess.Popen(
        [python, "-c", _LOADER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    try:
        for _ in range(20 * n_layer + 200):
            _write(path, spec, tensors, "F32", DISCOVERY_VOCAB)
            assert loader.stdin is not None and loader.stdout is not None
            loader.stdin.write(f"{path}\n")
            reply = loader.stdout.readline()
            if not reply:
                raise LayoutError(
                    f"{spec.name}: llama.cpp crashed building the graph: a tensor its loader calls optional is one "
                    "the graph uses (name it in ArchSpec.optional)"
                )
            answer = json.loads(reply)
            if answer["ok"]:
                return {name: _vocab(shape, spec.n_vocab) for name, shape in tensors.items()}
            tensors = _next(answer["log"], tensors, kinds)
        raise LayoutError(f"{spec.name}: llama.cpp's layout did not settle")
    finally:
        loader.kill()
        loader.wait()
        path.unlink(missing_ok=True)


def _next(log: str, tensors: dict[str, Shape], kinds: dict[str, Shape]) -> dict[str, Shape]:
    """The tensor list after one refusal."""
    if m := _KEY.search(log):
        raise LayoutError(f"llama.cpp needs the key {m.group(1)}")
    if m := _SHAPE.search(log):
        name, shape = m.group(1), tuple(int(x) for x in m.group(2).split(","))
        kinds[_kind(name)] = shape
        return {**tensors, name: shape}
    if m := _MISSING.search(log):
        name = m.group(1) or m.group(2)
        return {**tensors, name: kinds.get(_kind(name), (1,))}
    if "wrong number of tensors" in log:  # offered tensors llama.cpp does not use
        used = set(_LOADING.findall(log))
        return {k: v for k, v in tensors.items() if k in used}
    raise LayoutError("llama.cpp refused the layout: " + " | ".join(log.strip().splitlines()[-3:]))


def _kind(name: str) -> str:
    return re.sub(r"blk\.\d+\.", "blk.N.", name)


def _expand(pattern: str, n_layer: int) -> list[str]:
    return [pattern.replace("blk.N.", f"blk.{i}.") for i in range(n_layer)] if "blk.N." in pattern else [pattern]


def _vocab(shape: Shape, n_vocab: int) -> Shape:
    return tuple(n_vocab if d == DISCOVERY_VOCAB else d for d in shape)


def write_discovered(path: Path, spec: ArchSpec, tensors: dict[str, Shape], ftype: str) -> Path:
    """The full-size sparse file: `tensors` (from discover) typed by llama.cpp's mix for `ftype`."""
    return _write(path, spec, tensors, ftype, spec.n_vocab)


def _write(path: Path, spec: ArchSpec, tensors: dict[str, Shape], ftype: str, n_vocab: int) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(f"sparse-{spec.name}-{ftype}")
    for k, v in spec.general.items():
        _add(w, f"general.{k}", v)
    for k, v in spec.keys.items():
        _add(w, f"{spec.arch}.{k}", v)
    w.add_file_type(FILE_TYPE_ID.get(ftype, 0))
    add_vocabulary(w, n_vocab)
    items = list(tensors.items())
    n_kv = spec.keys.get("attention.head_count_kv", 1)
    n_head = spec.keys.get("attention.head_count", 1)
    gqa = max(1, _first(n_head) // max(1, max(_ints(n_kv))))
    types = (
        ["F32"] * len(items)
        if ftype == "F32"
        else mix_types(
            ftype,
            items,
            gqa,
            is_70b=False,
            n_layer=int(spec.keys["block_count"]),
            n_expert=int(spec.keys.get("expert_count", 0)),
        )  # fmt: skip
    )
    for (name, ne), t in zip(items, types, strict=True):
        qtype = gguf.GGMLQuantizationType[t]
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), tensor_bytes(t, ne), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    data = sum(w.ggml_pad(tensor_bytes(t, ne), w.data_alignment) for (_, ne), t in zip(items, types, strict=True))
    fout.truncate(fout.tell() + data)  # a hole: no disk space, reads as zeros
    w.close()
    return path


def _add(w: Any, key: str, value: Any) -> None:
    import gguf

    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], bool):
        w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.BOOL)
    elif isinstance(value, list):
        w.add_array(key, value)
    else:
        raise TypeError(f"{key}: {value!r}")


def _ints(value: Any) -> list[int]:
    return [int(x) for x in value] if isinstance(value, list) else [int(value)]


def _first(value: Any) -> int:
    return _ints(value)[0]
