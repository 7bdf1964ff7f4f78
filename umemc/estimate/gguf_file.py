"""Facts from a GGUF header. `gguf` (and numpy) are imported only when a stack names a GGUF file that
exists: `umemc check` on presets never pays for them."""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..catalog.archs import LlmShape, VisionShape
from ..catalog.llama_archs import facts, layers_known, positions
from ..catalog.quant import FILE_TYPE_IDS, is_repacked
from .gguf_header import Header, HeaderError, Tensor, read_header

if TYPE_CHECKING:
    from ..lockfile import LockedHeader

# Every per-architecture rule the header reading uses (window layouts, encoders, M-RoPE, which layers recur) is in
# the architecture's record, umemc.catalog.llama_archs; an architecture with none follows the generic rules, said.


class NotGguf(Exception):
    pass


class GgufFacts(NamedTuple):
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
    chat_template: bool | None = None  # whether the file carries tokenizer.chat_template (None: not read)
    basename: str | None = None  # general.basename: the model's family as its publisher names it ("gemma-3")
    size_label: str | None = None  # general.size_label ("270M")
    # by llama.cpp's layers (a split across nodes): each block's tensor bytes (blk.N.*) and what of it the CPU
    # backend repacks, and the output layer's (output.weight, output_norm.*); the input layer has the rest. A file
    # with no output.weight reuses its token embeddings there: `tied`
    layer_bytes: tuple[int, ...] = ()
    layer_repack: tuple[int, ...] = ()
    output_bytes: int = 0
    tied: bool = False
    # where in the file's data each block's tensors lie, and the input layer's ((first byte, end) each; files order
    # their tensors as they like: many list blk.10 before blk.2): what llama.cpp maps for a run of layers spans them
    layer_spans: tuple[tuple[int, int], ...] = ()
    input_span: tuple[int, int] = (0, 0)


def _locked_shape(recorded: dict[str, Any]) -> LlmShape:
    unknown = sorted(set(recorded) - set(LlmShape._fields))
    if unknown:
        raise ValueError(f"its shape has keys no header gives: {', '.join(unknown)}")
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()}
    try:
        shape = LlmShape(**fields)
    except TypeError as exc:
        raise ValueError(f"its shape is incomplete: {exc}") from None
    defaults = LlmShape._field_defaults
    for name, value in shape._asdict().items():
        want = type(defaults.get(name, 0 if name != "arch" else ""))
        items = value if isinstance(value, tuple) else (value,)
        if name in ("arch", "recurrent_kind", "unmodelled"):
            continue
        if name == "block_norms":  # one of the layouts the header reading gives
            if value not in BLOCK_NORMS:
                raise ValueError(f"its shape's {name} is {value!r}")
            continue
        if name == "expert_weights_scale":  # the one real number: a finite factor
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"its shape's {name} is {value!r}")
            continue
        if not all(isinstance(x, int) and (want is not bool or isinstance(x, bool)) and x >= 0 for x in items):
            raise ValueError(f"its shape's {name} is {value!r}")
    if not 0 < shape.n_layer <= MAX_LAYERS:
        raise ValueError(f"its shape has {shape.n_layer} layers (a header gives 1 to {MAX_LAYERS})")
    for name in ("n_head_kv", "swa_layers", "recurrent_layers", "kv_layers", "qkv_fused", "unroped_layers"):
        if getattr(shape, name) and len(getattr(shape, name)) != shape.n_layer:
            raise ValueError(f"its shape's {name} has {len(getattr(shape, name))} entries for {shape.n_layer} layers")
    return shape


def locked_header(facts: GgufFacts) -> LockedHeader:
    """What the lock records of a file's header, enough to estimate without the file."""
    from ..lockfile.entries import LockedHeader

    return LockedHeader(
        tensor_bytes=facts.tensor_bytes,
        n_tensors=facts.n_tensors,
        type_counts=facts.type_counts,
        file_type=facts.file_type,
        general_arch=facts.general_arch,
        shape=None if facts.shape is None else facts.shape._asdict(),
        repack_bytes=facts.repack_bytes,
        skipped_bytes=facts.skipped_bytes,
    )


def facts_from_lock(h: LockedHeader, path: str) -> GgufFacts:
    """The facts a calibration file recorded of a header. That file is input (it may sit in a shared repository):
    a shape that no header could give raises ValueError, saying why."""
    shape = None if h.shape is None else _locked_shape(h.shape)
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
        header = _with_parts(Path(name), read_header(Path(name)))
        _check_depth(header.fields)
    except (HeaderError, OSError) as exc:
        raise NotGguf(f"cannot read the GGUF header: {exc}") from None
    try:
        return _facts(name, header)
    except (TypeError, ValueError, OverflowError, IndexError) as exc:  # a lying file: a value no model file has
        raise NotGguf(f"cannot read the GGUF header: it holds a value no model file has ({exc})") from None


def _facts(name: str, header: Header) -> GgufFacts:
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
        shape=_checked_shape(fields, arch, vocab, tensors) if f"{arch}.block_count" in fields else None,
        general_arch=arch,
        vision=_vision(fields),
        repack_bytes=sum(
            t.n_bytes for t in header.tensors if t.name not in skipped and is_repacked(t.name, t.type_name, t.shape)
        ),
        skipped_bytes=sum(t.n_bytes for t in header.tensors if t.name in skipped),
        chat_template=bool(fields.get("tokenizer.chat_template")),
        basename=_text(fields.get("general.basename")),
        size_label=_text(fields.get("general.size_label")),
        **_by_layer(
            header,
            skipped,
            int(fields.get(f"{arch}.block_count", 0) or 0),
            one_file=int(fields.get("split.count", 1) or 1) <= 1,
        ),  # fmt: skip
    )


MAX_LAYERS = 4096  # published models have at most a few hundred; every per-layer figure loops over them


def _check_depth(fields: dict[str, Any]) -> None:
    """A header is a file's claim, and a file may lie (a download, a Hub repository): a block count no model has
    would make every per-layer table that large. Refused as an unreadable header, not sized."""
    arch = str(fields.get("general.architecture", ""))
    value = fields.get(f"{arch}.block_count")
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_LAYERS:
        raise HeaderError(f"{arch}.block_count is {value!r}: not a layer count umemc can size (1 to {MAX_LAYERS})")


def _by_layer(header: Header, skipped: frozenset[str], n_layer: int, *, one_file: bool) -> dict[str, Any]:
    """Tensor bytes by llama.cpp's layer: blk.N.* is block N, output.* and output_norm.* the output layer (a file
    without output.weight ties it to token_embd.weight, which llama.cpp then duplicates on the output's device);
    where each lies in the file (one file only: each part of a split GGUF has its own offsets)."""
    blocks, repack = [0] * n_layer, [0] * n_layer
    spans = [(-1, -1)] * n_layer
    first, end = -1, -1  # the input layer's
    output, tied = 0, True

    def wider(span: tuple[int, int], t: Tensor) -> tuple[int, int]:
        lo, hi = span
        return (t.offset if lo < 0 else min(lo, t.offset), max(hi, t.offset + t.n_bytes))

    for t in header.tensors:
        if t.name in skipped:
            continue
        if t.name.startswith("blk."):
            i = int(t.name.split(".")[1])
            if i < n_layer:
                blocks[i] += t.n_bytes
                repack[i] += t.n_bytes if is_repacked(t.name, t.type_name, t.shape) else 0
                spans[i] = wider(spans[i], t)
        elif t.name.startswith(("output.", "output_norm.")):
            output += t.n_bytes
            tied = tied and t.name != "output.weight"
        else:
            first, end = wider((first, end), t)
    if tied:
        output += next((t.n_bytes for t in header.tensors if t.name == "token_embd.weight"), 0)
    where = {"layer_spans": tuple(spans), "input_span": (first, end)} if one_file else {}
    return {"layer_bytes": tuple(blocks), "layer_repack": tuple(repack), "output_bytes": output, "tied": tied,
            **where}  # fmt: skip


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _with_parts(path: Path, first: Header) -> Header:
    """A split GGUF (gguf-split: `split.count` parts named NAME-0000k-of-0000N.gguf beside each other, the
    first holding the metadata) as one header: the first part's fields, every part's tensors."""
    from ..hub.ref import SPLIT

    count = int(first.fields.get("split.count", 1) or 1)
    if count <= 1:
        return first
    m = SPLIT.match(path.name)
    if not m or int(m.group("count")) != count or m.group("no") != "00001":
        raise HeaderError(f"the first part of a {count}-part split GGUF must be named NAME-00001-of-{count:05d}.gguf")
    tensors = list(first.tensors)
    for i in range(2, count + 1):
        part = path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf")
        if not part.exists():
            raise HeaderError(f"part {i} of {count} is missing: {part}")
        tensors += read_header(part).tensors
    return Header(first.fields, first.counts, tensors)


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


def _checked_shape(f: dict[str, Any], arch: str, vocab: int, tensors: dict[str, tuple[int, ...]]) -> LlmShape:
    """The header's shape; a key whose value is of a type no llama.cpp file has there (a string where a count is
    read: a lying file) is an unreadable header, not an internal error."""
    read: list[str] = []
    try:
        return _shape(f, arch, vocab, tensors, read)
    except (TypeError, ValueError, OverflowError):
        name = read[-1] if read else None  # each figure is converted as soon as its key is read
        value = f.get(name) if name else None
        if name and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            raise NotGguf(f"cannot read the GGUF header: {name} is {value!r}: not a number") from None
        raise NotGguf(f"cannot read the GGUF header: the {arch} keys hold a value of a type no file has") from None


BLOCK_NORMS = ("", "pre", "sandwich", "post", "parallel")  # LlmShape.block_norms


def _block_norms(tensors: dict[str, tuple[int, ...]]) -> str:
    """Where the first block's norms are (LlmShape.block_norms). post_attention_norm alone, beside attn_norm, is
    the FFN's own norm under another name (gpt-oss, GLM-4.5): the common layout."""
    kinds = {name[len("blk.0.") :].removesuffix(".weight") for name in tensors if name.startswith("blk.0.")}
    if not kinds:
        return ""
    before, ffn = "attn_norm" in kinds, "ffn_norm" in kinds
    after = "post_attention_norm" in kinds and "post_ffw_norm" in kinds
    if after and not before:
        return "post"
    if after and ffn:
        return "sandwich"
    if before and not ffn and "post_attention_norm" not in kinds:
        return "parallel"
    return "pre"


def _shape(f: dict[str, Any], arch: str, vocab: int, tensors: dict[str, tuple[int, ...]], read: list[str]) -> LlmShape:
    def key(name: str, default: Any = None) -> Any:
        read.append(f"{arch}.{name}")
        return f.get(f"{arch}.{name}", default)

    n_layer, n_embd, n_head = int(key("block_count")), int(key("embedding_length")), int(key("attention.head_count"))
    kv = key("attention.head_count_kv", n_head)
    n_head_kv = tuple(int(x) for x in kv) if isinstance(kv, list) else (int(kv),) * n_layer
    hd_k = int(key("attention.key_length", n_embd // n_head))
    hd_v = int(key("attention.value_length", n_embd // n_head))
    swa, swa_layers, unmodelled = _windows(key, arch, n_layer)
    moe = _experts(key, arch, n_layer, tensors)
    n_ff = _per_layer(key("feed_forward_length", 4 * n_embd), n_layer)
    recurrent = _recurrent(key, arch, n_head_kv, n_ff, n_layer - int(key("nextn_predict_layers", 0) or 0))
    if not facts(arch).modelled and not layers_known(arch):
        unmodelled = (*unmodelled, *_generic_limits(arch, f, recurrent))
    joint = _joint(tensors, n_ff)
    return LlmShape(
        resident_width=_resident_width(key, arch, n_layer, n_embd),
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
        causal=bool(key("attention.causal", not facts(arch).encoder)),
        mla=key("attention.key_length_mla") is not None and key("attention.value_length_mla") is not None,
        head_dim_v_mla=int(key("attention.value_length_mla", 0) or 0),
        n_layer_nextn=int(key("nextn_predict_layers", 0) or 0),
        unmodelled=unmodelled,
        qk_norm=any(name.endswith(".attn_q_norm.weight") for name in tensors),
        block_norms=_block_norms(tensors),
        qk_norm_flat=any(
            name.endswith(".attn_q_norm.weight") and dims[:1] == (n_head * hd_k,) and n_head > 1
            for name, dims in tensors.items()
        ),
        # Granite reads rope.scaling.finetuned as its switch for RoPE (src/models/granite*.cpp); Granite 4.0 H: off
        no_rope=facts(arch).rope_switch and key("rope.scaling.finetuned", True) is False,
        unroped_layers=tuple(not s for s in swa_layers) if facts(arch).rope_on_windows and any(swa_layers) else (),
        mla_dims=_mla_dims(key, tensors),
        qkv_fused=_fused(tensors, n_layer),
        experts_gate_up=any(name.endswith(".ffn_gate_up_exps.weight") for name in tensors),
        ffn_gated=joint or _gated(tensors, "ffn_up", "ffn_gate"),
        ffn_joint=joint,
        experts_gated=_gated(tensors, "ffn_up_exps", "ffn_gate_exps"),
        shexp_gated=_gated(tensors, "ffn_up_shexp", "ffn_gate_shexp"),
        n_deepstack=int(key("n_deepstack_layers", 0) or 0),
        n_pos=_positions(key, arch),
        attn_temp_scale=bool(key("attention.temperature_scale", 0)),
        **moe,
        **recurrent,
    )


def _joint(tensors: dict[str, tuple[int, ...]], widths: tuple[int, ...]) -> bool:
    """The dense FFN's gate and up in one tensor: no ffn_gate, and ffn_up twice the layer's FFN width."""
    if any(name.endswith(".ffn_gate.weight") for name in tensors):
        return False
    return any(
        name.endswith(".ffn_up.weight") and len(ne) > 1 and _layer_width(name, widths) * 2 == ne[1]
        for name, ne in tensors.items()
    )


def _layer_width(name: str, widths: tuple[int, ...]) -> int:
    """The FFN width of the layer a tensor blk.N.* belongs to (-1 where the name says none)."""
    layer = name.split(".")[1] if name.startswith("blk.") else ""
    return widths[int(layer)] if layer.isdigit() and int(layer) < len(widths) else -1


def _gated(tensors: dict[str, tuple[int, ...]], up: str, gate: str) -> bool:
    """Whether an FFN has a gate: its up projection without a gate beside it is an ungated FFN (up, activation,
    down), unless it holds the gate too (`_joint`, said by the caller). Where the file has no such FFN at all,
    gated (the common case: nothing to say)."""
    ups = any(name.endswith(f".{up}.weight") for name in tensors)
    return not ups or any(name.endswith(f".{gate}.weight") for name in tensors)


def _positions(key: Any, arch: str) -> int:
    """Positions a token, by the architecture's record and the file's rope sections."""
    sections = key("rope.dimension_sections")
    return positions(arch, sections if isinstance(sections, list) else None)


def _fused(tensors: dict[str, tuple[int, ...]], n_layer: int) -> tuple[bool, ...]:
    """Which layers project Q, K and V in one tensor (attn_qkv); empty where none does."""
    fused = tuple(f"blk.{i}.attn_qkv.weight" in tensors for i in range(n_layer))
    return fused if any(fused) else ()


def _mla_dims(key: Any, tensors: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """MLA's projections (src/models/deepseek2.cpp): the Q LoRA's rank (0 where the file projects Q directly, as
    the Lite models do), the KV LoRA's, the RoPE'd dims, the key length."""
    k_mla = key("attention.key_length_mla")
    if k_mla is None:
        return ()
    direct = any(name.endswith(".attn_q.weight") for name in tensors)
    q_lora = 0 if direct else int(key("attention.q_lora_rank", 0) or 0)
    return (q_lora, int(key("attention.kv_lora_rank", 0) or 0), int(key("rope.dimension_count", 0) or 0), int(k_mla))


def _windows(key: Any, arch: str, n_layer: int) -> tuple[int, tuple[bool, ...], tuple[str, ...]]:
    """The sliding window and which layers use it: the file's pattern (array or period), else llama.cpp's
    per-architecture default; an architecture with a window but no known layout counts every layer as full
    (the larger cache) and says so."""
    raw = key("attention.sliding_window")
    swa = int(raw or 0)
    forced = facts(arch).forced_window
    if forced and (raw is None or swa != 0):
        swa = forced
    if not swa or (facts(arch).window_depth and n_layer != facts(arch).window_depth):
        return 0, (), ()
    pattern = key("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return swa, tuple(bool(x) for x in pattern), ()
    f = facts(arch)
    n, dense_first = (int(pattern), False) if pattern else (f.window_period, f.window_dense_first)
    if not n:
        return 0, (), (f"sliding-window layout (window {swa}): every layer is counted with a full-size cache",)
    if dense_first:
        return swa, tuple(i % n != 0 for i in range(n_layer)), ()
    return swa, tuple(i % n < n - 1 for i in range(n_layer)), ()


def _experts(key: Any, arch: str, n_layer: int, tensors: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Routed and shared experts from the header keys, else from the expert tensors' shapes (Llama 4's one shared
    expert is as wide as a routed one: src/models/llama4.cpp)."""
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
    if not n_ff_shexp and arch == "llama4":
        n_ff_shexp = n_ff_exp
    return {
        "n_expert": n_expert,
        "n_expert_used": int(key("expert_used_count", 0) or 0),
        "n_ff_exp": n_ff_exp or _max(key("feed_forward_length", 0)),
        "n_ff_shexp": n_ff_shexp,
        "n_layer_dense_lead": min(n_layer, int(key("leading_dense_block_count", 0) or 0)),
        "moe_every": max(0, int(key("interleave_moe_layer_step", 1))),
        "expert_weights_norm": bool(key("expert_weights_norm", False)),
        "expert_weights_scale": float(key("expert_weights_scale", 0.0) or 0.0),
        "expert_gating": int(key("expert_gating_func", 0) or 0),
        "expert_groups": int(key("expert_group_count", 0) or 0),
        "expert_bias": any(name.endswith(".exp_probs_b.bias") for name in tensors),
    }


# Which layers run a recurrent mixer (llama_hparams::is_recr) and which keep a KV cache, as llama.cpp decides per
# architecture (src/models/<arch>.cpp load_arch_hparams; the memory filters of src/llama-model.cpp create_memory):
# the record's `layers`. Architectures with none mark their recurrent layers with 0 KV heads.
_MIXER_KEYS = ("ssm.inner_size", "wkv.head_size", "shortconv.l_cache", "kda.head_dim")


def _recurrent(key: Any, arch: str, n_head_kv: tuple[int, ...], n_ff: tuple[int, ...], n_main: int) -> dict[str, Any]:
    """The recurrent layers, the layers with a KV cache where the architecture decides it apart from its KV heads,
    and the state a recurrent layer keeps per sequence (llama_hparams::n_embd_r / n_embd_s, in f32)."""
    n_layer = len(n_head_kv)
    kv: tuple[bool, ...] = ()
    start = _kv_from_start(key, arch, n_layer)
    if start is not None:
        kv = tuple(i < start for i in range(n_layer))
    f = facts(arch)
    mixer = f.layers in ("recurrent", "interval") or any(key(k) for k in _MIXER_KEYS)
    if not mixer:
        return {"kv_layers": kv} if kv else {}
    listed = key("attention.recurrent_layers")
    if f.layers == "recurrent":
        recr, kv = (True,) * n_layer, (False,) * n_layer
    elif f.layers == "parallel":
        recr, kv = (True,) * n_layer, (True,) * n_layer
    elif f.layers == "interval" and isinstance(listed, list):
        recr = tuple(bool(x) for x in listed)
    elif f.layers == "interval":
        every = int(key("full_attention_interval", f.interval) or f.interval)
        recr = tuple(i < n_main and (i + 1) % every != 0 for i in range(n_layer))
    elif f.layers == "ffn-only":
        recr = tuple(i < n_main and h == 0 and f == 0 for i, (h, f) in enumerate(zip(n_head_kv, n_ff, strict=True)))
        kv = tuple(not r and f == 0 for r, f in zip(recr, n_ff, strict=True))
    else:
        recr = tuple(h == 0 for h in n_head_kv) if any(n_head_kv) else (True,) * n_layer
    return {"recurrent_layers": recr, **({"kv_layers": kv} if kv else {}), **_state(key, arch)}


def _kv_from_start(key: Any, arch: str, n_layer: int) -> int | None:
    if facts(arch).kv_from:
        return facts(arch).kv_from
    shared = key("attention.shared_kv_layers")
    return n_layer - int(shared) if shared else None


def _state(key: Any, arch: str) -> dict[str, Any]:
    """llama_hparams::n_embd_r (the convolution's or token shift's state) and n_embd_s (the scan's), in the
    order llama.cpp tests them: RWKV, LFM2's short convolution, Kimi's KDA, MiniMax's lightning attention, then
    the Mamba/Gated-DeltaNet convolution and scan from the ssm keys."""
    n_embd, n_head = int(key("embedding_length", 0)), _max(key("attention.head_count", 0))
    d_conv, d_inner = int(key("ssm.conv_kernel", 0) or 0), int(key("ssm.inner_size", 0) or 0)
    d_state, n_group = int(key("ssm.state_size", 0) or 0), int(key("ssm.group_count", 0) or 0)
    conv = max(0, d_conv - 1) * (d_inner + 2 * n_group * d_state)
    scan = d_state * d_inner
    kind = "deltanet" if facts(arch).mixer == "deltanet" else "mamba"
    if key("wkv.head_size"):
        head = int(key("wkv.head_size"))
        conv, scan, kind = int(key("token_shift_count", 2) or 2) * n_embd, n_embd * head, "rwkv"
    elif key("shortconv.l_cache"):
        conv, kind = n_embd * (int(key("shortconv.l_cache")) - 1), "shortconv"
    elif key("kda.head_dim"):
        head = int(key("kda.head_dim"))
        conv, scan, kind = 3 * (d_conv - 1 if d_conv else 3) * n_head * head, head * head * n_head, "kda"
    if facts(arch).mixer == "lightning":  # MiniMax-01: n_embd_head_la = the full attention's head size
        head = int(key("attention.key_length", n_embd // max(1, n_head)))
        scan, kind = head * head * n_head, "lightning"
    return {
        "n_embd_r": conv,
        "n_embd_s": scan,
        "ssm_dims": (d_conv, d_inner, d_state, n_group, int(key("ssm.time_step_rank", 0) or 0)),
        "recurrent_kind": kind,
    }


def _generic_limits(arch: str, f: dict[str, Any], layers: dict[str, Any]) -> tuple[str, ...]:
    """What of an architecture umemc has no rules for follows the generic ones, part by part: never a silent
    guess, and a figure that may be low says so."""
    said = [
        "KV cache and compute follow the generic transformer rules (every layer attends to the whole context; "
        "the compute buffer is the common decoder's graph as the file's tensors describe it, where they do)"
    ]
    keys = [k.removeprefix(f"{arch}.") for k in f if k.startswith(f"{arch}.")]
    if any(k.startswith(("ssm.", "wkv.", "shortconv.", "kda.")) for k in keys):
        if any(layers.get("recurrent_layers", ())):
            said.append(
                "its recurrent state is sized by the generic rule (the layers with 0 KV heads keep "
                "n_embd_r + n_embd_s per sequence)"
            )
        else:
            said.append(
                "it has a recurrent mixer but no layer without KV heads: its recurrent state is NOT counted "
                "(the estimate may be low by it)"
            )
    if any("shared_kv" in k for k in keys):
        said.append("its layers that reuse another layer's KV cache are each counted with their own")
    return tuple(said)


def _resident_width(key: Any, arch: str, n_layer: int, n_embd: int) -> int:
    """Gemma 3n keeps n_altup predictions of the hidden state and every layer's per-layer embedding input
    through the whole graph (src/models/gemma3n.cpp; llama_hparams defaults n_altup 4, n_embd_altup 256)."""
    if not facts(arch).altup:
        return 0
    n_altup = int(key("altup.num_inputs", 4) or 4)
    per_layer = int(key("embedding_length_per_layer_input", 256) or 256)
    return n_altup * n_embd + per_layer * n_layer


def _per_layer(value: Any, n_layer: int) -> tuple[int, ...]:
    return tuple(int(x) for x in value) if isinstance(value, list) else (int(value),) * n_layer


def _max(value: Any) -> int:
    """Per-layer arrays (some architectures vary FFN width by layer): the widest sizes the buffer."""
    return max(int(x) for x in value) if isinstance(value, list) else int(value)
