"""Facts from a GGUF header. `gguf` (and numpy) are imported only when a stack names a GGUF file that
exists: `umemc check` on presets never pays for them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..catalog.archs import LlmShape, VisionShape
from ..catalog.quant import FILE_TYPE_IDS, is_repacked
from ..lockfile import LockedHeader
from .gguf_header import Header, HeaderError, read_header

# llama.cpp hard-codes the sliding-window layout for some architectures (src/models/<arch>.cpp,
# load_swa_pattern(n, dense_first) when the file has no sliding_window_pattern): with n, layer i uses the window
# unless i % n == n - 1 (dense_first: unless i % n == 0).
_SWA_PATTERN: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "cohere2": (4, False),
    "gpt-oss": (2, False),
    "llama4": (4, False),
    "exaone4": (4, False),
    "olmo2": (4, False),
    "cohere2moe": (4, True),
    "smallthinker": (4, True),
}
# Llama 4 attends in chunks of 8192 tokens on its chunked layers whatever the file says (unless it says 0).
_FORCED_WINDOW = {"llama4": 8192}
# Architectures whose memory the rules here model: the generic transformer (every layer full attention with
# K and V per KV head, a dense or routed FFN), with the per-architecture facts read from the header or the
# tables above (windows, MLA, next-token-prediction layers, Mamba-2 states). Anything else is estimated
# with the generic rules and said so.
KNOWN_ARCHS = frozenset(
    {
        "llama", "llama4", "mistral3", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "phi3", "gemma",
        "gemma2", "gemma3", "command-r", "cohere2", "starcoder2", "granite", "granitemoe", "granitehybrid",
        "gpt-oss", "deepseek2", "glm4", "glm4moe", "olmo2", "exaone4", "bert", "nomic-bert", "jina-bert-v2",
    }
)  # fmt: skip
_ENCODERS = ("bert", "nomic-bert", "jina-bert-v2")


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
    skipped_bytes: int = 0  # next-token-prediction layers llama.cpp does not load (src/models/*: TENSOR_SKIP)


def locked_header(facts: GgufFacts) -> LockedHeader:
    """What the lock records of a file's header, enough to estimate without the file."""
    return LockedHeader(
        tensor_bytes=facts.tensor_bytes,
        n_tensors=facts.n_tensors,
        type_counts=facts.type_counts,
        file_type=facts.file_type,
        general_arch=facts.general_arch,
        shape=None if facts.shape is None else asdict(facts.shape),
        repack_bytes=facts.repack_bytes,
        skipped_bytes=facts.skipped_bytes,
    )


def facts_from_lock(h: LockedHeader, path: str) -> GgufFacts:
    shape = None
    if h.shape is not None:
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in h.shape.items()}
        shape = LlmShape(**fields)
    return GgufFacts(
        path=path,
        tensor_bytes=h.tensor_bytes,
        n_tensors=h.n_tensors,
        type_counts=dict(h.type_counts),
        file_type=h.file_type,
        shape=shape,
        general_arch=h.general_arch,
        repack_bytes=h.repack_bytes,
        skipped_bytes=h.skipped_bytes,
    )


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
    tensors = {t.name: t.shape for t in header.tensors}
    skipped = _nextn_tensors(fields, arch, header)
    return GgufFacts(
        path=name,
        tensor_bytes=sum(t.n_bytes for t in header.tensors if t.name not in skipped),
        n_tensors=len(header.tensors),
        type_counts=dict(sorted(counts.items())),
        file_type=FILE_TYPE_IDS.get(int(ftype)) if ftype is not None else None,
        shape=_shape(fields, arch, vocab, tensors) if f"{arch}.block_count" in fields else None,
        general_arch=arch,
        vision=_vision(fields),
        repack_bytes=sum(
            t.n_bytes for t in header.tensors if t.name not in skipped and is_repacked(t.name, t.type_name, t.shape)
        ),
        skipped_bytes=sum(t.n_bytes for t in header.tensors if t.name in skipped),
    )


def _nextn_tensors(fields: dict[str, Any], arch: str, header: Header) -> frozenset[str]:
    """The tensors of the trailing next-token-prediction blocks: llama.cpp creates them with TENSOR_SKIP unless
    it drafts with them (llama_model_params.load_mtp, off by default), so they take no memory."""
    n_nextn = int(fields.get(f"{arch}.nextn_predict_layers", 0) or 0)
    n_layer = int(fields.get(f"{arch}.block_count", 0) or 0)
    if not n_nextn:
        return frozenset()
    first = n_layer - n_nextn
    return frozenset(t.name for t in header.tensors if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= first)


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


def _shape(f: dict[str, Any], arch: str, vocab: int, tensors: dict[str, tuple[int, ...]]) -> LlmShape:
    def key(name: str, default: Any = None) -> Any:
        return f.get(f"{arch}.{name}", default)

    n_layer, n_embd, n_head = int(key("block_count")), int(key("embedding_length")), int(key("attention.head_count"))
    kv = key("attention.head_count_kv", n_head)
    n_head_kv = tuple(int(x) for x in kv) if isinstance(kv, list) else (int(kv),) * n_layer
    hd_k = int(key("attention.key_length", n_embd // n_head))
    hd_v = int(key("attention.value_length", n_embd // n_head))
    swa, swa_layers, unmodelled = _windows(key, arch, n_layer)
    moe = _experts(key, n_layer, tensors)
    recurrent = _recurrent(key, n_head_kv, n_layer)
    if arch not in KNOWN_ARCHS:
        unmodelled = (*unmodelled, *_generic_limits(arch, f, bool(recurrent)))
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
        causal=bool(key("attention.causal", arch not in _ENCODERS)),
        mla=key("attention.key_length_mla") is not None and key("attention.value_length_mla") is not None,
        head_dim_v_mla=int(key("attention.value_length_mla", 0) or 0),
        n_layer_nextn=int(key("nextn_predict_layers", 0) or 0),
        unmodelled=unmodelled,
        **moe,
        **recurrent,
    )


def _windows(key: Any, arch: str, n_layer: int) -> tuple[int, tuple[bool, ...], tuple[str, ...]]:
    """The sliding window and which layers use it: the file's pattern (array or period), else llama.cpp's
    per-architecture default; an architecture with a window but no known layout counts every layer as full
    (the larger cache) and says so."""
    raw = key("attention.sliding_window")
    swa = int(raw or 0)
    if arch in _FORCED_WINDOW and (raw is None or swa != 0):
        swa = _FORCED_WINDOW[arch]
    if not swa:
        return 0, (), ()
    pattern = key("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return swa, tuple(bool(x) for x in pattern), ()
    n, dense_first = (int(pattern), False) if pattern else _SWA_PATTERN.get(arch, (0, False))
    if not n:
        return 0, (), (f"sliding-window layout (window {swa}): every layer is counted with a full-size cache",)
    if dense_first:
        return swa, tuple(i % n != 0 for i in range(n_layer)), ()
    return swa, tuple(i % n < n - 1 for i in range(n_layer)), ()


def _experts(key: Any, n_layer: int, tensors: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Routed and shared experts from the header keys, else from the expert tensors' shapes."""
    n_expert = int(key("expert_count", 0) or 0)
    if not n_expert:
        return {}
    up = next((ne for name, ne in tensors.items() if name.endswith("ffn_up_exps.weight")), None)
    shexp = next((ne for name, ne in tensors.items() if name.endswith("ffn_up_shexp.weight")), None)
    n_ff_exp = _max(key("expert_feed_forward_length", up[1] if up else 0))
    n_ff_shexp = (
        int(key("expert_shared_feed_forward_length", 0) or 0) or int(key("expert_shared_count", 0) or 0) * n_ff_exp
    )
    if not n_ff_shexp and shexp is not None:
        n_ff_shexp = shexp[1]
    return {
        "n_expert": n_expert,
        "n_expert_used": int(key("expert_used_count", 0) or 0),
        "n_ff_exp": n_ff_exp or _max(key("feed_forward_length", 0)),
        "n_ff_shexp": n_ff_shexp,
        "n_layer_dense_lead": min(n_layer, int(key("leading_dense_block_count", 0) or 0)),
    }


def _recurrent(key: Any, n_head_kv: tuple[int, ...], n_layer: int) -> dict[str, Any]:
    """Mamba-2 layers (llama_hparams::n_embd_r/n_embd_s): a hybrid marks them with 0 KV heads; a file with
    ssm keys and no attention at all is recurrent throughout."""
    d_inner = int(key("ssm.inner_size", 0) or 0)
    if not d_inner:
        return {}
    d_conv, d_state = int(key("ssm.conv_kernel", 0) or 0), int(key("ssm.state_size", 0) or 0)
    n_group, n_head = int(key("ssm.group_count", 0) or 0), int(key("ssm.time_step_rank", 0) or 0)
    return {
        "recurrent_layers": tuple(h == 0 for h in n_head_kv) if any(n_head_kv) else (True,) * n_layer,
        "n_embd_r": max(0, d_conv - 1) * (d_inner + 2 * n_group * d_state),
        "n_embd_s": d_state * d_inner,
        "ssm_dims": (d_conv, d_inner, d_state, n_group, n_head),
    }


def _generic_limits(arch: str, f: dict[str, Any], recurrent: bool) -> tuple[str, ...]:
    said = ["KV cache and compute follow the generic transformer rules"]
    if any(k.startswith(f"{arch}.ssm.") or k.startswith(f"{arch}.wkv.") for k in f) and not recurrent:
        said.append("its recurrent state (ssm/wkv keys) is not counted")
    return tuple(said)


def _max(value: Any) -> int:
    """Per-layer arrays (some architectures vary FFN width by layer): the widest sizes the buffer."""
    return max(int(x) for x in value) if isinstance(value, list) else int(value)
