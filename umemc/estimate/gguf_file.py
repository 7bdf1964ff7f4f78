"""Facts from a GGUF header. `gguf` (and numpy) are imported only when a stack names a GGUF file that
exists: `umemc check` on presets never pays for them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..catalog.archs import LlmShape, VisionShape
from ..catalog.quant import FILE_TYPE_IDS, is_repacked
from .gguf_header import Header, HeaderError, read_header

# llama.cpp hard-codes the sliding-window layout for some architectures (src/llama-model.cpp,
# hparams.set_swa_pattern): every n-th layer is global, the others use the window.
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gemma3n": 5}


class NotGguf(Exception):
    pass


@dataclass(frozen=True)
class GgufFacts:
    path: str
    tensor_bytes: int
    n_tensors: int
    type_counts: dict[str, int]
    file_type: str | None
    shape: LlmShape | None  # None for files that are not language models (mmproj)
    general_arch: str
    vision: VisionShape | None = None  # a multimodal projector's encoder (clip.vision.* keys)
    repack_bytes: int = 0  # tensors llama.cpp's CPU backend copies into its repacked layout


def read(path: Path) -> GgufFacts:
    """Read tensor sizes and hyper-parameters from the header (umemc/estimate/gguf_header.py: one pass,
    no weight is read); kept per file version for the life of the process (several models, one file)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise NotGguf(f"cannot read the GGUF header: {exc.strerror}") from None
    return _read(str(path), st.st_size, st.st_mtime_ns, st.st_ino)


@lru_cache(maxsize=64)
def _read(name: str, size: int, mtime_ns: int, inode: int) -> GgufFacts:
    try:
        header = read_header(Path(name))
    except (HeaderError, OSError) as exc:
        raise NotGguf(f"cannot read the GGUF header: {exc}") from None
    fields = {k: v for k, v in header.fields.items() if not k.startswith("tokenizer.ggml.")}
    counts: dict[str, int] = {}
    for t in header.tensors:
        counts[t.type_name] = counts.get(t.type_name, 0) + 1
    arch = str(fields.get("general.architecture", ""))
    ftype = fields.get("general.file_type")
    vocab = _vocab_size(header, fields, arch)
    return GgufFacts(
        path=name,
        tensor_bytes=sum(t.n_bytes for t in header.tensors),
        n_tensors=len(header.tensors),
        type_counts=dict(sorted(counts.items())),
        file_type=FILE_TYPE_IDS.get(int(ftype)) if ftype is not None else None,
        shape=_shape(fields, arch, vocab) if f"{arch}.block_count" in fields else None,
        general_arch=arch,
        vision=_vision(fields),
        repack_bytes=sum(t.n_bytes for t in header.tensors if is_repacked(t.name, t.type_name, t.shape)),
    )


def _vision(f: dict[str, Any]) -> VisionShape | None:
    if "clip.vision.block_count" not in f:
        return None
    embd = int(f.get("clip.vision.embedding_length", 0))
    return VisionShape(
        n_layer=int(f["clip.vision.block_count"]),
        n_embd=embd,
        n_ff=int(f.get("clip.vision.feed_forward_length", 4 * embd)),
        n_head=int(f.get("clip.vision.attention.head_count", 1)),
        patch=int(f.get("clip.vision.patch_size", 14)),
        merge=int(f.get("clip.vision.spatial_merge_size", 1)),
        out_embd=int(f.get("clip.vision.projection_dim", embd)),
    )


def _vocab_size(header: Header, fields: dict[str, Any], arch: str) -> int:
    if f"{arch}.vocab_size" in fields:
        return int(fields[f"{arch}.vocab_size"])
    if "tokenizer.ggml.tokens" in header.counts:
        return header.counts["tokenizer.ggml.tokens"]
    for t in header.tensors:  # no tokenizer: the embedding table says it
        if t.name == "token_embd.weight":
            return int(t.shape[1])
    return 0


def _shape(f: dict[str, Any], arch: str, vocab: int) -> LlmShape:
    def key(name: str, default: Any = None) -> Any:
        return f.get(f"{arch}.{name}", default)

    n_layer, n_embd, n_head = int(key("block_count")), int(key("embedding_length")), int(key("attention.head_count"))
    kv = key("attention.head_count_kv", n_head)
    n_head_kv = tuple(int(x) for x in kv) if isinstance(kv, list) else (int(kv),) * n_layer
    hd_k = int(key("attention.key_length", n_embd // n_head))
    hd_v = int(key("attention.value_length", n_embd // n_head))
    swa = int(key("attention.sliding_window", 0) or 0)
    swa_layers: tuple[bool, ...] = ()
    if swa:
        pattern = key("attention.sliding_window_pattern")
        if isinstance(pattern, list):
            swa_layers = tuple(bool(x) for x in pattern)
        else:
            n = int(pattern) if pattern else _SWA_PATTERN.get(arch, 0)
            swa_layers = tuple(n > 0 and i % n < n - 1 for i in range(n_layer)) if n else (True,) * n_layer
    causal = bool(key("attention.causal", arch not in ("bert", "nomic-bert", "jina-bert-v2")))
    return LlmShape(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=_max(key("feed_forward_length", 4 * n_embd)),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=hd_k,
        head_dim_v=hd_v,
        n_vocab=vocab,
        n_ctx_train=int(key("context_length", 0)),
        sliding_window=swa,
        swa_layers=swa_layers,
        causal=causal,
    )


def _max(value: Any) -> int:
    """Per-layer arrays (some architectures vary FFN width by layer): the widest sizes the buffer."""
    return max(int(x) for x in value) if isinstance(value, list) else int(value)
