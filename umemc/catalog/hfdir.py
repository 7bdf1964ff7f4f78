"""A Hugging Face model directory (config.json and safetensors files), as vLLM and MLX load it, read without
reading a weight.

A safetensors file starts with an 8-byte little-endian header length N and N bytes of JSON: for every tensor
its dtype, shape and byte range in the data that follows (safetensors' format spec,
huggingface/safetensors README "Format"). The byte ranges are exact: the weights a runtime holds are what the
files store (quantized or not: an MLX 4-bit model stores packed U32 weights with their scales and biases;
vLLM holds them in the dtype it is given, which umemc pins to the stored one). config.json gives the
attention geometry the KV cache is sized from (transformers' PretrainedConfig names: num_hidden_layers,
num_key_value_heads, head_dim, sliding_window, layer_types; a multimodal model nests them in text_config).
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# safetensors refuses a header over 100 MB (its MAX_HEADER_SIZE); umemc reads none larger
MAX_HEADER = 100_000_000
MAX_CONFIG = 4 * 1024 * 1024
# bytes per element of the safetensors dtypes (safetensors' Dtype)
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
# config.json's torch dtype names -> bytes per element
TORCH_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


class NotAModel(ValueError):
    """The directory is not a Hugging Face model umemc can size: one sentence saying why."""


@dataclass(frozen=True)
class Attention:
    """What the KV cache is sized from."""

    n_layer: int
    n_kv_head: int
    head_dim: int
    sliding_window: int | None  # tokens a sliding-window layer keeps
    sliding_layers: int  # how many of n_layer use the window
    max_position: int | None  # max_position_embeddings: the longest context the model was made for


@dataclass(frozen=True)
class HfModel:
    path: Path
    config: dict[str, object]
    files: tuple[Path, ...]
    tensor_bytes: int  # every tensor's bytes as stored
    by_dtype: dict[str, int]  # dtype -> bytes stored in it
    n_tensors: int
    attention: Attention
    # the dtype the engine runs it in: the float dtype most of its bytes are stored in (an engine pinned to it holds
    # the weights as stored; a quantized model's scales say its activations'), else config.json's torch_dtype
    dtype: str
    quantization: dict[str, object] = field(default_factory=dict)  # MLX's or a quantization_config
    vocab: int = 0

    @property
    def text(self) -> dict[str, object]:
        """The language model's configuration: config.json's, or its text_config (a multimodal model's)."""
        return text_config(self.config)

    @property
    def dtype_bytes(self) -> int:
        return TORCH_DTYPE_BYTES.get(self.dtype, 2)


def is_model_dir(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file() and any(path.glob("*.safetensors"))


def read(path: Path) -> HfModel:
    """The model in directory `path`: raises NotAModel saying what is missing or wrong (OSError for a file that
    cannot be read)."""
    if not path.is_dir():
        raise NotAModel(f"{path} is not a directory (a Hugging Face model is a directory of config.json and "
                        "*.safetensors files)")  # fmt: skip
    config = _config(path)
    files = _files(path)
    by_dtype: dict[str, int] = {}
    total = count = 0
    for file in files:
        for stored, nbytes in _tensors(file):
            by_dtype[stored] = by_dtype.get(stored, 0) + nbytes
            total += nbytes
            count += 1
    geometry = text_config(config)
    named = [d.get(k) for d in (geometry, config) for k in ("torch_dtype", "dtype")]
    dtype = next((d for d in named if isinstance(d, str) and d in TORCH_DTYPE_BYTES), None)
    quant = config.get("quantization") or config.get("quantization_config") or {}
    vocab = geometry.get("vocab_size", 0)
    return HfModel(
        path=path,
        config=config,
        files=tuple(files),
        tensor_bytes=total,
        by_dtype=by_dtype,
        n_tensors=count,
        attention=_attention(geometry),
        dtype=_stored_dtype(by_dtype) or dtype or "float16",
        quantization=quant if isinstance(quant, dict) else {},
        vocab=vocab if isinstance(vocab, int) and vocab > 0 else 0,
    )


def text_config(config: dict[str, object]) -> dict[str, object]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _regular(path: Path) -> os.stat_result:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotAModel(f"{path} is not a regular file")
    return st


def _config(path: Path) -> dict[str, object]:
    file = path / CONFIG
    if not file.exists():
        raise NotAModel(f"no {CONFIG} in {path}: not a Hugging Face model directory")
    if _regular(file).st_size > MAX_CONFIG:
        raise NotAModel(f"{file} is larger than any model's configuration ({MAX_CONFIG >> 20} MiB)")
    try:
        doc = json.loads(file.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise NotAModel(f"{file} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise NotAModel(f"{file} holds no object")
    return doc


def _files(path: Path) -> list[Path]:
    """The weights files: those a sharded model's index names, else every *.safetensors here."""
    index = path / INDEX
    if index.exists():
        if _regular(index).st_size > MAX_CONFIG * 16:
            raise NotAModel(f"{index} is larger than any index")
        try:
            weight_map = json.loads(index.read_bytes()).get("weight_map", {})
        except (ValueError, AttributeError, RecursionError):
            raise NotAModel(f"{index} is not a safetensors index (no weight_map)") from None
        if not isinstance(weight_map, dict):
            raise NotAModel(f"{index} is not a safetensors index (no weight_map)")
        names = sorted({str(v) for v in weight_map.values()})
        files = [path / n for n in names]
        if any("/" in n or n.startswith(".") for n in names):
            raise NotAModel(f"{index} names a file outside its directory")
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise NotAModel(f"{index} names {', '.join(missing[:3])}, not in {path} (a download not finished?)")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise NotAModel(f"no *.safetensors file in {path}")
    return files


def _tensors(file: Path) -> list[tuple[str, int]]:
    """(dtype, bytes) of every tensor in a safetensors file, from its header; checked against the file's size."""
    size = _regular(file).st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise NotAModel(f"{file} is not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise NotAModel(f"{file} is not a safetensors file (a header of {n} bytes)")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise NotAModel(f"{file} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise NotAModel(f"{file} is not a safetensors file (its header is not an object)")
    out: list[tuple[str, int]] = []
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            elements = 1
            for d in shape:
                elements *= int(d)
            ok = dtype in DTYPE_BYTES and 0 <= begin <= end <= data and end - begin == elements * DTYPE_BYTES[dtype]
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise NotAModel(f"{file}: tensor {name[:100]!r} is not described as safetensors describes one")
        out.append((dtype, end - begin))
    return out


def positive(doc: dict[str, object], *keys: str) -> int | None:
    """The first of the keys that holds a positive integer (a config.json is input: any other value is none)."""
    for key in keys:
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _attention(doc: dict[str, object]) -> Attention:
    n_layer = positive(doc, "num_hidden_layers", "n_layer", "num_layers")
    n_head = positive(doc, "num_attention_heads", "n_head")
    hidden = positive(doc, "hidden_size", "n_embd", "d_model")
    if n_layer is None or n_head is None:
        raise NotAModel("config.json gives no num_hidden_layers and num_attention_heads: not a language model "
                        "umemc can size")  # fmt: skip
    n_kv = positive(doc, "num_key_value_heads", "num_kv_heads") or n_head
    head_dim = positive(doc, "head_dim") or ((hidden // n_head) if hidden else None)
    if head_dim is None:
        raise NotAModel("config.json gives neither head_dim nor hidden_size")
    window = positive(doc, "sliding_window")
    types = doc.get("layer_types")
    if isinstance(types, list) and window:
        sliding = sum(1 for t in types if t == "sliding_attention")
    elif window and doc.get("use_sliding_window", True) is not False:
        pattern = positive(doc, "sliding_window_pattern")  # Gemma 3: every Nth layer is global
        sliding = n_layer - n_layer // pattern if pattern else n_layer
    else:
        sliding, window = 0, None
    return Attention(n_layer, n_kv, head_dim, window, sliding, positive(doc, "max_position_embeddings"))


def _stored_dtype(by_dtype: dict[str, int]) -> str | None:
    """The float dtype most bytes are stored in, as a torch name; None where no tensor is a float."""
    names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
    floats = {k: v for k, v in by_dtype.items() if k in names}
    return names[max(floats, key=lambda k: floats[k])] if floats else None
