"""What was recorded of a llama.cpp model in the stack's lock (STACK.calibration.json), as sources of figures beside
the hand model (umemc.estimate.llm): a calibration's measurement of the real load (`umemc calibrate`) and llama.cpp's
own dry run (`umemc check --measure`). Each is a figure set with its source; `pick` chooses the one the estimate
stands on, in one place: a measurement where it still holds for this model, else the dry run, else the hand model's.
A recorded figure is input: it holds only while it applies to this file, these settings and that llama.cpp, and it
is refused where it is below what the GGUF header proves (`_proven`), so a stale or forged record never makes a
model fit that does not."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, TypeVar

from ..lockfile import path_for
from ..stack.resolved import LoadedStack, ResolvedModel
from . import keys
from .figures import Figure
from .gguf_file import GgufFacts
from .overhead import overhead_figure

if TYPE_CHECKING:
    from ..lockfile import DryRun, LockEntry


class Chosen(NamedTuple):
    """The figures an estimate stands on, and their source ("gguf", "arch", "lock": the hand model's; "measured";
    "llama.cpp")."""

    source: str
    weights: Figure
    kv: Figure
    compute: Figure
    overhead: Figure


def pick(
    loaded: LoadedStack,
    m: ResolvedModel,
    facts: GgufFacts | None,
    entry: LockEntry | None,
    vision: tuple[Figure, Figure] | None,
    hand: Chosen,
    warnings: list[str],
) -> Chosen:
    """The one choice among the sources: the calibration's measurement where it still holds and proves itself
    against the header, else llama.cpp's dry run likewise (its overhead is the hand model's: a dry run starts no
    process), else the hand model's figures."""
    proof = (hand.kv, hand.compute)
    measured = _proven(loaded, m, facts, _measured(loaded, m, entry, warnings), "measured", warnings, proof)
    if measured is not None:
        return Chosen("measured", *measured)
    got = None if facts is None else _asked(loaded, m, entry, facts, vision, warnings)
    asked, verified = got if got is not None else (None, False)
    # a dry run of this very llama.cpp on this file with these flags is llama.cpp's truth: held only to bounds a
    # record cannot slip under and be real (the header's tensors, llama.cpp's own KV rule, one row of logits), never
    # to umemc's model of the compute buffer
    asked = _proven(loaded, m, facts, asked, "llama.cpp dry run", warnings, proof, trusted=verified)
    if asked is not None:
        return Chosen("llama.cpp", *asked, hand.overhead)
    return hand


Recorded = TypeVar("Recorded", tuple[Figure, Figure, Figure, Figure], tuple[Figure, Figure, Figure])


def checked_entry(loaded: LoadedStack, m: ResolvedModel, warnings: list[str]) -> LockEntry | None:
    """The model's calibration entry, unless the file present is not the one it recorded."""
    from ..lockfile import identity

    entry = loaded.calibration.get(m.name)
    if entry is None or not m.model_present or m.model_path is None:
        return entry
    now = identity(m.model_path)
    if now != entry.file:
        what = "size" if entry.file is None or now.size != entry.file.size else "content"
        warnings.append(
            loaded.source.warning(
                ("models", m.name, "model"),
                f"the calibration file recorded another file ({what} changed): its lock and measurements are ignored",
            )
        )
        return None
    return entry


def _measured(
    loaded: LoadedStack, m: ResolvedModel, entry: LockEntry | None, warnings: list[str]
) -> tuple[Figure, Figure, Figure, Figure] | None:
    """llama.cpp's own buffer report and the resident memory after a warm-up, if still valid."""
    from ..lockfile import host_bytes, totals

    if entry is None or entry.measured is None or entry.measured.rss_bytes is None:
        return None
    changes = keys.changes(entry.flags, keys.llama(loaded, m))
    if changes:
        warnings.append(
            loaded.source.warning(("models", m.name), "calibration ignored: " + ", ".join(changes), what="table")
        )
        return None
    meas = entry.measured
    t = totals(meas.buffers)
    when: dict[str, object] = {
        "measured": meas.at,
        "by": meas.runtime_version,
        "recorded in": path_for(loaded.path).name,
    }
    rest = max(0, (meas.rss_bytes or 0) - host_bytes(meas.buffers))
    cache = m.spec.prompt_cache if m.spec.runtime == "llama-server" else 0
    # the prompt cache (filled later than a warm-up) and the GPU context stay as the stack and the estimate say
    gpu_ctx = overhead_figure(m.spec.runtime, loaded.platform.kind, prompt_cache=cache).parts[1:]
    return (
        Figure("weights", t["model"], "llama.cpp: model buffer size (calibration)", when),
        Figure("kv", t["kv"], "llama.cpp: KV buffer size (calibration)", when),
        Figure("compute", t["compute"] + t["output"], "llama.cpp: compute + output buffer size (calibration)", when),
        Figure.total(
            "overhead",
            [
                Figure(
                    "process",
                    rest,
                    "resident after a warm-up request minus host buffers (calibration)",
                    {"rss": meas.rss_bytes},
                ),
                *gpu_ctx,
            ],
        ),
    )


def _asked(
    loaded: LoadedStack,
    m: ResolvedModel,
    entry: LockEntry | None,
    facts: GgufFacts,
    vision: tuple[Figure, Figure] | None,
    warnings: list[str],
) -> tuple[tuple[Figure, Figure, Figure], bool] | None:
    """llama.cpp's own dry run (umemc.estimate.dryrun) recorded in the lock, while it still answers for this model: the
    same flags, the same file (checked_entry) and, where that llama.cpp is on this machine, the same build; and
    whether that build is here and unchanged (its answer verified)."""
    from .dryrun import still_answers

    if entry is None or entry.dry_run is None:
        return None
    run, at = entry.dry_run, ("models", m.name)
    changes = keys.changes(run.flags, keys.dry_run(loaded, m), tuple(run.flags))
    if changes:
        warnings.append(
            loaded.source.warning(
                at,
                "llama.cpp's dry run no longer applies (" + ", ".join(changes) + "): estimating; "
                "`umemc check --measure` asks it again",
                what="table",
            )
        )
        return None
    current = still_answers(run, m.spec.runtime, m.spec.bin)
    if current is False:
        warnings.append(
            loaded.source.warning(
                at,
                f"the llama.cpp that sized this model changed or is not the one it would run now "
                f"({run.identity.path}): estimating; `umemc check --measure` asks it again",
                what="table",
            )
        )
        return None
    verified = current is True
    return dry_run_figures(m, facts, run, vision, verified=verified, recorded_in=path_for(loaded.path).name), verified


def dry_run_figures(
    m: ResolvedModel,
    facts: GgufFacts,
    run: DryRun,
    vision: tuple[Figure, Figure] | None,
    *,
    verified: bool,
    recorded_in: str,
) -> tuple[Figure, Figure, Figure]:
    """Weights, KV (+ recurrent state) and compute (+ output) from llama.cpp's dry run. A no_alloc load sizes
    no weight buffer in its log: the weights are the header's exact tensor bytes, checked against the dry run's
    breakdown table (whole MiB) where it has one; a CPU_REPACK buffer there (or in the log) is the repacked copy,
    held besides the mapped file pages when the model is mmap'd (the `_repack` rule)."""
    by: dict[str, object] = {
        "llama.cpp": f"{run.tool} {run.build}",
        "asked": run.at,
        "seconds": run.seconds,
        "recorded in": recorded_in,
    }
    if not verified:
        by["note"] = "that llama.cpp is not on this machine: its recorded answer is used"
    weights, kv, compute = _asked_weights(m, facts, run, by), _asked_kv(run, by), _asked_compute(run, by)
    if vision:
        weights = Figure.total("weights", [weights, vision[0]])
        compute = Figure.total("compute", [compute, vision[1]])
    return weights, kv, compute


def _asked_weights(m: ResolvedModel, facts: GgufFacts, run: DryRun, by: dict[str, object]) -> Figure:
    mib = 1024 * 1024
    table_repack = run.table.get("CPU_REPACK", {}).get("model")
    repack = 0
    if "CPU_REPACK" in run.buffers or table_repack:
        repack = facts.repack_bytes
        if table_repack is not None and repack // mib != table_repack // mib:
            repack = table_repack + mib  # llama.cpp repacks another set than umemc's rule: its figure, rounded up
    file_part = facts.tensor_bytes - repack if not m.mmap else facts.tensor_bytes
    table_rest = sum(v.get("model", 0) for k, v in run.table.items() if k != "CPU_REPACK")
    inputs = dict(by, **{"header tensor bytes": facts.tensor_bytes})
    if run.table:
        inputs["breakdown table (MiB)"] = ", ".join(f"{k} {v.get('model', 0) // mib}" for k, v in run.table.items())
    if run.table and table_rest > (facts.tensor_bytes - repack) + mib:
        if m.mmap:  # a tensor loaded twice (a tied output) maps the file's same pages: the header's bytes hold
            inputs["note"] = (
                f"llama.cpp's breakdown ({table_rest // mib} MiB) counts a tensor it loads twice (a tied output), "
                "which a mapped file holds once"
            )
        else:  # loaded into memory, the second copy is memory: llama.cpp's figure, rounded up
            file_part = table_rest + mib
            inputs["note"] = "llama.cpp holds more than the header's tensors (a tensor loaded twice): its breakdown"
    parts = [Figure("model buffers", file_part, "the GGUF header's loaded tensor bytes (exact), as llama.cpp maps "
                    "or loads them", inputs)]  # fmt: skip
    if repack:
        parts.append(
            Figure(
                "repacked copy",
                repack,
                "llama.cpp's CPU_REPACK buffer" + (" (besides the mapped file pages)" if m.mmap else ""),
                {"llama.cpp": by["llama.cpp"]},
            )
        )
    return Figure.total("weights", parts)


def _asked_kv(run: DryRun, by: dict[str, object]) -> Figure:
    kv = sum(v.get("kv", 0) for v in run.buffers.values())
    rs = sum(v.get("rs", 0) for v in run.buffers.values())
    parts = [Figure("kv cache", kv, "llama.cpp: llama_kv_cache size (dry run)", dict(by))]
    if rs:
        tool = {"llama.cpp": by["llama.cpp"]}
        parts.append(Figure("recurrent state", rs, "llama.cpp: RS buffer size (dry run)", tool))
    return Figure.total("kv", parts)


def _asked_compute(run: DryRun, by: dict[str, object]) -> Figure:
    compute = sum(v.get("compute", 0) for v in run.buffers.values())
    output = sum(v.get("output", 0) for v in run.buffers.values())
    return Figure.total(
        "compute",
        [
            Figure("compute buffer", compute, "llama.cpp: compute buffer size (dry run)", dict(by)),
            Figure("output buffer", output, "llama.cpp: output buffer size (dry run)", {"llama.cpp": by["llama.cpp"]}),
        ],
    )


def _logits_row(facts: GgufFacts) -> Figure:
    """One row of f32 logits: what llama.cpp's output buffer holds at the least (one output), a floor no real
    answer is under."""
    vocab = facts.shape.n_vocab if facts.shape is not None else 0
    return Figure("one row of logits", vocab * 4, "vocabulary x 4 bytes", {"vocabulary": vocab})


def _proven(
    loaded: LoadedStack,
    m: ResolvedModel,
    facts: GgufFacts | None,
    recorded: Recorded | None,
    what: str,
    warnings: list[str],
    hand: tuple[Figure, Figure],
    *,
    trusted: bool = False,
) -> Recorded | None:
    """Figures from the calibration file (a measurement, a dry run) are input: weights below what the GGUF's own
    header proves (its tensor bytes: llama.cpp's model buffers hold every one of them), or a KV cache below 90% or
    a compute buffer below half of what the header's shape needs by umemc's own model of llama.cpp (`hand`: KV,
    compute), are refused, with a warning, and the estimate stands; `umemc calibrate` or `check --measure` records them
    again. `trusted`: the dry run of the llama.cpp on this machine, unchanged, on this file with these flags: its
    compute figure is held only to one row of logits (llama.cpp's output buffer holds at least that) and its KV cache
    to nothing, never to the hand model, which is the guess."""
    if recorded is None or facts is None:
        return recorded
    weights, proven = recorded[0].bytes, facts.tensor_bytes
    if weights < proven * 0.99:
        wrong = f"the {what} weights of {weights} bytes are below the {proven} bytes of tensors the GGUF header holds"
    else:
        # the KV cache's formula is llama.cpp's own (exact on every architecture measured): a tenth of slack; the
        # compute buffer's model is an estimate (up to 12% off where llama.cpp's graph differs): half
        compute = (
            ("compute buffer", recorded[2], _logits_row(facts), "one row of logits:", 1.0)
            if trusted
            else ("compute buffer", recorded[2], hand[1], "half", 0.5)
        )
        # a trusted dry run's KV cache is llama.cpp's own answer too: an architecture umemc does not model (an
        # encoder it took for a decoder) must not have it thrown away for the hand model's cache
        checks: list[tuple[str, Figure, Figure, str, float]] = [compute]
        if not trusted:
            checks.insert(0, ("KV cache", recorded[1], hand[0], "90% of", 0.9))
        low = [
            f"the {what} {name} of {got.bytes} bytes is below {share} the {need.bytes} bytes its header's shape needs"
            for name, got, need, share, least in checks
            if got.bytes < need.bytes * least
        ]
        if not low:
            return recorded
        wrong = "; ".join(low)
    warnings.append(
        loaded.source.warning(
            ("models", m.name),
            f"{path_for(loaded.path).name}: {wrong}: not used (a stale or forged record); `umemc check --measure` "
            "asks llama.cpp again",
            what="table",
        )
    )
    return None
