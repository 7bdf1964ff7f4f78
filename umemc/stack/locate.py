"""Where each model's files are: on disk (a path relative to the stack file or models_dir), in the stack's lock,
or on the Hugging Face Hub (its header read once, its download said where missing); a chat template given as a
file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog.archs import LLM_PRESETS
from ..catalog.gguf import is_gguf
from ..catalog.runtimes import ENGINE_RUNTIMES, LLAMA_RUNTIMES
from ..units import human
from .cross_checks import check_template_name
from .load import Document, Source
from .models import ModelSpec, Stack
from .types import toml_repr

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..hub.ref import HfRef
    from ..lockfile import LockEntry


def ask_hub(
    doc: Document, stack: Stack, locks: dict[str, LockEntry], hub: Callable[[HfRef], LockEntry] | None
) -> tuple[list[str], dict[str, str]]:
    """Lock entries for the Hub models that are not on disk and not (or no longer) in the lock, read from the
    Hub into `locks`; returns the models read, and why the Hub was not asked or could not answer, by model."""
    from ..hub.ref import HubFailure, RefError, matches, parse

    fetched: list[str] = []
    unasked: dict[str, str] = {}
    for name, spec in stack.models.items():
        if spec.hf is None or spec.runtime not in LLAMA_RUNTIMES:
            continue
        try:
            ref = parse(spec.hf, spec.hf_revision)
        except RefError:
            continue  # the model's resolution says what is wrong with it
        if stack_path(doc, spec.model or str(ref.local_path(stack.models_dir))).exists():
            continue
        entry = locks.get(name)
        if entry is not None and entry.header is not None and matches(entry.hub, ref):
            continue
        if hub is None:
            unasked[name] = "the Hub was not asked"
            continue
        try:
            locks[name] = hub(ref)
        except HubFailure as exc:
            unasked[name] = str(exc)
            continue
        fetched.append(name)
    return fetched, unasked


def stack_path(doc: Document, value: str) -> Path:
    return (doc.path.parent / value).resolve() if not Path(value).is_absolute() else Path(value)


def template_file(doc: Document, spec: ModelSpec, at: tuple[str, ...]) -> Path | None:
    """`chat_template`: a Jinja file (its path, which must be a file) or a built-in name of llama.cpp's; only
    llama.cpp runtimes have one."""
    from ..catalog.chat_templates import LLAMA_CPP_PYTHON, is_file

    value, src, key = spec.chat_template, doc.source, at + ("chat_template",)
    if value is None:
        return None
    if spec.runtime not in LLAMA_RUNTIMES:
        raise src.error(key, f'runtime = "{spec.runtime}" takes no chat template', "only llama.cpp runtimes apply one")
    if spec.runtime == "llama-cpp-python" and (is_file(value) or value not in LLAMA_CPP_PYTHON):
        raise src.error(
            key,
            "llama-cpp-python's server takes no template file, only a built-in name"
            if is_file(value)
            else f"llama-cpp-python's server has no built-in template {toml_repr(value)}",
            f'one of {", ".join(sorted(LLAMA_CPP_PYTHON))}, or runtime = "llama-server"',
        )
    if not is_file(value):
        check_template_name(doc, spec, key, value)
        return None
    path = stack_path(doc, value)
    kind = _not_regular(path) or ("a directory" if path.is_dir() else None)
    if not path.exists() or kind is not None:
        raise src.error(key, f"no template file at {path}" + (f" ({kind})" if kind else ""))
    return path


Named = tuple[str | None, tuple[str, ...]]  # a file's path as the stack gives it, and the key that names it


def hub_files(spec: ModelSpec, src: Source, at: tuple[str, ...], models_dir: str) -> tuple[Named, Named]:
    """The model's and the projector's files (the stack's `model`/`mmproj`, else where `umemc pull` puts
    `hf`/`mmproj_hf`), each with the key that names it; the Hub spellings checked."""
    from ..hub.ref import RefError, check_revision, parse

    try:
        check_revision(spec.hf_revision)
    except RefError as exc:
        raise src.error(at + ("hf_revision",), str(exc), exc.hint) from None
    for key in ("hf", "mmproj_hf"):
        value = getattr(spec, key)
        if value is None:
            continue
        if spec.runtime in ("command", "torch"):
            raise src.error(
                at + (key,),
                f'runtime = "{spec.runtime}" loads no single model file',
                "download it yourself and name its directory in the worker's own arguments",
            )
        if spec.runtime in ENGINE_RUNTIMES and key == "mmproj_hf":
            raise src.error(at + (key,), f'runtime = "{spec.runtime}" loads no projector file', "remove mmproj_hf")
        try:
            ref = _hub_ref(spec, value)
        except RefError as exc:
            raise src.error(at + (key,), str(exc), exc.hint) from None
        local = spec.model if key == "hf" else spec.mmproj
        if local is not None and ref.path and len(ref.parts) > 1 and Path(local).name != Path(ref.path).name:
            raise src.error(
                at + ("model" if key == "hf" else "mmproj",),
                f"a split GGUF keeps its parts' names: must end in {Path(ref.path).name}",
                "llama.cpp finds the other parts beside the first by their names",
            )
    if spec.hf_revision is not None and spec.hf is None and spec.mmproj_hf is None:
        raise src.error(at + ("hf_revision",), "is the revision of hf or mmproj_hf; neither is given")

    def named(local: str | None, hub: str | None, key: str) -> Named:
        if local is not None or hub is None:
            return local, at + (key,)
        if spec.runtime in ENGINE_RUNTIMES:  # a whole repository: MODELS_DIR/owner/name
            from ..hub.directory import local_dir

            return str(local_dir(_hub_ref(spec, hub), models_dir)), at + ("hf",)
        return str(parse(hub, spec.hf_revision).local_path(models_dir)), at + (
            f"{key}_hf" if key == "mmproj" else "hf",
        )

    return named(spec.model, spec.hf, "model"), named(spec.mmproj, spec.mmproj_hf, "mmproj")


def _hub_ref(spec: ModelSpec, value: str) -> HfRef:
    """`hf` as the runtime loads it: a file (owner/name/path) for llama.cpp and whisper.cpp, a whole repository
    (owner/name) for vLLM and MLX."""
    from ..hub.directory import parse_repo
    from ..hub.ref import parse

    return parse_repo(value, spec.hf_revision) if spec.runtime in ENGINE_RUNTIMES else parse(value, spec.hf_revision)


def hub_note(lock: LockEntry | None, problem: str | None) -> tuple[str | None, str | None]:
    """How a Hub file not yet downloaded is sized (from its header on the Hub), or why the Hub did not."""
    if problem is None and lock is not None and lock.hub is not None and lock.header is not None:
        h = lock.hub
        size = sum(p.size for p in h.parts)
        return (
            f"its GGUF header on the Hub ({h.repo} at {h.commit[:12]}, {human(h.header_bytes)} of {human(size)} read)",
            None,
        )
    return None, problem or "no answer"


def model_file(
    doc: Document,
    value: str | None,
    at: tuple[str, ...],
    spec: ModelSpec,
    *,
    llama: bool,
    is_mmproj: bool = False,
    locked: bool = False,
    hub: tuple[str | None, str | None] | None = None,
) -> tuple[Path | None, bool]:
    if value is None:
        return None, False
    src = doc.source
    path = stack_path(doc, value)
    if path.is_dir() or not path.exists():
        if path.is_dir() and not llama:
            return path, True  # torch/comfyui model directories
        if hub is not None:
            sized, problem = hub
            return _not_downloaded(doc, path, at, spec, locked=locked, sized=sized, problem=problem), False
        fallback = (
            f"the header {doc.path.stem}.calibration.json recorded (not confirmed against the file)"
            if locked
            else _fallback(spec, is_mmproj=is_mmproj)
        )
        if fallback is None and is_mmproj:  # one rule with model files: a missing file is said, not fatal
            doc.warnings.append(
                src.warning(
                    at,
                    f"file not found: {path}; the projector is not counted (no arch preset has one for it): "
                    'give memory = "…" or the file',
                )
            )
            return path, False
        if fallback is None:
            raise src.error(
                at,
                f"file not found: {path}",
                'give arch = "<preset>" as a fallback, or memory = "…"' if not is_mmproj else None,
            )
        doc.warnings.append(src.warning(at, f"file not found, estimating from {fallback}"))
        return path, False
    kind = _not_regular(path)
    if kind:  # opening a FIFO would wait for a writer forever; a device or socket is no model either
        raise src.error(at, f"not a regular file: {path} is {kind}", "name the model's file itself")
    if llama:
        try:
            ok = is_gguf(path)
        except OSError as exc:
            raise src.error(at, f"cannot read {path}: {exc.strerror}") from None
        if not ok:
            raise src.error(at, f"not a GGUF file: {path}", "llama.cpp runtimes load .gguf files")
    return path, True


def _not_downloaded(
    doc: Document,
    path: Path,
    at: tuple[str, ...],
    spec: ModelSpec,
    *,
    locked: bool,
    sized: str | None,
    problem: str | None,
) -> Path:
    """A Hub model not on disk yet: sized from its header on the Hub, else from another fallback (said), else
    an error that says how to get it."""
    src, pull = doc.source, f"`umemc pull {doc.source.file}` downloads it"
    if sized is not None:
        doc.warnings.append(src.warning(at, f"not downloaded yet ({path}): sized from {sized}; {pull}"))
        return path
    fallback = f"the lock in {doc.path.stem}.calibration.json" if locked else _fallback(spec, is_mmproj=False)
    if fallback is None:
        raise src.error(
            at,
            f"not downloaded yet ({path}), and the Hub could not size it: {problem}",
            f'{pull}; or give arch = "<preset>" as a fallback, or memory = "…"',
        )
    doc.warnings.append(
        src.warning(
            at, f"not downloaded yet ({path}); the Hub could not size it: {problem}; estimating from {fallback}"
        )
    )
    return path


def _not_regular(path: Path) -> str | None:
    """What a path that exists is, when it is not a regular file (nor a directory): never opened."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), None)


def _fallback(spec: ModelSpec, *, is_mmproj: bool) -> str | None:
    if is_mmproj:
        preset = LLM_PRESETS.get(spec.arch or "")
        return f'the projector of arch = "{spec.arch}"' if preset and preset.vision else None
    if spec.memory is not None:
        return "memory = (explicit)"
    if spec.arch is not None:
        return f'arch = "{spec.arch}"'
    return None
