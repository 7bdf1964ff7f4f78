"""What the Hub says of a file, and its GGUF header without the weights.

The Hub answers a HEAD of `ENDPOINT/OWNER/NAME/resolve/REVISION/PATH` with the commit the revision is at
(`X-Repo-Commit`), the file's size (`X-Linked-Size`) and, for a file kept in LFS (every GGUF), its sha256
(`X-Linked-Etag`), and sends the bytes from a CDN that honours HTTP range requests. huggingface_hub's
`get_hf_file_metadata` reads those headers; the header itself is read here with `Range: bytes=0-N`, N grown
until the GGUF header parses (4 MiB holds most: a 128k-token vocabulary is ~5 MB), and written into a sparse
copy of the file's full size in umemc's cache: umemc's header reader and llama.cpp's dry run (which reads no
weight) both run on that copy as on the real file. This module reads bytes and parses none: whoever asks hands in
what tells a whole header from a cut one (`HeaderFields`; the GGUF reader is the estimator's, and
umemc.estimate.hub_header makes a lock entry of what is read here).

HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE mean what they mean to huggingface_hub, read when used.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..cache import cache_dir
from ..lockfile import HEAD_BYTES
from .ref import HfRef, HubFailure

# A file's first bytes -> its header's fields when they hold the whole header, None when it runs past them (more is
# read); a ValueError saying why when they are no header the caller can read.
HeaderFields = Callable[[bytes], Mapping[str, object] | None]

FIRST_READ = HEAD_BYTES  # the identity umemc records of a file is the sha256 of its first 4 MiB
# The largest GGUF header read from the Hub: a 256k-token vocabulary with its merges is ~20 MB; a header that goes
# on past this is refused, never held in memory whole.
MAX_HEADER = 64 * 1024 * 1024
TIMEOUT_S = 20.0  # each read
HEADER_DEADLINE_S = 120.0  # the whole read of a header, however the bytes trickle in
SLOW_NOTE_S = 10.0  # a header read still under way after this long is said, once, with the bound it runs to
COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit id, as the Hub names one (X-Repo-Commit): it becomes a directory
MAX_PART_BYTES = 1 << 42  # 4 TiB: above any one file the Hub stores (its LFS files are at most 50 GB)


@dataclass(frozen=True)
class RemotePart:
    path: str
    size: int
    sha256: str | None
    location: str  # where its bytes are (the CDN's signed URL for an LFS file)
    header: bytes | None = None  # its first bytes, where they were read already (a split's first part)


@dataclass(frozen=True)
class Remote:
    ref: HfRef
    commit: str
    parts: list[RemotePart]


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def token() -> str | None:
    """HF_TOKEN, else the token `hf auth login` stored (huggingface_hub's own lookup)."""
    from huggingface_hub import get_token

    found: str | None = get_token()
    return found


def describe(ref: HfRef, fields: HeaderFields) -> Remote:
    """Every part's size, checksum and location at the revision's current commit (one HEAD each); a split's first
    header is read (through `fields`) to check its part count."""
    if offline():
        raise HubFailure("HF_HUB_OFFLINE is set")
    import huggingface_hub as hh

    parts: list[RemotePart] = []
    commit = ref.revision
    for i, path in enumerate(ref.parts):
        # the later parts at the commit the first resolved to: one consistent version of a split model
        try:
            part, said = head(ref, path, commit if i else ref.revision)
        except hh.errors.EntryNotFoundError as exc:
            raise HubFailure(_why(exc, ref, path)) from None
        if i == 0:
            commit = _checked_commit(said, ref)
        parts.append(part)
        if i == 0 and len(ref.parts) > 1:  # before a HEAD per part: does the file say it is split that way?
            parts[0] = _split_checked(parts[0], len(ref.parts), fields)
    return Remote(ref, commit, parts)


def head(ref: HfRef, path: str, revision: str) -> tuple[RemotePart, str | None]:
    """One file of the repository at `revision` (one HEAD): its size, checksum and location, and the commit the Hub
    says the revision is at. Raises HubFailure saying why; huggingface_hub's EntryNotFoundError (no such file) is
    let through for a caller to whom that is an answer."""
    import huggingface_hub as hh

    url = hh.hf_hub_url(ref.repo, path, revision=revision, endpoint=endpoint())
    try:
        meta = hh.get_hf_file_metadata(url, token=token(), timeout=TIMEOUT_S, endpoint=endpoint())
    except hh.errors.EntryNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - huggingface_hub and its HTTP client raise many kinds
        raise HubFailure(_why(exc, ref, path)) from None
    size = _check_size(meta.size, f"{ref.repo}/{path}")
    sha = meta.etag if meta.etag and len(meta.etag) == 64 and _hex(meta.etag) else None
    return RemotePart(path, size, sha, meta.location), meta.commit_hash


def _check_size(size: object, name: str) -> int:
    """A size the Hub gives names how much is read and written: a positive integer of a file's order, or refused."""
    if size is None:
        raise HubFailure(f"the Hub gave no size for {name}")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_PART_BYTES:
        raise HubFailure(f"the Hub gave {name} a size of {size!r}: not a file's size (1 byte to 4 TiB)")
    return size


def _checked_commit(commit: str | None, ref: HfRef) -> str:
    """The commit the Hub names becomes a directory of umemc's cache and a record in the calibration file: a commit
    id (40 hex digits) or nothing is written."""
    if not commit:
        raise HubFailure(f"the Hub named no commit for {ref.repo} at {ref.revision}")
    if not COMMIT.fullmatch(commit):
        shown = commit if len(commit) <= 80 else commit[:77] + "..."
        raise HubFailure(
            f"the Hub named {shown!r} as the commit of {ref.repo} at {ref.revision}: not a commit id (40 hex "
            "digits); nothing was written"
        )
    return commit


def _split_checked(first: RemotePart, count: int, fields: HeaderFields) -> RemotePart:
    """The first part of a split GGUF, its header read: its `split.count` must be the count its name says (a name
    cannot make umemc ask the Hub about thousands of parts the file does not have)."""
    head = read_header(first, fields)
    said = (fields(head) or {}).get("split.count")
    if said != count:
        raise HubFailure(f"{first.path}: its name says {count} parts, its header says {said!r}")
    return replace(first, header=head)


def _hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text.lower())


def _why(exc: Exception, ref: HfRef, path: str) -> str:
    from huggingface_hub import errors

    name = f"{ref.repo}/{path}"
    if isinstance(exc, errors.GatedRepoError):
        return f"{ref.repo} is gated: accept its terms on the Hub, then set HF_TOKEN"
    if isinstance(exc, errors.RepositoryNotFoundError):
        return f"no repository {ref.repo} on {endpoint()} (or it is private: set HF_TOKEN)"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{ref.repo} has no revision {ref.revision!r}"
    if isinstance(exc, errors.EntryNotFoundError):
        return f"{ref.repo} has no file {path} at {ref.revision}"
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(exc.response, "status_code", "?")
        return f"the Hub answered {status} for {name}"
    return f"cannot reach {endpoint()} ({type(exc).__name__}: {exc})"


def read_prefix(part: RemotePart, n: int) -> bytes:
    """The first n bytes of a part (one range request; a server that ignores the range is read no further)."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined,unused-ignore]  # lazily exported

    same_host = urlparse(part.location).netloc == urlparse(endpoint()).netloc
    headers: dict[str, Any] = build_hf_headers(token=token() if same_host else False)  # never a token to a CDN
    headers["Range"] = f"bytes=0-{n - 1}"
    headers["Accept-Encoding"] = "identity"
    out = bytearray()
    began = time.monotonic()
    deadline, noted = began + HEADER_DEADLINE_S, False
    try:
        with get_session().stream(
            "GET", part.location, headers=headers, timeout=TIMEOUT_S, follow_redirects=True
        ) as response:
            if response.status_code not in (200, 206):
                raise HubFailure(f"the Hub answered {response.status_code} for a range of {part.path}")
            for chunk in response.iter_bytes():
                out += chunk
                if len(out) >= n:
                    break
                if not noted and time.monotonic() - began > SLOW_NOTE_S:  # never a wait with nothing said
                    noted = True
                    print(
                        f"umemc: reading {part.path}'s header from {urlparse(part.location).netloc} is slow: "
                        f"{len(out)} of {n} bytes in {SLOW_NOTE_S:g} s; giving up at {HEADER_DEADLINE_S:g} s",
                        file=sys.stderr,
                        flush=True,
                    )
                if time.monotonic() > deadline:
                    raise HubFailure(
                        f"{part.path}: {len(out)} of the header's {n} bytes in {HEADER_DEADLINE_S:g} s: too slow, "
                        "gave up (a header's whole read is bounded)"
                    )
    except HubFailure:
        raise
    except Exception as exc:  # noqa: BLE001 - the HTTP client's errors, whatever their kind
        raise HubFailure(f"cannot read {part.path} from {endpoint()} ({type(exc).__name__}: {exc})") from None
    return bytes(out[:n])


def read_header(part: RemotePart, fields: HeaderFields) -> bytes:
    """The part's first bytes, enough to hold its whole GGUF header as `fields` tells (and at least its first
    4 MiB)."""
    if part.header is not None:
        return part.header
    n = min(part.size, FIRST_READ)
    while True:
        data = read_prefix(part, n)
        try:
            whole = fields(data) is not None
        except ValueError as exc:
            raise HubFailure(f"{part.path} is not a GGUF file umemc can read: {exc}") from None
        if whole:
            return data
        if n >= part.size or len(data) < n:
            raise HubFailure(f"{part.path}: the GGUF header runs past the end of the file")
        if n >= MAX_HEADER:
            raise HubFailure(
                f"{part.path}: a GGUF header larger than {MAX_HEADER >> 20} MiB (the bound on a header umemc "
                "reads; a real one is a few MB)"
            )
        n = min(part.size, n * 4, MAX_HEADER)


def header_copy_path(ref: HfRef, commit: str) -> Path:
    """The sparse copy of the first part (the others beside it, named as llama.cpp expects)."""
    return cache_dir() / "hub" / ref.repo / commit / ref.path


def header_copy(remote: Remote, fields: HeaderFields) -> tuple[Path, int, bytes]:
    """Sparse copies of every part (the header real, the rest a hole of the file's size) in the cache, made
    once per commit; returns the first's path, the bytes of the Hub's files they hold (what was read to make
    them), and the first part's first bytes."""
    first = header_copy_path(remote.ref, remote.commit)
    held, head = 0, b""
    for i, part in enumerate(remote.parts):
        path = first.parent / Path(part.path).name
        if not (path.exists() and path.stat().st_size == part.size):
            _write_sparse(path, read_header(part, fields), part.size)
        held += min(part.size, path.stat().st_blocks * 512)
        if i == 0:
            with path.open("rb") as f:
                head = f.read(FIRST_READ)
    return first, held, head


def _write_sparse(path: Path, data: bytes, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.truncate(size)  # the weights are a hole: no disk space, zeros if read
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
