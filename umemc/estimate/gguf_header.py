"""A GGUF header read for what an estimate needs, in one pass over the memory-mapped file.

gguf's `GGUFReader` builds a numpy view for every part of every field: a real Llama-3 file (128k
tokens, 280k merges) takes 10-30 s on a slow core, every `umemc check`. The header itself is simple
(gguf-py/gguf/gguf_reader.py and llama.cpp's gguf.cpp read the same layout): magic, version, counts,
then key/value pairs and tensor infos. This reader walks it with struct, skips the tokenizer's string
arrays by their lengths (it only counts the tokens), and takes the type table (block size, bytes per
block) and type names from the gguf package, so the arithmetic is the library's.
tests/estimate/test_gguf_files.py checks it against GGUFReader on the same files.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, NamedTuple

# value types (GGUFValueType)
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class HeaderError(Exception):
    pass


class Truncated(HeaderError):
    """The header runs past the bytes given: a file cut short, or a prefix too short (umemc.hub reads more)."""


class Tensor(NamedTuple):
    name: str
    type_name: str
    shape: tuple[int, ...]  # ggml order: ne0 (the row length) first
    n_bytes: int
    offset: int = 0  # where its data starts in the file's data section


class Header(NamedTuple):
    fields: dict[str, Any]  # scalars, strings, integer/float arrays; string arrays are left out
    counts: dict[str, int]  # the length of every array field (string arrays included)
    tensors: list[Tensor]


def read_header(path: Path) -> Header:
    import gguf  # the type table; no numpy array is built

    with path.open("rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise HeaderError("the file is empty") from None
    with buf:
        return _parse(buf, gguf)


class _Reader:
    """Little-endian reads from the mapped header, each checked against the file's end."""

    def __init__(self, buf: mmap.mmap | bytes):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise Truncated(f"truncated at byte {self.pos}")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise Truncated(f"truncated string at byte {self.pos}")
        text = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return text

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            if self.pos + 8 > len(self.buf):
                raise Truncated(f"truncated at byte {self.pos}")
            (n,) = struct.unpack_from("<Q", self.buf, self.pos)
            self.pos += 8 + n
        if self.pos > len(self.buf):
            raise Truncated("truncated string array")

    def array(self, key: str, etype: int, count: int) -> list[Any] | None:
        """A numeric array's values; a string array is skipped (None): umemc reads only its length."""
        if etype == _STRING:
            self.skip_strings(count)
            return None
        if etype not in _SCALAR:
            raise HeaderError(f"{key}: unsupported array element type {etype}")
        fmt = _SCALAR[etype]
        size = struct.calcsize("<" + fmt) * count
        if self.pos + size > len(self.buf):
            raise Truncated(f"truncated array {key}")
        values = list(struct.unpack_from(f"<{count}{fmt}", self.buf, self.pos))
        self.pos += size
        return values

    def field(self, fields: dict[str, Any], counts: dict[str, int]) -> None:
        key = self.string()
        vtype = self.take("I")
        if vtype == _ARRAY:
            etype, count = self.take("I"), self.take("Q")
            counts[key] = count
            values = self.array(key, etype, count)
            if values is not None:
                fields[key] = values
        elif vtype == _STRING:
            fields[key] = self.string()
        elif vtype in _SCALAR:
            fields[key] = self.take(_SCALAR[vtype])
        else:
            raise HeaderError(f"{key}: unknown value type {vtype}")

    def tensor(self, gguf: Any) -> Tensor:
        name = self.string()
        dims = tuple(self.take("Q") for _ in range(self.take("I")))
        type_id = self.take("I")
        offset = self.take("Q")  # in the data section
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            raise HeaderError(f"tensor {name}: unknown type {type_id}") from None
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        elements = 1
        for d in dims:
            elements *= d
        return Tensor(name, qtype.name, dims, elements // block * size, offset)


def parse_prefix(buf: bytes) -> Header:
    """The header from the file's first bytes (Truncated when they stop inside it)."""
    import gguf

    return _parse(buf, gguf)


def _parse(buf: mmap.mmap | bytes, gguf: Any) -> Header:
    if bytes(buf[:4]) != b"GGUF":
        raise HeaderError("not a GGUF file (no GGUF magic)")
    r = _Reader(buf)
    r.pos = 4
    version = r.take("I")
    if version not in (2, 3):
        raise HeaderError(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    fields: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for _ in range(n_kv):
        r.field(fields, counts)
    return Header(fields, counts, [r.tensor(gguf) for _ in range(n_tensors)])
