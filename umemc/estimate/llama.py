"""Estimates for the llama.cpp runtimes (llama-server, llama-cpp-python)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog.archs import LLM_PRESETS, LlmPreset, LlmShape, VisionShape
from ..catalog.llama_archs import facts, layers_known
from ..catalog.quant import FILE_TYPE_BITS, REPACK_ISA, is_repacked, loaded, preset_mix, quantized_kv, tensor_bytes
from ..catalog.runtimes import FULL_SWA_CACHE, NO_REPACK_FLAGS
from ..hub.ref import SPLIT
from ..lockfile import path_for
from ..stack.resolved import LoadedStack, ResolvedModel
from ..units import with_gib
from . import recorded
from .figures import Estimate, Figure
from .finish import finish
from .gguf_file import GgufFacts, NotGguf, facts_from_lock
from .gguf_file import read as read_gguf
from .llm import compute_figure, kv_figure, projector_from_preset, vision_compute_figure, weights_from_preset
from .other import estimate_command
from .overhead import overhead_figure

if TYPE_CHECKING:
    from ..lockfile import LockEntry

_WANTS = {
    "embedding": ("F16", "embedding models lose recall when quantized below F16"),
    "vision": ("Q8_0", "vision models lose accuracy below Q8 (practitioners saw ~15 mAP points at Q4)"),
}


def estimate_llama(loaded: LoadedStack, m: ResolvedModel) -> Estimate:
    spec, at = m.spec, ("models", m.name)
    warnings: list[str] = []
    entry = recorded.checked_entry(loaded, m, warnings)
    facts, source = _facts(loaded, m, entry, warnings)
    preset = LLM_PRESETS.get(spec.arch or "")
    if facts is not None:
        if facts.shape is None:
            raise loaded.source.error(
                at + ("model",),
                f"GGUF has no {facts.general_arch}.block_count: not a language model",
                "a projector goes in mmproj",
            )
        shape, ftype = facts.shape, facts.file_type or "?"
        how = (
            "the GGUF header (exact)"
            if source == "gguf"
            else "the header the calibration file recorded (the file is absent: not confirmed)"
        )
        weights = Figure(
            "weights",
            facts.tensor_bytes,
            f"sum of tensor bytes in {how}",
            {
                "file": str(m.model_path),
                "tensors": facts.n_tensors,
                "file type": ftype,
                "tensor types": ", ".join(f"{k}:{v}" for k, v in facts.type_counts.items()),
            },
        )
        if m.quant and facts.file_type and m.quant != facts.file_type:
            warnings.append(
                loaded.source.warning(
                    at + ("quant",),
                    f'quant = "{m.quant}" but the file is {facts.file_type}; the estimate uses the file',
                )
            )
    elif preset is not None:
        shape, source, ftype = preset.shape, "arch", m.quant or preset.default_quant
        weights = weights_from_preset(preset, ftype)
    else:  # memory = … only, file absent: nothing to compute from
        return estimate_command(loaded, m)  # memory = … only, file absent: nothing to compute from
    vision = _vision(loaded, m, facts, preset)
    weights_parts = [weights] + ([vision[0]] if vision else [])
    swa_full = spec.runtime in FULL_SWA_CACHE
    kv = kv_figure(
        shape, spec.context, spec.parallel, spec.ubatch, spec.kv_cache, swa_full=swa_full, flash_attn=spec.flash_attn
    )
    # llama-cpp-python in embedding mode sizes the context for min(n_batch, 256) sequences (its Llama.__init__)
    seqs = min(spec.ubatch, 256) if spec.runtime == "llama-cpp-python" and not shape.causal else 0
    # llama-server reserves one row of logits per sequence (an embedding server every token of the batch)
    outputs = spec.parallel if spec.runtime == "llama-server" and shape.causal else None
    compute_parts = [
        compute_figure(
            shape, spec.context, spec.parallel, spec.ubatch, flash_attn=spec.flash_attn, swa_full=swa_full,
            kv_type=spec.kv_cache, embed_seqs=seqs, outputs=outputs,
        )
    ]  # fmt: skip
    repack = _repack(loaded, m, facts.repack_bytes if facts is not None else _preset_repack(preset, ftype))
    if repack is not None:
        weights_parts.append(repack)
    if vision:
        compute_parts.append(vision[1])
    cache = spec.prompt_cache if spec.runtime == "llama-server" else 0
    overhead = overhead_figure(spec.runtime, loaded.platform.kind, shape.n_vocab, cache)
    family = "embedding" if not shape.causal else ("vision" if vision else "llm")
    warnings += _warnings(loaded, m, shape, ftype, family, kv)
    warnings += _template_warning(loaded, m, facts, family)
    weights_fig, compute_fig = Figure.total("weights", weights_parts), Figure.total("compute", compute_parts)
    hand = recorded.Chosen(source, weights_fig, kv, compute_fig, overhead)
    chosen = recorded.pick(loaded, m, facts, entry, vision, hand, warnings)
    if chosen.source not in ("llama.cpp", "measured"):
        warnings += _hand_warnings(loaded, m, shape)
    return finish(
        loaded,
        m,
        chosen.source,
        chosen.weights,
        chosen.kv,
        chosen.compute,
        chosen.overhead,
        warnings,
        {"file type": ftype, "family": family, "n_ctx_train": shape.n_ctx_train, "arch": shape.arch},
    )


def _hand_warnings(loaded: LoadedStack, m: ResolvedModel, shape: LlmShape) -> list[str]:
    """What is uncertain in umemc's own model of this architecture: said where that model's figures are used, never
    where llama.cpp's answer (or a measurement) sized the model."""
    src, at = loaded.source, ("models", m.name, "model")
    if shape.unmodelled:
        return [
            src.warning(
                at,
                f"architecture {shape.arch!r} is not one umemc models: weights are exact from the header; "
                + "; ".join(shape.unmodelled)
                + "; `umemc check --measure` asks llama.cpp itself",
            )
        ]
    if layers_known(shape.arch) and not facts(shape.arch).modelled:
        return [
            src.warning(
                at,
                f"umemc sizes {shape.arch!r}'s KV cache and recurrent state by llama.cpp's rules, but not its "
                "compute graph: compute follows the generic rules and may be off by tens of percent; "
                "`umemc check --measure` asks llama.cpp itself",
            )
        ]
    return []


def _facts(
    loaded: LoadedStack, m: ResolvedModel, entry: LockEntry | None, warnings: list[str]
) -> tuple[GgufFacts | None, str]:
    """The GGUF header's facts: the file's own where it is here, else the header the calibration file recorded,
    if it holds up (the calibration file is input: it may sit in a shared repository)."""
    if m.model_present:
        return _read(loaded, m.model_path, ("models", m.name, "model")), "gguf"
    if entry is not None and entry.header is not None:
        name = path_for(loaded.path).name
        wrong: str | None
        try:
            facts = facts_from_lock(entry.header, str(m.model_path))
        except ValueError as exc:
            wrong = str(exc)
        else:
            wrong = implausible_header(facts, entry.file.size if entry.file is not None else None)
        if wrong is not None:
            said = (
                f"{name}: the header recorded for {m.model_path.name if m.model_path else 'its file'} is not used: "
                f"{wrong} (a stale or forged record)"
            )
            if m.spec.memory is None and LLM_PRESETS.get(m.spec.arch or "") is None:  # nothing else sizes it
                raise loaded.source.error(
                    ("models", m.name, "model"),
                    f"file not found: {m.model_path}; {said}",
                    'put the file here and run `umemc calibrate`, or give arch = "<preset>" or memory = "…"',
                )
            warnings.append(
                loaded.source.warning(
                    ("models", m.name), f"{said}; with the file here, `umemc calibrate` records it again", what="table"
                )
            )
            return None, "arch"
        return facts, "lock"
    return None, "arch"


# The fewest bits a weight of a language model's matrices takes in any GGUF type llama.cpp writes (IQ1_S: 1.5625).
MIN_BITS_PER_WEIGHT = 1.5
# What a GGUF file holds beyond its tensors: its header (read within this bound) and the alignment of the data.
MAX_HEADER_BYTES = 64 * 1024 * 1024 + 1024 * 1024


def implausible_header(facts: GgufFacts, file_size: int | None) -> str | None:
    """Why a recorded header cannot be the file's (None where it can): its tensor bytes against the file's recorded
    size (a single file holds its tensors and a header of at most MAX_HEADER_BYTES; the first part of a split holds
    only some), and against the fewest bytes its own shape needs: the token embeddings and, per layer, an
    n_embd x n_embd projection and its feed-forward matrices (the experts' too), at MIN_BITS_PER_WEIGHT."""
    shape, have = facts.shape, facts.tensor_bytes
    split = SPLIT.match(Path(facts.path).name) is not None
    if file_size is not None and have > file_size and not split:
        return f"{have} bytes of tensors in a file of {file_size} bytes"
    if file_size is not None and not split and file_size - have > MAX_HEADER_BYTES:
        return f"{have} bytes of tensors in a file of {file_size} bytes: the rest is larger than any GGUF header"
    if shape is None:
        return None
    dense = shape.n_layer_dense_lead if shape.n_expert else shape.n_layer
    ffn = dense * 2 * shape.n_embd * shape.n_ff
    ffn += (shape.n_layer - dense) * 2 * shape.n_embd * (shape.n_expert * shape.n_ff_exp + shape.n_ff_shexp)
    weights = shape.n_vocab * shape.n_embd + shape.n_layer * shape.n_embd * shape.n_embd + ffn
    least = int(weights * MIN_BITS_PER_WEIGHT / 8)
    if have < least:
        return (
            f"{have} bytes of tensors where its own shape ({shape.n_layer} layers of {shape.n_embd}, a vocabulary "
            f"of {shape.n_vocab}) needs at least {least}"
        )
    return None


def _read(loaded: LoadedStack, path: Path | None, at: tuple[str, ...]) -> GgufFacts:
    assert path is not None  # only called for files resolve found present
    try:
        return read_gguf(path)
    except NotGguf as exc:
        raise loaded.source.error(at, str(exc)) from None


def _vision(
    loaded: LoadedStack, m: ResolvedModel, facts: GgufFacts | None, preset: object
) -> tuple[Figure, Figure] | None:
    spec = m.spec
    vshape: VisionShape | None = getattr(preset, "vision", None)
    if m.mmproj_present:
        proj = _read(loaded, m.mmproj_path, ("models", m.name, "mmproj"))
        weights = Figure(
            "projector",
            proj.tensor_bytes,
            "sum of tensor bytes in the mmproj GGUF header (exact)",
            {"file": str(m.mmproj_path), "tensors": proj.n_tensors},
        )
        vshape = proj.vision or vshape
    elif vshape is not None and (spec.mmproj is not None or preset is not None):
        weights = projector_from_preset(vshape, spec.arch or "")
    else:
        return None
    if vshape is None:
        return weights, Figure("projector compute", 0, "unknown encoder shape (no clip.vision keys)")
    return weights, vision_compute_figure(vshape, spec.image_size, flash_attn=spec.flash_attn)


def _repack(loaded: LoadedStack, m: ResolvedModel, repack_bytes: int) -> Figure | None:
    """On the CPU, llama.cpp copies some weights into a repacked layout. With mmap the file's pages of
    those tensors were read to make the copy and stay resident until the kernel reclaims them, so
    the process holds both: budget both. Without mmap the copy replaces the file's tensors."""
    spec = m.spec
    if (loaded.platform.kind != "cpu" and spec.gpu is not False) or not m.mmap or not repack_bytes:
        return None
    if NO_REPACK_FLAGS.get(spec.runtime, frozenset()) & set(spec.args):
        return None
    how = {"llama-server": "add --no-repack to args to avoid it (slower prompt processing)"}
    return Figure(
        "repacked copy",
        repack_bytes,
        "CPU_REPACK buffer: Q4_0/Q4_K/IQ4_NL/MXFP4 matrices and expert stacks re-laid out by llama.cpp's CPU "
        "backend, held besides the mapped file pages they were read from (reclaimable: resident memory may later "
        "fall by this much)",
        {
            "assumes": f"{REPACK_ISA} (umemc calibrate measures what this CPU's build repacks)",
            "avoid": how.get(spec.runtime, f"{spec.runtime} cannot turn repacking off; mmap = false avoids the double"),
        },
    )


@cache
def _preset_repack(preset: LlmPreset | None, ftype: str) -> int:
    """Bytes of a preset's tensors the CPU backend repacks, once per (preset, file type): a stack of many models
    has few distinct presets."""
    if preset is None:
        return 0
    main = preset.shape.n_layer_main
    return sum(
        tensor_bytes(t, ne)
        for name, ne, t in preset_mix(preset, ftype)
        if is_repacked(name, t, ne) and loaded(name, main)
    )


TEMPLATE_FLAGS = ("--chat-template", "--chat-template-file", "--chat_format", "--chat_handler")


def _template_warning(loaded: LoadedStack, m: ResolvedModel, facts: GgufFacts | None, family: str) -> list[str]:
    """A chat model whose GGUF has no chat template, and the stack gives none: llama.cpp then formats chats its
    own default way (ChatML), and a model trained on another format answers with turn markers as text."""
    from ..catalog.chat_templates import BY_ARCH, FORMATS, is_file

    spec = m.spec
    chats = family in ("llm", "vision") and spec.kind in (None, "chat")
    name = spec.chat_template
    if spec.runtime == "llama-server" and name is not None and not is_file(name) and name not in FORMATS:
        return [
            loaded.source.warning(
                ("models", m.name, "chat_template"),
                f'llama-server applies the built-in template "{name}" only with Jinja off, and then refuses every '
                f"request that carries tools (agents send them); umemc keeps Jinja on for {', '.join(FORMATS)}: "
                "give the model's own template as a .jinja file to keep tool calling",
            )
        ]
    given = name is not None or any(a.split("=", 1)[0] in TEMPLATE_FLAGS for a in spec.args)
    if facts is None or facts.chat_template is not False or not chats or given:
        return []
    known = BY_ARCH.get(facts.general_arch)
    hint = (
        f'set chat_template = "{known}" (llama.cpp\'s built-in template for {facts.general_arch})'
        if known
        else "set chat_template to a llama.cpp built-in name (llama-server --help lists them) or a .jinja file"
    )
    return [
        loaded.source.warning(
            ("models", m.name),
            f"the GGUF file has no chat template (tokenizer.chat_template) and the stack sets none: llama.cpp "
            f"falls back to ChatML and chat answers may be garbage; {hint}",
            what="table",
        )
    ]


def _warnings(loaded: LoadedStack, m: ResolvedModel, shape: LlmShape, ftype: str, family: str, kv: Figure) -> list[str]:
    spec, at, src, out = m.spec, ("models", m.name), loaded.source, []
    if spec.runtime in FULL_SWA_CACHE and shape.sliding_window and any(shape.swa_layers):
        small = kv_figure(
            shape, spec.context, spec.parallel, spec.ubatch, spec.kv_cache, swa_full=False, flash_attn=spec.flash_attn
        ).bytes
        if kv.bytes > small:
            out.append(
                src.warning(
                    at + ("runtime",),
                    f"{spec.runtime} keeps full-size KV caches on the model's sliding-window layers "
                    f"(llama.cpp's swa_full default; its server has no setting for it): KV {with_gib(kv.bytes)} "
                    f"instead of {with_gib(small)} with llama-server, which keeps only the window",
                )
            )
    want = _WANTS.get(family)
    if want and FILE_TYPE_BITS.get(ftype, 99) < FILE_TYPE_BITS[want[0]]:
        out.append(src.warning(at + ("quant",), f"{family} model quantized to {ftype}: {want[1]}; consider {want[0]}"))
    if quantized_kv(spec.kv_cache) and not spec.flash_attn:
        out.append(
            src.warning(
                at + ("kv_cache",),
                f'kv_cache = "{spec.kv_cache}" without flash attention: '
                "llama.cpp refuses a quantized V cache unless flash_attn = true",
            )
        )
    if shape.n_ctx_train and spec.context > shape.n_ctx_train:
        out.append(
            src.warning(
                at + ("context",),
                f"context {spec.context} is above the model's trained "
                f"context {shape.n_ctx_train}: quality degrades without RoPE scaling",
            )
        )
    if not shape.causal and spec.context > spec.ubatch:
        longest = min(spec.context, shape.n_ctx_train or spec.context)
        out.append(
            src.warning(
                at + ("ubatch",),
                f"embedding inputs must fit one ubatch: inputs longer than "
                f"{spec.ubatch} tokens will be rejected (context is {spec.context}); fix: ubatch = {longest} takes "
                f"inputs up to {longest} tokens (its compute buffers grow with it, and this check counts them), or "
                f"context = {spec.ubatch} says what it takes",
            )
        )
    return out
