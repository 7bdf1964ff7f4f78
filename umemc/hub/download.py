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
import time
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
    recorded: bool = False  # verified at an earlier pull, its size and mtime unchanged since (not hashed now)


def where(ref: HfRef, dest: Path, part: str) -> Path:
    """Where a part goes: the first at `dest`, the others beside it under their own names; a whole repository's
    files (a model directory: the ref names no file) into `dest`."""
    if not ref.path:
        return dest / PurePosixPath(part).name
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


def pull(remote: Remote, dest: Path, *, progress: bool = True, verify: bool = False) -> list[Fetched]:
    """Every part of the model at the commit `remote` resolved to, into place; raises HubFailure. A part here
    already is taken as verified when its size and mtime are what they were at its verified download, unless
    `verify`: then it is hashed again (a file that no longer matches is refused, never removed)."""
    if offline():
        raise HubFailure("HF_HUB_OFFLINE is set")
    _check_space(remote, dest)
    out = []
    for part in remote.parts:
        target = where(remote.ref, dest, part.path)
        if _size(target) == part.size and _known(target, part):
            if verify and part.sha256 is not None:
                _rehash(target, part, progress=progress)
            out.append(Fetched(target, part.size, 0, part.sha256 is not None, recorded=not verify))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        got, digest = _fetch(part, partial_path(target), progress=progress)
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
    size: int  # what the Hub announced: never written past
    fetched: int = 0  # bytes this pull got

    def restart(self) -> None:
        self.f.seek(0)
        self.f.truncate()
        self.h = hashlib.sha256()
        self.bar.reset(total=self.bar.total)
        self.have = 0

    def write(self, chunk: bytes) -> bool:
        """Write what fits the announced size; False once it is reached (more is not read)."""
        chunk = chunk[: self.size - self.have]
        try:
            self.f.write(chunk)
        except OSError as exc:  # a full disk is no dropped connection: asking again would not help
            raise HubFailure(_unwritable(self.f, self.have, self.size, exc)) from None
        self.h.update(chunk)
        self.bar.update(len(chunk))
        self.have += len(chunk)
        self.fetched += len(chunk)
        return self.have < self.size


def _fetch(part: RemotePart, partial: Path, *, progress: bool) -> tuple[int, str]:
    """Download `part` into `partial`, continuing what is there; returns the bytes fetched and the sha256."""
    from tqdm import tqdm

    name = PurePosixPath(part.path).name
    if partial.is_symlink() or (partial.exists() and not partial.is_file()):
        raise HubFailure(f"{partial} is not a plain file (a link?): umemc writes no download through it; remove it")
    have = _size(partial) or 0
    if have > part.size:
        partial.unlink()
        have = 0
    h = _hash_of(partial, have, progress=progress)
    with (
        os.fdopen(os.open(partial, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), "r+b") as f,
        tqdm(total=part.size, initial=have, unit="B", unit_scale=True, desc=name, disable=not progress) as bar,
    ):
        f.seek(have)
        f.truncate()
        d = _Download(f, h, bar, have, part.size)
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
        try:
            f.flush()
            os.fsync(f.fileno())
        except OSError as exc:
            raise HubFailure(_unwritable(f, d.have, part.size, exc)) from None
    if d.have != part.size:
        raise HubFailure(f"{name}: the Hub sent {d.have} of {part.size} bytes; `umemc pull` again continues from there")
    return d.fetched, d.h.hexdigest()


def _unwritable(f: Any, have: int, size: int, exc: OSError) -> str:
    return (
        f"cannot write the download to {getattr(f, 'name', '?')} ({exc.strerror or exc}) at {have} of {size} bytes: "
        "free room there, then `umemc pull` again continues from what was written"
    )


MIN_RATE = 32 * 1024  # bytes/s, averaged once a download has run RATE_AFTER_S: slower is a Hub that trickles
RATE_AFTER_S = 60.0


def _check_rate(part: RemotePart, got: int, seconds: float) -> None:
    """A download that trickles (each read within the timeout, the whole never ending) is given up."""
    if seconds > RATE_AFTER_S and got / seconds < MIN_RATE:
        raise HubFailure(
            f"{PurePosixPath(part.path).name}: {got} bytes in {seconds:.0f} s, below {MIN_RATE // 1024} KiB/s: too "
            "slow, gave up; `umemc pull` again continues from there"
        )


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
            began, first = time.monotonic(), d.have
            for chunk in response.iter_bytes():  # as it arrives: a trickle is seen, not buffered to a MiB
                if not d.write(chunk):
                    return  # the announced size is here: anything more the Hub sends is not read
                _check_rate(part, d.have - first, time.monotonic() - began)
    except HubFailure:
        raise
    except Exception as exc:  # noqa: BLE001 - the HTTP client's errors (a dropped connection, a timeout)
        raise _Dropped(f"{type(exc).__name__}: {exc}") from None


def _hash_of(partial: Path, have: int, *, progress: bool) -> Any:
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


def _rehash(target: Path, part: RemotePart, *, progress: bool) -> None:
    digest = _hash_of(target, target.stat().st_size, progress=progress).hexdigest()
    if digest != part.sha256:
        raise HubFailure(
            f"{target}: sha256 {digest} is not the Hub's {part.sha256}: the file changed since it was verified; "
            "remove it and `umemc pull` downloads it again"
        )


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
