"""A Hugging Face model directory on the Hub (`hf = "owner/name"` for vLLM and MLX), sized before it is downloaded.

The files are found as transformers finds them (no listing of the repository): config.json, then the shards a
`model.safetensors.index.json` names, else the one `model.safetensors`. config.json and the index are read whole
(they are small); of each shard only its header is read, with range requests: the 8-byte length and the JSON after
it (safetensors' format). They are written into a sparse copy of the directory in umemc's cache, each shard at its
full size with its weights a hole, made once per commit: umemc's directory reader sizes the model from it exactly as
from the downloaded directory. `umemc pull` downloads the same files, with the tokenizer's and the chat template's
beside them (those the repository has).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..cache import cache_dir
from ..catalog.hfdir import MAX_HEADER
from .ref import HfRef, HubFailure, RefError, check_names, check_revision
from .remote import Remote, RemotePart, _checked_commit, _write_sparse, head, offline

CONFIG, INDEX, SINGLE = "config.json", "model.safetensors.index.json", "model.safetensors"
# beside the weights, what an engine loads from the directory (each where the repository has it)
COMPANIONS = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
SMALL = 16 * 1024 * 1024  # config.json or an index larger than this is no model's
MAX_SHARDS = 4096


def parse_repo(spelling: str, revision: str | None = None) -> HfRef:
    """`owner/name`: a whole repository (a model directory), its path empty."""
    hint = 'e.g. hf = "HuggingFaceTB/SmolLM2-135M-Instruct"'
    if "://" in spelling or spelling.startswith(("hf.co/", "huggingface.co/")):
        raise RefError("names a repository, not a URL", hint)
    parts = spelling.split("/")
    if len(parts) != 2:
        raise RefError("must be owner/repository (a model directory: vLLM and MLX load a whole repository)", hint)
    check_names(*parts)
    return HfRef(spelling, "", check_revision(revision))


def local_dir(ref: HfRef, models_dir: PurePosixPath | str) -> PurePosixPath:
    """Where `umemc pull` puts it by default: MODELS_DIR/owner/name."""
    return PurePosixPath(models_dir) / ref.repo


@dataclass(frozen=True)
class Found:
    commit: str
    files: list[RemotePart]  # config.json, the index, the shards, and the companions the repository has


def _head(ref: HfRef, path: str, revision: str, *, optional: bool = False) -> tuple[RemotePart, str] | None:
    """One file's size, checksum, location and the commit the revision is at (a HEAD); None for an optional
    file the repository lacks."""
    import huggingface_hub as hh

    try:
        part, commit = head(ref, path, revision)
    except hh.errors.EntryNotFoundError:
        if optional:
            return None
        raise HubFailure(f"{ref.repo} has no {path} at {revision}: not a model directory vLLM or MLX loads") from None
    return part, _checked_commit(commit, ref)


def _whole(part: RemotePart) -> bytes:
    from .remote import read_prefix

    if part.size > SMALL:
        raise HubFailure(f"{part.path} is {part.size} bytes: larger than any model's {part.path} ({SMALL >> 20} MiB)")
    data = read_prefix(part, part.size)
    if len(data) != part.size:
        raise HubFailure(f"{part.path}: {len(data)} of its {part.size} bytes came")
    return data


def _shards(index: bytes) -> list[str]:
    try:
        weight_map = json.loads(index).get("weight_map")
    except (ValueError, AttributeError, RecursionError):
        weight_map = None
    if not isinstance(weight_map, dict) or not weight_map:
        raise HubFailure(f"{INDEX} is not a safetensors index (no weight_map)")
    names = sorted({str(v) for v in weight_map.values()})
    bad = [n for n in names if "/" in n or n.startswith(".") or not n.endswith(".safetensors")]
    if bad or len(names) > MAX_SHARDS:
        raise HubFailure(f"{INDEX} names {bad[0] if bad else f'{len(names)} files'}: not the shards of one directory")
    return names


def find(ref: HfRef, *, companions: bool = False) -> tuple[Found, dict[str, bytes]]:
    """The directory's files at the revision's commit, and the small ones' bytes (config.json, the index)."""
    if offline():
        raise HubFailure("HF_HUB_OFFLINE is set")
    head = _head(ref, CONFIG, ref.revision)
    assert head is not None
    config, commit = head
    files, small = [config], {CONFIG: _whole(config)}
    index = _head(ref, INDEX, commit, optional=True)
    if index is not None:
        files.append(index[0])
        small[INDEX] = _whole(index[0])
        names = _shards(small[INDEX])
    else:
        names = [SINGLE]
    for name in names:
        got = _head(ref, name, commit)
        assert got is not None
        files.append(got[0])
    if companions:
        for name in COMPANIONS:
            got = _head(ref, name, commit, optional=True)
            if got is not None:
                files.append(got[0])
    return Found(commit, files), small


def _header(part: RemotePart) -> bytes:
    """A shard's first bytes: its 8-byte header length and the header (two range requests at most)."""
    from .remote import read_prefix

    first = read_prefix(part, min(part.size, 64 * 1024))
    if len(first) < 8:
        raise HubFailure(f"{part.path} is not a safetensors file (shorter than its header length)")
    (n,) = struct.unpack("<Q", first[:8])
    if n > MAX_HEADER or 8 + n > part.size:
        raise HubFailure(f"{part.path} is not a safetensors file (a header of {n} bytes)")
    return first[: 8 + n] if 8 + n <= len(first) else read_prefix(part, 8 + n)


def sparse_copy(ref: HfRef) -> tuple[Path, Remote]:
    """The directory in umemc's cache: config.json and the index whole, every shard's header in a file of its full
    size (the weights a hole), made once per commit; and where each file is on the Hub."""
    found, small = find(ref)
    where = cache_dir() / "hub" / ref.repo / found.commit / "directory"
    for part in found.files:
        path = where / part.path
        if path.exists() and path.stat().st_size == part.size:
            continue
        data = small.get(part.path)
        _write_sparse(path, data if data is not None else _header(part), part.size)
    return where, Remote(ref, found.commit, found.files)


def pull_remote(ref: HfRef) -> Remote:
    """What `umemc pull` downloads: the model's files and the companions the repository has."""
    found, _ = find(ref, companions=True)
    return Remote(ref, found.commit, found.files)
