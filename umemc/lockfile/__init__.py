"""`<stack>.calibration.json`, typed: what the real runtime measured, and the stack's lock.

For each llama.cpp-family model with a real file it records
- the file's identity (size, sha256 of its first 4 MiB) and its GGUF header facts (tensor bytes, types,
  shapes, metadata) — the *lock*: `umemc check` on a CI runner without the weights still uses exact
  sizes (source "lock"), and verifies them wherever the file is present;
- the memory-relevant flags it was started with and llama.cpp's own buffer report plus the process's
  resident memory after a warm-up request — the *calibration*: used instead of the estimate (source
  "measured") while the flags still match, ignored with a warning naming what changed otherwise;
- for a file named on the Hugging Face Hub (`hf`), where it comes from (`hub`: repository, revision, commit,
  each part's size and sha256): its header facts are read from the Hub before it is downloaded;
- llama.cpp's own dry run (`dry_run`, umemc.estimate.dryrun): what llama.cpp would allocate with exactly the flags the
  launcher passes, without reading a weight, with the identity of the llama.cpp that answered — used instead
  of the estimate (source "llama.cpp") while the flags, the file and that llama.cpp are unchanged.
A torch worker records its flags and its measured peak.

This is a bottom layer: the stack loader, the estimator (which turns a header into its own facts) and
`umemc calibrate` read and write it; llama.cpp's log is parsed by umemc.runtime.llamalog.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ContractError

if TYPE_CHECKING:
    from .entries import BufferReport as BufferReport
    from .entries import Bytes as Bytes
    from .entries import CalibrationDoc as CalibrationDoc
    from .entries import DryRun as DryRun
    from .entries import FileIdentity as FileIdentity
    from .entries import HubOrigin as HubOrigin
    from .entries import HubPart as HubPart
    from .entries import LockedHeader as LockedHeader
    from .entries import LockEntry as LockEntry
    from .entries import Measured as Measured
    from .entries import ToolIdentity as ToolIdentity

VERSION = 1
HEAD_BYTES = 4 * 1024 * 1024
MAX_BYTES = 2**60  # a byte count the file may say: a machine's worth at most (1 EiB)
# A figure in llama.cpp's log as llama.cpp prints it (%.2f MiB): anything else on such a line (a worker or a
# stand-in writing "... MiB", "1e999 MiB", 10^40 MiB) is not read as a figure
LOG_FIGURE = r"(\d{1,15}(?:\.\d{1,6})?)"
MAX_FILE_BYTES = 16 * 1024 * 1024  # a calibration file umemc writes is a few KiB a model
_ENTRIES = frozenset(
    {"BufferReport", "Bytes", "CalibrationDoc", "DryRun", "FileIdentity", "HubOrigin", "HubPart", "LockedHeader",
     "LockEntry", "Measured", "ToolIdentity"}
)  # fmt: skip


def __getattr__(name: str) -> Any:
    """The documents' types (umemc.lockfile.entries), built on first use: `umemc check` of a stack without a
    calibration file never builds them."""
    if name in _ENTRIES:
        from . import entries

        return getattr(entries, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def path_for(stack: Path) -> Path:
    return stack.with_name(stack.stem + ".calibration.json")


def identity(path: Path) -> FileIdentity:
    import hashlib

    from .entries import FileIdentity

    h = hashlib.sha256()
    with path.open("rb") as f:
        h.update(f.read(HEAD_BYTES))
    return FileIdentity(size=path.stat().st_size, sha256_head=h.hexdigest())


def load(stack: Path) -> dict[str, LockEntry]:
    """The stack's entries by model; none without a file. A file umemc cannot read is an error (exit 2): the file
    is input (it may sit in a shared repository), read within bounds, of a plain file only (a FIFO would block,
    a link to /dev/zero never end), every figure checked by its type."""
    path = path_for(stack)
    text = _read_bounded(path)
    if text is None:
        return {}
    from ..document import parse
    from .entries import CalibrationDoc

    return dict(parse(CalibrationDoc, text, path).models)


def _read_bounded(path: Path) -> bytes | None:
    try:  # O_NONBLOCK: a FIFO opens without waiting for a writer, and is refused below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ContractError(f"{path}: cannot read: {exc.strerror}") from None
    kind = _special(os.fstat(fd).st_mode)  # before fdopen, which refuses a directory with an error of its own
    if kind is not None:
        os.close(fd)
        raise ContractError(f"{path}: {kind}, not a file: a calibration file is plain JSON umemc wrote")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ContractError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB: not a calibration file umemc wrote")
    return data


def _special(mode: int) -> str | None:
    import stat

    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), None)


def save(stack: Path, models: dict[str, LockEntry]) -> Path:
    """Atomically: a reader sees the old file or the new one, never half of one."""
    from ..document import dump
    from .entries import CalibrationDoc

    path = path_for(stack)
    doc = CalibrationDoc(models=dict(sorted(models.items())))
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(dump(doc, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def tool_identity(path: Path) -> ToolIdentity | None:
    from .entries import ToolIdentity

    try:
        st = path.stat()
    except OSError:
        return None
    return ToolIdentity(path=str(path), size=st.st_size, mtime_ns=st.st_mtime_ns)


def totals(buffers: BufferReport) -> dict[str, int]:
    """Per kind over every device; a hybrid model's recurrent state (RS) counts with the KV cache."""
    out = {"model": 0, "kv": 0, "compute": 0, "output": 0}
    for kinds in buffers.values():
        for kind, size in kinds.items():
            out["kv" if kind == "rs" else kind] += size
    return out


def local(buffers: BufferReport) -> BufferReport:
    """The devices of the process's own machine: a split model's llama-server reports its RPC servers' buffers
    too (devices named RPC<n>[host:port]), which other machines hold, each under its own node's plan."""
    return {d: k for d, k in buffers.items() if not d.startswith("RPC")}


def host_bytes(buffers: BufferReport) -> int:
    """Buffers in host memory (they are part of the process's RSS): devices named CPU*, and a GPU backend's
    host buffers (Vulkan_Host, CUDA_Host, ROCm_Host: pinned or host-visible memory the driver maps into the
    process)."""
    return sum(sum(k.values()) for d, k in buffers.items() if d.upper().startswith("CPU") or d.endswith("_Host"))
