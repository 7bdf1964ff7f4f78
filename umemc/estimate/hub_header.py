"""A Hub model's lock entry from its header on the Hub, without the weights: umemc.hub reads the bytes (a few MB
by range requests, into a sparse copy of the file), the GGUF reader here tells a whole header from a cut one and
reads the facts, as from the file itself."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from ..hub.ref import HfRef, HubFailure
from ..lockfile import HEAD_BYTES, FileIdentity, HubOrigin, HubPart, LockEntry
from .gguf_header import HeaderError, Truncated, parse_prefix


def header_fields(data: bytes) -> Mapping[str, object] | None:
    """The header's fields when `data` (a file's first bytes) holds all of it, None when it runs past them; a
    ValueError saying why when they are no GGUF header (umemc.hub.remote.HeaderFields)."""
    try:
        return parse_prefix(data).fields
    except Truncated:
        return None
    except HeaderError as exc:
        raise ValueError(str(exc)) from None


def lock_entry(ref: HfRef) -> LockEntry:
    """What umemc records of a Hub file it has not downloaded: where it comes from, its identity and its
    header's facts (exactly what the file itself would give)."""
    from ..hub.remote import describe, header_copy
    from .gguf_file import NotGguf, locked_header, read

    remote = describe(ref, header_fields)
    first, held, head = header_copy(remote, header_fields)
    try:
        facts = read(first)
    except NotGguf as exc:
        raise HubFailure(f"{ref.repo}/{ref.path}: {exc}") from None
    origin = HubOrigin(
        repo=ref.repo,
        path=ref.path,
        revision=ref.revision,
        commit=remote.commit,
        parts=[HubPart(path=p.path, size=p.size, sha256=p.sha256) for p in remote.parts],
        header_bytes=held,
    )
    ident = FileIdentity(size=remote.parts[0].size, sha256_head=hashlib.sha256(head[:HEAD_BYTES]).hexdigest())
    return LockEntry(file=ident, hub=origin, header=locked_header(facts))
