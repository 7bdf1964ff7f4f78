"""`umemc pull`: a Hub model's files onto this machine, every part of a split GGUF, each checked against the
sha256 the Hub announced before it is put where the stack names it.

huggingface_hub finds each file (umemc.hub.remote.describe: commit, size, sha256, the CDN's URL) and supplies
the authenticated HTTP session; the bytes are fetched here, because huggingface_hub (2.x) keeps a partial
download only for the life of one process: an interrupted 60 GB pull would start again from zero. Here a
download goes to `FILE.part` beside its destination and an interrupted one (Ctrl-C, kill -9, a dropped
connection) continues from that file's end with a range request, the next time `umemc pull` runs. The sha256 is
computed while the bytes arrive (a resumed download first re-reads its part), and the finished file is renamed
into place: a crash leaves the old state or the new one, never a file that looks whole and is not.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from .ref import HfRef, HubFailure
from .remote import TIMEOUT_S, Remote, RemotePart, endpoint, offline, token

VERIFIED = ".umemc-verified.json"  # beside the files: what was checked, so a second pull does not hash 60 GB again
CHUNK = 1 << 20
TRIES = 3  # a dropped connection is resumed this often before pull gives up (and a later pull resumes it)


@dataclass(frozen=True)
class Fetched:
    path: Path
    size: int
    downloaded: int  # bytes fetched by this pull (0: it was here already, verified)
    verified: bool  # its sha256 matched the Hub's (False only for a file the Hub gives no sha256 for)


def where(ref: HfRef, dest: Path, part: str) -> Path:
    """Where a part goes: the first at `dest`, the others beside it under their own names."""
    return dest if part == ref.path else dest.parent / PurePosixPath(part).name


def partial_path(target: Path) -> Path:
    return target.with_name(target.name + ".part")


def needed(remote: Remote, dest: Path) -> int:
    """Bytes still to download (what is not here yet, partial downloads counted as far as they got)."""
    out = 0
    for p in remote.parts:
        target = where(remote.ref, dest, p.path)
        if _size(target) == p.size:
            continue
        out += p.size - min(p.size, _size(partial_path(target)) or 0)
    return out


def pull(remote: Remote, dest: Path, progress: bool = True) -> list[Fetched]:
    """Every part of the model at the commit `remote` resolved to, into place; raises HubFailure."""
    if offline():
        raise HubFailure("HF_HUB_OFFLINE is set")
    _check_space(remote, dest)
    out = []
    for part in remote.parts:
        target = where(remote.ref, dest, part.path)
        if _size(target) == part.size and _known(target, part):
            out.append(Fetched(target, part.size, 0, part.sha256 is not None))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        got, digest = _fetch(part, partial_path(target), progress)
        verified = _check(partial_path(target), part, digest)
        os.replace(partial_path(target), target)
        _fsync_dir(target.parent)
        _remember(target, part)
        out.append(Fetched(target, part.size, got, verified))
    return out


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _check_space(remote: Remote, dest: Path) -> None:
    need = needed(remote, dest)
    here = dest.parent
    while not here.exists() and here != here.parent:
        here = here.parent
    free = shutil.disk_usage(here).free
    if need > free:
        from ..units import human

        raise HubFailure(f"{remote.ref.repo}/{remote.ref.path} needs {human(need)} at {here}; {human(free)} is free")


@dataclass
class _Download:
    """One part's download in progress: the file written, the sha256 of what it holds, where it ends."""

    f: Any
    h: Any
    bar: Any
    have: int
    fetched: int = 0  # bytes this pull got

    def restart(self) -> None:
        self.f.seek(0)
        self.f.truncate()
        self.h = hashlib.sha256()
        self.bar.reset(total=self.bar.total)
        self.have = 0

    def write(self, chunk: bytes) -> None:
        self.f.write(chunk)
        self.h.update(chunk)
        self.bar.update(len(chunk))
        self.have += len(chunk)
        self.fetched += len(chunk)


def _fetch(part: RemotePart, partial: Path, progress: bool) -> tuple[int, str]:
    """Download `part` into `partial`, continuing what is there; returns the bytes fetched and the sha256."""
    from tqdm import tqdm

    have = _size(partial) or 0
    if have > part.size:
        partial.unlink()
        have = 0
    h = _hash_of(partial, have, progress)
    name = PurePosixPath(part.path).name
    with (
        partial.open("r+b" if have else "wb") as f,
        tqdm(total=part.size, initial=have, unit="B", unit_scale=True, desc=name, disable=not progress) as bar,
    ):
        f.seek(have)
        d = _Download(f, h, bar, have)
        for attempt in range(TRIES):
            try:
                _stream(part, d)
                break
            except _Dropped as exc:
                if attempt == TRIES - 1:
                    raise HubFailure(
                        f"{name}: the download stopped at {d.have} of {part.size} bytes ({exc}); "
                        "`umemc pull` again continues from there"
                    ) from None
        f.flush()
        os.fsync(f.fileno())
    if d.have != part.size:
        raise HubFailure(f"{name}: the Hub sent {d.have} of {part.size} bytes; `umemc pull` again continues from there")
    return d.fetched, d.h.hexdigest()


class _Dropped(Exception):
    """The connection failed mid-download: what arrived is kept, and the next try asks for the rest."""


def _stream(part: RemotePart, d: _Download) -> None:
    """One GET from where the download ends on (a range request when resuming)."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined,unused-ignore]  # lazily exported

    same_host = urlparse(part.location).netloc == urlparse(endpoint()).netloc
    headers: dict[str, Any] = build_hf_headers(token=token() if same_host else False)  # never a token to a CDN
    headers["Accept-Encoding"] = "identity"
    if d.have:
        headers["Range"] = f"bytes={d.have}-"
    try:
        with get_session().stream(
            "GET", part.location, headers=headers, timeout=TIMEOUT_S, follow_redirects=True
        ) as response:
            status = response.status_code
            if d.have and status == 416 and d.have == part.size:
                return
            if status == 200 and d.have:  # the range was ignored: start again from the first byte
                d.restart()
            elif status not in (200, 206):
                raise HubFailure(f"the Hub answered {status} for {part.path}")
            elif status == 206 and not response.headers.get("Content-Range", "").startswith(f"bytes {d.have}-"):
                raise HubFailure(f"the Hub sent another range of {part.path} than asked")
            for chunk in response.iter_bytes(CHUNK):
                d.write(chunk)
    except HubFailure:
        raise
    except Exception as exc:  # noqa: BLE001 - the HTTP client's errors (a dropped connection, a timeout)
        raise _Dropped(f"{type(exc).__name__}: {exc}") from None


def _hash_of(partial: Path, have: int, progress: bool) -> Any:
    """sha256 over what a resumed download already holds."""
    from tqdm import tqdm

    h = hashlib.sha256()
    if not have:
        return h
    with (
        partial.open("rb") as f,
        tqdm(total=have, unit="B", unit_scale=True, desc=f"re-reading {partial.name}", disable=not progress) as bar,
    ):
        while chunk := f.read(8 * CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h


def _check(partial: Path, part: RemotePart, digest: str) -> bool:
    """The download's sha256 against the Hub's; a mismatch removes it (a later pull downloads it again)."""
    if part.sha256 is None:
        return False
    if digest != part.sha256:
        partial.unlink(missing_ok=True)
        raise HubFailure(
            f"{part.path}: sha256 {digest} is not the Hub's {part.sha256}; the file was removed "
            "(`umemc pull` downloads it again)"
        )
    return True


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _known(target: Path, part: RemotePart) -> bool:
    """Whether this very file (size, mtime) was verified against this sha256 before."""
    record = _records(target.parent).get(target.name)
    st = target.stat()
    return record == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": part.sha256}


def _records(directory: Path) -> dict[str, object]:
    try:
        doc = json.loads((directory / VERIFIED).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _remember(target: Path, part: RemotePart) -> None:
    records = _records(target.parent)
    st = target.stat()
    records[target.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": part.sha256}
    tmp = target.parent / f".{VERIFIED}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, target.parent / VERIFIED)
    except OSError:
        tmp.unlink(missing_ok=True)  # a note to save work later, not a result: the pull itself succeeded
