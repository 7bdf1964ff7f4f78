"""The calibration file's documents (`<stack>.calibration.json`), typed: a model's lock entry and what it holds.
Imported only where such a document is built or read (umemc.lockfile names them for its callers): a stack
without a calibration file is checked without building these models."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from msgspec import Meta

from ..document import Document
from . import MAX_BYTES, VERSION

# A byte count as the file may say it: a machine's worth at most, never negative (the file is input: a figure
# outside this is refused with the field that holds it)
Bytes = Annotated[int, Meta(ge=0, le=MAX_BYTES)]
# llama.cpp's buffer report: {device: {model|kv|rs|compute|output: bytes}}
BufferReport = dict[str, dict[str, Bytes]]


class FileIdentity(Document):
    size: Bytes
    sha256_head: str


class LockedHeader(Document):
    """The GGUF header facts the estimator needs when the file is absent (its LlmShape as a table)."""

    tensor_bytes: Bytes
    n_tensors: Bytes
    type_counts: dict[str, int]
    file_type: str | None
    general_arch: str
    shape: dict[str, Any] | None
    repack_bytes: Bytes = 0
    skipped_bytes: Bytes = 0


class Measured(Document):
    buffers: BufferReport = {}  # llama.cpp's own report (llama.cpp models)
    rss_bytes: Bytes | None = None  # resident after a warm-up request (llama.cpp models)
    peak_bytes: Bytes | None = None  # peak resident during its own warm-up (torch workers)
    at: str = "?"
    runtime_version: str = "?"


class ToolIdentity(Document):
    """A llama.cpp build as the file system names it: a changed binary (or library) is another llama.cpp."""

    path: str
    size: int
    mtime_ns: int


class DryRun(Document, kw_only=True):
    """llama.cpp's answer to "what would you allocate?" (llama_model_params.no_alloc): per buffer, in bytes.

    `buffers` holds what its log states to 0.01 MiB ({buffer: {kv, rs, compute, output}}, and `model: 0` for
    each buffer the weights would go to: a no_alloc load logs their sizes as 0.00 MiB); `table` its memory
    breakdown in whole MiB ({buffer type or device: {model, context, compute}}; llama-fit-params only). The
    estimator turns them into figures (umemc.estimate.recorded)."""

    tool: str  # "llama-fit-params" | "llama-cpp-python"
    build: str  # the llama.cpp that answered, as it names itself
    identity: ToolIdentity
    flags: dict[str, Any]  # the memory-relevant settings it ran with (umemc.estimate.keys.dry_run)
    argv: list[str]
    buffers: BufferReport = {}
    table: BufferReport = {}
    seconds: float
    peak_rss_bytes: Bytes | None = None  # what the dry run itself cost: its peak resident set
    # and what it read until umemc stopped it (Linux /proc/PID/io rchar): the header, not the weights, unless
    # the machine was so busy that llama-server's real load, which follows its answer, began before the kill
    read_bytes: Bytes | None = None
    at: str


class HubPart(Document):
    path: str  # in the repository
    size: Bytes
    sha256: str | None = None  # the Hub's checksum of the file (its LFS object id); None for a file kept in git


class HubOrigin(Document):
    """Where a model's file comes from on the Hugging Face Hub, as the Hub answered (umemc.hub)."""

    repo: str
    path: str  # the first part
    revision: str  # as the stack asks: a branch, a tag or a commit
    commit: str  # what that revision was when the header was read
    parts: list[HubPart]
    header_bytes: Bytes  # what was read of it to size it (HTTP range requests)


class LockEntry(Document):
    file: FileIdentity | None = None
    hub: HubOrigin | None = None
    header: LockedHeader | None = None
    flags: dict[str, Any] = {}
    measured: Measured | None = None
    dry_run: DryRun | None = None
    # a model split across nodes: llama.cpp's dry run on its main node with the RPC servers of its helpers up
    # (their compute buffers per device; flags also name the endpoints it reached)
    split_dry_run: DryRun | None = None


class CalibrationDoc(Document, kw_only=True):
    format: Literal["umemc-calibration"] = "umemc-calibration"
    version: int = VERSION
    models: dict[str, LockEntry]
    remedy: ClassVar[str] = "measure again with this one (`umemc calibrate STACK`)"
