"""The one place a bundle reaches the disk: atomically (temporary directory, then an atomic swap),
so a failure or Ctrl-C never leaves half a bundle, and an existing directory is replaced only when
it is an earlier umemc bundle. A bundle holds the workers' environments (tokens, keys): directories
are 0700 and files 0600 (scripts 0700), whatever the umask."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from .errors import UsageError

MARKER = ".umemc-bundle"
# Above this many files one sync of the filesystems before the swap costs less than a flush per file (a 5000-model
# Kubernetes build writes 6000: 4.9 s of fsync alone)
SYNC_ONCE_ABOVE = 64
MARKER_TEXT = "umemc bundle v1\n"
_RENAME_EXCHANGE = 2


def is_bundle(path: Path) -> bool:
    marker = path / MARKER
    return marker.is_file() and marker.read_text().startswith("umemc bundle")


def write_bundle(target: Path, files: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[str]:
    """Write `files` (relative path -> text, or such pairs as they are made) as the directory `target`; returns the
    relative paths written."""
    target = target.absolute()
    if target.is_symlink():
        raise UsageError(
            f"refusing to write a bundle through the symbolic link {target} "
            f"(it points to {os.readlink(target)}); give the real directory"
        )
    if target.exists() and not (target.is_dir() and is_bundle(target)):
        raise UsageError(
            f"refusing to replace {target}: it exists and is not a umemc bundle "
            f"(no {MARKER}); choose another -o directory or remove it yourself"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        each = isinstance(files, Mapping) and len(files) <= SYNC_ONCE_ABOVE  # each flushed, else one sync of all
        if isinstance(files, Mapping) and each:
            made: set[Path] = set()
            for rel, text in files.items():
                _write_file(tmp / rel, text, durable=True, made=made)
            written = list(files)
        else:
            written = _write_many(tmp, files.items() if isinstance(files, Mapping) else files)
        _write_file(tmp / MARKER, MARKER_TEXT, durable=each)
        if not each:
            os.sync()  # every file on disk before the swap makes them the bundle
        os.chmod(tmp, 0o700)  # worker environments may hold secrets: the bundle is its owner's alone
        if target.exists():
            _swap(tmp, target)  # tmp now holds the previous bundle
        else:
            os.rename(tmp, target)
    finally:
        if tmp.exists():
            _remove(tmp)
    return written


THREADS = 4  # a filesystem creates and unlinks files of one directory faster from a few threads at once (measured:
# 6000 files in 0.25-0.3 s from 4 threads, 0.1-1.1 s from one, on ext4 in a VM)


def _write_many(root: Path, files: Iterable[tuple[str, str]]) -> list[str]:
    """Many files, written by THREADS threads as they come; each directory made once, before its first file is
    handed over. Returns their relative paths."""
    from concurrent.futures import Future, ThreadPoolExecutor

    made: set[Path] = set()
    written: list[str] = []
    pending: list[Future[None]] = []
    with ThreadPoolExecutor(THREADS) as pool:
        for rel, text in files:
            path = root / rel
            if path.parent not in made:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                made.add(path.parent)
            pending.append(pool.submit(_write_file, path, text, durable=False, fresh=True))
            written.append(rel)
        for done in pending:
            done.result()  # the first failure is raised here (the temporary directory is then removed)
    return written


def _remove(path: Path) -> None:
    """Remove a directory tree written by write_bundle (an earlier bundle, or this one's temporary copy): its files
    unlinked from THREADS threads, then its directories. Anything else in it (a link, a socket) goes as a file."""
    from concurrent.futures import ThreadPoolExecutor

    folders, files = [], []
    for top, dirs, names in os.walk(path):
        folders.append(top)
        files += [os.path.join(top, n) for n in names]
        files += [os.path.join(top, d) for d in dirs if os.path.islink(os.path.join(top, d))]
    if len(files) <= SYNC_ONCE_ABOVE:
        shutil.rmtree(path)
        return

    def unlink(share: list[str]) -> None:
        for f in share:
            os.unlink(f)

    with ThreadPoolExecutor(THREADS) as pool:
        for done in [pool.submit(unlink, files[i::THREADS]) for i in range(THREADS)]:
            done.result()
    for folder in reversed(folders):
        os.rmdir(folder)


def _write_file(
    path: Path, text: str, *, durable: bool = True, made: set[Path] | None = None, fresh: bool = False
) -> None:
    """One file of the bundle, its mode exactly (whatever the umask); `made`: the directories made so far;
    `fresh`: its directory exists already."""
    if not fresh and (made is None or path.parent not in made):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if made is not None:
            made.add(path.parent)
    mode = 0o700 if path.suffix == ".sh" else 0o600
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data) :]
        os.fchmod(fd, mode)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _swap(a: Path, b: Path) -> None:
    """Exchange two directories in one step (Linux renameat2 RENAME_EXCHANGE); elsewhere, two
    renames with the old bundle kept until the new one is in place."""
    import ctypes  # only here: ctypes costs ~40 ms to import, and most writes are to a new directory
    import ctypes.util

    libc_name = ctypes.util.find_library("c")
    renameat2 = getattr(ctypes.CDLL(libc_name, use_errno=True), "renameat2", None) if libc_name else None
    if renameat2 is not None:
        at_fdcwd = -100
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
            return
    old = b.with_name(f".{b.name}.old")
    if old.exists():
        shutil.rmtree(old)
    os.rename(b, old)
    os.rename(a, b)
    os.rename(old, a)
