"""`hf = "owner/repo/path/in/repo.gguf"` (with `hf_revision`): which file of which repository, at which
revision. A split GGUF (llama.cpp's `NAME-00001-of-00003.gguf`, gguf-split's naming) is named by its first
part; the others are implied."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import NamedTuple, Protocol

# the Hub's repository names: letters, digits, '-', '_', '.', not starting with '-' or '.', at most 96 each
_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"
_SEGMENT = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_.+=,-]*")
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+/-]{0,199}")
MAX_SPLIT = 65535  # llama.cpp's split.count is a uint16 (gguf-split, llama-model-loader)
SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
DEFAULT_REVISION = "main"


class HubFailure(Exception):
    """The Hub could not say (one sentence: unreachable, no such repository or file, refused)."""


class RefError(ValueError):
    """What is wrong with a spelling, and a hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class HfRef(NamedTuple):
    repo: str  # owner/name
    path: str  # in the repository, '/'-separated
    revision: str = DEFAULT_REVISION

    @property
    def spelling(self) -> str:
        at = "" if self.revision == DEFAULT_REVISION else f" at {self.revision}"
        return f"{self.repo}/{self.path}{at}"

    @property
    def parts(self) -> list[str]:
        """Every file of the model, the first first: one, or each part of a split GGUF."""
        m = SPLIT.match(self.path)
        if not m:
            return [self.path]
        count = int(m.group("count"))
        return [f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]

    def local_path(self, models_dir: PurePosixPath | str) -> PurePosixPath:
        """Where `umemc pull` puts it by default: MODELS_DIR/owner/name/path (one directory per repository,
        as LM Studio lays them out, so two repositories' files of the same name never meet)."""
        return PurePosixPath(models_dir) / self.repo / self.path


def parse(spelling: str, revision: str | None = None) -> HfRef:
    """`owner/name/path/file`, every segment plain (no '..', no empty segment, no URL)."""
    hint = 'e.g. hf = "unsloth/Qwen3-30B-A3B-GGUF/Qwen3-30B-A3B-Q4_K_M.gguf"'
    if "://" in spelling or spelling.startswith(("hf.co/", "huggingface.co/")):
        raise RefError("names a repository and a file, not a URL", hint)
    parts = spelling.split("/")
    if len(parts) < 3:
        raise RefError("must be owner/repository/path of a file in it", hint)
    owner, name, rest = parts[0], parts[1], parts[2:]
    check_names(owner, name)
    for segment in rest:
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise RefError(f"bad path segment {segment!r}", "a file's path in the repository, '/'-separated")
    path = "/".join(rest)
    m = SPLIT.match(path)
    if m and not 1 <= int(m.group("count")) <= MAX_SPLIT:
        count = int(m.group("count"))
        raise RefError(f"a split GGUF of {count} parts", f"llama.cpp reads 1 to {MAX_SPLIT} (split.count is 16-bit)")
    if m and m.group("no") != "00001":
        first = f"{m.group('stem')}-00001-of-{m.group('count')}.gguf"
        raise RefError(f"names part {int(m.group('no'))} of a split GGUF", f"name its first part: {first}")
    return HfRef(f"{owner}/{name}", path, check_revision(revision))


def check_names(owner: str, name: str) -> None:
    """A repository's owner and name as the Hub spells them (each becomes a directory: no '..', no '--')."""
    for what, value in (("owner", owner), ("repository", name)):
        if not re.fullmatch(_NAME, value) or ".." in value or "--" in value:
            raise RefError(f"bad {what} name {value!r}", "letters, digits, '-', '_' and '.'; not '..' or '--'")


def check_revision(revision: str | None) -> str:
    rev = DEFAULT_REVISION if revision is None else revision
    if not _REVISION.fullmatch(rev) or ".." in rev or rev.endswith("/"):
        raise RefError(f"bad revision {rev!r}", "a branch, a tag or a commit hash")
    return rev


class _Origin(Protocol):
    @property
    def repo(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def revision(self) -> str: ...


def matches(origin: _Origin | None, ref: HfRef) -> bool:
    """Whether a recorded origin (the lock's) is of this spelling: the same file at the same requested revision."""
    return origin is not None and (origin.repo, origin.path, origin.revision) == (ref.repo, ref.path, ref.revision)
