"""A vLLM or MLX model as the stack names it: the keys such an engine takes, the Hugging Face model directory it loads
(read as one, its context one the model was made for) and, for `hf = "owner/name"` not downloaded yet, the sparse copy
of that directory its headers on the Hub sized (umemc.hub.directory)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog.runtimes import MLX_KV, VLLM_KV
from .load import Document, Source
from .models import ModelSpec
from .types import toml_repr

if TYPE_CHECKING:
    from ..catalog.hfdir import HfModel


def on_hub(doc: Document, spec: ModelSpec, at: tuple[str, ...], path: Path) -> Path | None:
    """A vLLM or MLX model on the Hub, not downloaded: the sparse copy of its directory its headers sized (None where
    the Hub could not be asked and `memory` gives the size)."""
    from ..hub.directory import parse_repo, sparse_copy
    from ..hub.ref import HubFailure

    pull = "`umemc pull` downloads it"
    try:
        copy, remote = sparse_copy(parse_repo(str(spec.hf), spec.hf_revision))
    except HubFailure as exc:
        if spec.memory is not None:
            doc.warnings.append(doc.source.warning(at, f"not downloaded yet ({path}): {exc}; {pull}"))
            return None
        raise doc.source.error(
            at, f"not downloaded yet ({path}), and the Hub could not size it: {exc}", f"{pull}, or give memory"
        ) from None
    size = sum(p.size for p in remote.parts)
    doc.warnings.append(
        doc.source.warning(
            at,
            f"not downloaded yet ({path}): sized from its files' headers on the Hub ({spec.hf} at "
            f"{remote.commit[:12]}, {size} bytes); {pull}",
        )
    )
    return copy


def check_keys(spec: ModelSpec, src: Source, at: tuple[str, ...]) -> None:
    """vLLM and MLX: a cache type the engine has; a model directory on disk."""
    kinds = VLLM_KV if spec.runtime == "vllm" else MLX_KV
    if spec.kv_cache not in kinds:
        raise src.error(
            at + ("kv_cache",),
            f'runtime = "{spec.runtime}" has no {spec.kv_cache} cache',
            f"use kv_cache = {' or '.join(toml_repr(k) for k in kinds)}",
        )


def check_dir(spec: ModelSpec, src: Source, at: tuple[str, ...], model_at: tuple[str, ...], path: Path) -> HfModel:
    """vLLM and MLX: a Hugging Face model directory that reads as one (what it read is returned: the estimate and
    the launcher use it), a context the model was made for (vLLM refuses a longer one at start)."""
    from ..catalog.hfdir import NotAModel
    from ..catalog.hfdir import read as read_dir

    if not path.is_dir():
        raise src.error(
            model_at,
            f"not a directory: {path}",
            f'runtime = "{spec.runtime}" loads a Hugging Face model directory (config.json and *.safetensors)',
        )
    try:
        model = read_dir(path)
    except NotAModel as exc:
        raise src.error(model_at, str(exc)) from None
    except OSError as exc:
        raise src.error(model_at, f"cannot read {exc.filename or path}: {exc.strerror}") from None
    limit = model.attention.max_position
    if spec.runtime == "vllm" and limit is not None and spec.context > limit:
        raise src.error(
            at + ("context",),
            f"{spec.context} tokens is past the {limit} the model was made for (max_position_embeddings): vLLM "
            "refuses to start",
            f"context = {limit}",
        )
    return model
