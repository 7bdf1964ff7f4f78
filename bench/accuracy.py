"""umemc's estimate vs llama.cpp's own buffer report, per component.

Writes tiny random-weight GGUF models of several shapes (umemc.testing.tinygguf), loads each with
llama-cpp-python (`Llama(..., use_mmap=False, verbose=True)`) for several contexts, ubatch sizes,
flash attention on/off and KV types, parses llama.cpp's `model / KV / compute / output buffer size`
lines and compares them with `umemc check`'s figures for the same stack.

    python bench/accuracy.py            # builds bench/.venv-llama on first use (~5 min)
    python bench/accuracy.py --full     # only the full-size preset section (sparse GGUFs, ~10 min)
    python bench/accuracy.py --full gpt-oss-20b ...   # those presets' rows, printed only
    python bench/accuracy.py --archs    # only the small models of each 2026 architecture family (~2 min)
    python bench/accuracy.py --new      # architectures umemc was not tuned to, at full size: the estimate vs
                                        # llama.cpp's dry run (check --measure) vs llama-server's own load
    python bench/accuracy.py --record-graphs  # llama-server's compute buffer for the shapes of
                                        # tests/recorded/reserve-buffers.json (the allocator replay's check)
    python bench/accuracy.py --sweep    # one architecture's shape varied key by key: the estimate's compute
                                        # buffer vs llama.cpp's dry run (~3 min)
    UMEMC_LLAMA_PYTHON=/path/to/python python bench/accuracy.py

Goals: weights and KV within 1%, compute within 25%, weights+KV+compute within 5%.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, llama_python, write_section
from umemc.budget.plan import make_plan
from umemc.estimate.figures import Estimate
from umemc.stack.resolve import load_stack
from umemc.testing.archspecs import HELD_OUT, WITHOUT_RECIPE
from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

MiB = 1024 * 1024

MODELS = {
    "gqa-f16": TinySpec(n_layer=4, n_embd=512, n_ff=1536, n_head=8, n_head_kv=2, n_vocab=8000),
    "mha-f16": TinySpec(n_layer=3, n_embd=512, n_ff=2048, n_head=8, n_head_kv=8, n_vocab=4000),
    "gqa-q8": TinySpec(n_layer=4, n_embd=1024, n_ff=2816, n_head=16, n_head_kv=4, n_vocab=32000, ftype="Q8_0"),
    "qwen2-q8": TinySpec(
        arch="qwen2", n_layer=6, n_embd=768, n_ff=2048, n_head=12, n_head_kv=2, n_vocab=16000, ftype="Q8_0"
    ),
    "wide-ffn-tied": TinySpec(n_layer=2, n_embd=256, n_ff=8192, n_head=4, n_head_kv=1, n_vocab=1000, tied=True),
}
# (context, ubatch, flash_attn, kv_cache)
CONFIGS = [
    (512, 128, True, "f16"),
    (2048, 512, True, "f16"),
    (4096, 512, False, "f16"),
    (4096, 256, True, "q8_0"),
    (8192, 512, True, "q4_0"),
    (1024, 512, False, "f32"),
]
_KV_ID = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}

_LOADER = """
import sys, llama_cpp
m, ctx, ub, fa, kt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
llm = llama_cpp.Llama(model_path=m, n_ctx=ctx, n_ubatch=ub, n_batch=max(ub, 512), flash_attn=fa,
                      use_mmap=False, type_k=kt, type_v=kt, verbose=True)
del llm
"""
_PATTERNS = {
    "weights": r"CPU model buffer size =\s+([\d.]+) MiB",
    "kv": r"KV buffer size =\s+([\d.]+) MiB",
    "compute": r"CPU compute buffer size is\s+([\d.]+) MiB",  # 4 decimals, logged at teardown
    "output": r"output buffer size =\s+([\d.]+) MiB",
}


@dataclass
class Row:
    model: str
    ctx: int
    ub: int
    fa: bool
    kv: str
    est: dict[str, int]
    real: dict[str, float]

    def err(self, key: str) -> float:
        real = self.real[key]
        return (self.est[key] - real) / real * 100 if real else 0.0


def measure(py: str, path: Path, ctx: int, ub: int, fa: bool, kv: str) -> dict[str, float]:
    out = subprocess.run(
        [py, "-c", _LOADER, str(path), str(ctx), str(ub), "1" if fa else "0", str(_KV_ID[kv])],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    found = {k: re.search(p, out) for k, p in _PATTERNS.items()}
    missing = [k for k, m in found.items() if m is None]
    if missing:
        raise RuntimeError(f"llama.cpp log lacks {missing}:\n{out[-2000:]}")
    real = {k: float(m.group(1)) * MiB for k, m in found.items() if m}
    real["compute"] += real.pop("output")  # umemc's compute_bytes includes the output buffer
    return real


def estimate(tmp: Path, model: Path, ctx: int, ub: int, fa: bool, kv: str) -> dict[str, int]:
    stack = tmp / "stack.toml"
    stack.write_text(f'''version = 1
name = "accuracy"
[platform]
kind = "cpu"
memory = "24GiB"
[models.m]
runtime = "llama-cpp-python"
model = "{model}"
context = {ctx}
ubatch = {ub}
flash_attn = {"true" if fa else "false"}
kv_cache = "{kv}"
''')
    m = make_plan(load_stack(stack)).models["m"].estimate
    return {"weights": m.weights.bytes, "kv": m.kv.bytes, "compute": m.compute.bytes}


SERVED = {"gqa-f16": (2048, True), "gqa-q8": (1024, False), "qwen2-q8": (2048, True)}


def served(tmp: Path) -> str:
    """The running servers (`python -m llama_cpp.server` with umemc's compiled argv, under the same
    interpreter as umemc): estimate vs llama.cpp's report vs resident memory after filling the context."""
    from umemc.budget.plan import make_plan
    from umemc.compile.bundle import compile_bundle
    from umemc.runtime.measure import measure

    lines = [
        "Running `llama_cpp.server` processes started with umemc's compiled argv; resident memory",
        "sampled after a prompt that fills the context.",
        "",
        "| model | ctx | fa | estimate | llama.cpp report | error | resident after fill | hard quota | ok |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, (ctx, fa) in SERVED.items():
        model = tmp / f"{name}.gguf"
        stack = tmp / f"serve-{name}.toml"
        stack.write_text(
            f'version = 1\nname = "serve"\n[platform]\nkind = "cpu"\nmemory = "24GiB"\n'
            f'[models.m]\nruntime = "llama-cpp-python"\nmodel = "{model}"\ncontext = {ctx}\n'
            f"flash_attn = {'true' if fa else 'false'}\nport = 18931\n"
        )
        plan = make_plan(load_stack(stack))
        m = plan.models["m"]
        meas = measure(compile_bundle(plan).programs["m"], m.estimate.facts, 300, fill_tokens=ctx - 32)
        report = sum(sum(k.values()) for k in meas.buffers.values())
        rss = meas.rss_bytes or 0
        est = m.estimate.weights.bytes + m.estimate.kv.bytes + m.estimate.compute.bytes
        err = (est - report) / report * 100
        ok = rss <= m.quota_hard
        lines.append(
            f"| {name} | {ctx} | {'on' if fa else 'off'} | {est / MiB:.2f} MiB | {report / MiB:.2f} MiB | "
            f"{err:+.1f}% | {rss / MiB:.1f} MiB | {m.quota_hard / MiB:.0f} MiB | "
            f"{'yes' if ok else 'NO'} |"
        )
        print(lines[-1], flush=True)
    lines += ["", "Goal: estimate within 5% of llama.cpp's report; resident memory never above the hard quota."]
    return "\n".join(lines)


# One section alone: (flag, the function that makes it, its title in RESULTS.md; None: it writes no section)
SECTIONS = (
    ("--archs", "tiny_archs", "Estimate accuracy vs llama.cpp, 2026 architecture families (bench/accuracy.py)"),
    ("--record-graphs", "record_graphs", None),
    ("--sweep", "sweeps", "Compute buffer by shape: the estimate vs llama.cpp's dry run (bench/accuracy.py --sweep)"),
    ("--new", "new_archs", "Architectures umemc was not tuned to: estimate, dry run, load (bench/accuracy.py)"),
    ("--held-out", "held_out", "Held-out architectures, measured once: estimate, dry run, load (bench/accuracy.py)"),
    ("--held-out-2", "held_out_2", "The second held-out set, measured once (bench/accuracy.py)"),
    ("--read-from-file", "read_from_file", "Architectures without a recipe, read from the file (bench/accuracy.py)"),
    ("--full", "full_scale", "Estimate accuracy at full size, preset path (bench/accuracy.py)"),
)


def main() -> int:
    py = llama_python()
    for flag, function, title in SECTIONS:
        if flag not in sys.argv:
            continue
        with tempfile.TemporaryDirectory() as d:
            text = globals()[function](py, Path(d))
        if title is not None:
            print(text)
            if not [a for a in sys.argv[2:] if not a.startswith("-")]:  # a subset is printed, not recorded
                write_section(title, text)
        return 0
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, spec in MODELS.items():
            path = write_tiny_gguf(tmp / f"{name}.gguf", spec)
            for ctx, ub, fa, kv in CONFIGS:
                if kv not in ("f16", "f32") and not fa:
                    continue
                rows.append(
                    Row(name, ctx, ub, fa, kv, estimate(tmp, path, ctx, ub, fa, kv), measure(py, path, ctx, ub, fa, kv))
                )
                print(_line(rows[-1]), flush=True)
        table = _table(rows)
        print(table)
        write_section("Estimate accuracy vs llama.cpp (bench/accuracy.py)", table)
        text = tiny_archs(py, tmp)
        print(text)
        write_section("Estimate accuracy vs llama.cpp, 2026 architecture families (bench/accuracy.py)", text)
        text = full_scale(py, tmp)
        print(text)
        write_section("Estimate accuracy at full size, preset path (bench/accuracy.py)", text)
        text = new_archs(py, tmp)
        print(text)
        write_section("Architectures umemc was not tuned to: estimate, dry run, load (bench/accuracy.py)", text)
        try:
            import llama_cpp.server  # noqa: F401  (served models run under umemc's own interpreter)
        except ImportError:
            print("llama-cpp-python[server] is not installed for this interpreter: skipping running servers")
            return 0
        text = served(tmp)
        print(text)
        write_section("Running llama.cpp servers vs the estimate (bench/accuracy.py)", text)
    return 0


# Published Q4_K_M files of the presets' models (file size on the model page, GB = 10^9 bytes; the file
# also holds its tokenizer, a few MB): the independent check of umemc's port of llama.cpp's mix.
PUBLISHED = {
    "llama-3-8b": ("bartowski/Meta-Llama-3-8B-Instruct-GGUF Q4_K_M", 4.92),
    "llama-3-70b": ("bartowski/Meta-Llama-3-70B-Instruct-GGUF Q4_K_M", 42.52),
    "qwen2-72b": ("Qwen/Qwen2-72B-Instruct-GGUF q4_k_m", 47.41),
    "gpt-oss-20b": ("ggml-org/gpt-oss-20b-GGUF mxfp4, listed to 0.1 GB", 12.1),
}  # gemma-3-27b: no Q4_K_M size we could confirm; its file is still loaded below
# (preset, context, flash_attn, repack, kv_cache, parallel): repacking reads and copies every repackable matrix (3
# GiB for 8B, 26 GiB for 70B), so only models whose copy fits this 24 GiB machine are loaded with it; the others
# pin it off (use_extra_bufts = false) and are estimated with mmap = false, where no second copy exists. Rows with
# parallel > 1 run llama.cpp the way llama-server does (one KV stream per sequence, windows kept small).
NEW_2026 = (
    "gpt-oss-20b", "gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-32b", "glm-4.5-air", "llama-4-scout",
    "mixtral-8x7b", "deepseek-v2-lite", "granite-4.0-h-small", "mistral-small-3.2-24b", "gemma-3-12b",
)  # fmt: skip
FULL = [
    ("llama-3-8b", 8192, True, True, "f16", 1),
    ("llama-3-70b", 8192, True, False, "f16", 1),
    ("qwen2-72b", 8192, True, False, "f16", 1),
    ("qwen2-72b", 4096, False, False, "f16", 1),
    ("gemma-3-27b", 8192, True, False, "f16", 1),  # swa_full: llama-cpp-python's default
    *[
        (name, ctx, fa, False, kv, par)
        for name in NEW_2026
        for ctx, fa, kv, par in (
            (8192, True, "f16", 1), (32768, True, "q8_0", 1), (8192, True, "f16", 4), (8192, False, "f16", 1),
        )
    ],
    ("gpt-oss-20b", 8192, True, True, "f16", 1),  # the MXFP4 experts' repacked copy
    ("deepseek-v2-lite", 8192, True, True, "f16", 1),
    ("bge-m3", 8192, True, False, "f16", 1),
]  # fmt: skip
_FULL_LOADER = """
import sys, llama_cpp
m, ctx, fa, repack = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
kt, par, ub = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]) if len(sys.argv) > 7 else 512
emb = len(sys.argv) > 8 and sys.argv[8] == "1"  # an encoder, served in embedding mode
mdef, cdef = llama_cpp.llama_cpp.llama_model_default_params, llama_cpp.llama_cpp.llama_context_default_params
def mparams():
    p = mdef()
    p.use_extra_bufts = repack  # llama.cpp's switch for weight repacking (llama-server --no-repack)
    return p
def cparams():
    c = cdef()
    c.n_seq_max = par  # llama-server -np: one KV stream per sequence
    if par > 1:  # and, as llama-server does (server_output_limits), one row of logits per sequence
        c.n_outputs_max = par
    return c
import llama_cpp.llama
for mod in (llama_cpp.llama_cpp, llama_cpp.llama.llama_cpp):
    mod.llama_model_default_params, mod.llama_context_default_params = mparams, cparams
llm = llama_cpp.Llama(model_path=m, n_ctx=ctx * par, n_batch=max(ub, 512), n_ubatch=ub, flash_attn=fa, use_mmap=True,
                      type_k=kt, type_v=kt, swa_full=None if par == 1 else False, embedding=emb, verbose=True)
"""
_FULL_PATTERNS = {
    "weights": r"CPU(?:_Mapped)? model buffer size =\s+([\d.]+) MiB",
    "repack": r"CPU_REPACK model buffer size =\s+([\d.]+) MiB",
    "kv": r"KV buffer size =\s+([\d.]+) MiB",
    "state": r"RS buffer size =\s+([\d.]+) MiB",
    "compute": r"CPU compute buffer size =\s+([\d.]+) MiB",
    "output": r"output buffer size =\s+([\d.]+) MiB",
}


def _loaded(py: str, argv: list[str]) -> dict[str, float]:
    """llama.cpp's buffer report (bytes by _FULL_PATTERNS key, summed over devices) for one load by _FULL_LOADER."""
    out = subprocess.run([py, "-c", _FULL_LOADER, *argv], capture_output=True, text=True, check=True).stderr
    return {k: sum(float(x) for x in re.findall(p, out)) * MiB for k, p in _FULL_PATTERNS.items()}


def _estimated(stack: Path, source: str, *, ctx: int, fa: bool, kv: str, par: int, mmap: bool) -> Estimate:
    """umemc's estimate for the same load: one model (`source` names its file or arch), served by llama-server
    when it has more than one sequence, as _FULL_LOADER loads it."""
    runtime = "llama-server" if par > 1 else "llama-cpp-python"
    stack.write_text(
        f'version = 1\nname = "bench"\n[platform]\nkind = "cpu"\nmemory = "2048GiB"\n[models.m]\n'
        f'runtime = "{runtime}"\n{source}\ncontext = {ctx}\nflash_attn = {"true" if fa else "false"}\n'
        f'kv_cache = "{kv}"\nparallel = {par}\nmmap = {"true" if mmap else "false"}\n'
    )
    return make_plan(load_stack(stack)).models["m"].estimate


def full_scale(py: str, tmp: Path) -> str:
    """The preset path at full size: sparse GGUFs with the presets' shapes and umemc's port of llama.cpp's
    quantization mix, (1) against the published files' sizes, (2) loaded by llama.cpp (mmap: the holes are
    never read) against umemc's estimate for the preset with the same settings."""
    from umemc.catalog.archs import LLM_PRESETS
    from umemc.testing.sparsegguf import write_sparse_gguf

    only = {a for a in sys.argv[2:] if not a.startswith("-")}
    rows = [r for r in FULL if not only or r[0] in only]
    lines = [
        "Sparse full-size GGUFs written from umemc's presets (umemc.testing.sparsegguf), each in its default file",
        "type (Q4_K_M; gpt-oss MXFP4_MOE as published).",
        "",
        "| preset | tensor bytes (umemc mix) | published file | difference |",
        "|---|---:|---:|---:|",
    ]
    files: dict[str, Path] = {}
    for name, *_ in rows:
        if name not in files:
            p = LLM_PRESETS[name]
            files[name] = write_sparse_gguf(tmp / f"{name}.gguf", p, p.default_quant)[0]
    for name, (where, gb) in PUBLISHED.items():
        if name in files:
            size = files[name].stat().st_size
            lines.append(
                f"| {name} | {size / 1e9:.2f} GB | {gb:.2f} GB ({where}) | {(size / 1e9 - gb) / gb * 100:+.2f}% |"
            )
            print(lines[-1], flush=True)
    lines += [
        "",
        "Each file loaded by llama-cpp-python (CPU, mmap) vs `umemc check` on the preset alone (no file), same",
        "context, flash attention, KV type, sequences; MiB, umemc / llama.cpp (error). KV includes a hybrid model's",
        "recurrent state (llama.cpp's RS buffer).",
        "",
        "| preset | ctx | fa | kv | seqs | repack | weights (+ repacked copy) | KV | compute + output | peer KV |",
        "|---|---:|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for name, ctx, fa, repack, kv, par in rows:
        enc = "1" if not LLM_PRESETS[name].shape.causal else "0"
        argv = [str(files[name]), str(ctx), "1" if fa else "0", "1" if repack else "0", str(_KV_ID[kv]), str(par)]
        argv += ["512", enc]
        real = _loaded(py, argv)
        e = _estimated(tmp / "full.toml", f'arch = "{name}"', ctx=ctx, fa=fa, kv=kv, par=par, mmap=repack)
        pairs = [
            (e.weights.bytes, real["weights"] + real["repack"]),
            (e.kv.bytes, real["kv"] + real["state"]),
            (e.compute.bytes, real["compute"] + real["output"]),
        ]
        cells = [
            f"{a / MiB:.2f} / {b / MiB:.2f} ({(a - b) / b * 100:+.2f}%)" if b else f"{a / MiB:.2f} / 0"
            for a, b in pairs
        ]
        cells.append(_peer_kv(files[name], ctx, kv, par, pairs[1][1]))
        lines.append(
            f"| {name} | {ctx} | {'on' if fa else 'off'} | {kv} | {par} | {'on' if repack else 'off'} | "
            + " | ".join(cells)
            + " |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        "peer KV: clanker-gguf's `clanker run FILE -c CTX --ctk KV --ctv KV --np N` (PyPI, a GGUF reader that sizes",
        "llama-server) 'KV cache' line against llama.cpp's KV (its MB read as MiB); '-' where it is not installed",
        "(`pip install clanker-gguf`, or UMEMC_PEER_CLANKER=/path/to/clanker).",
        "",
        "llama.cpp prints buffer sizes with two decimals of MiB. Where the logits dominate the compute",
        "buffer, ggml-alloc places them 2 n_embd-wide activations up (3 with a quantized or full-size",
        "sliding-window KV cache): docs/ESTIMATES.md.",
    ]
    return "\n".join(lines)


NEW_CONFIGS = ((8192, True, "f16", 1), (32768, True, "q8_0", 1), (8192, True, "f16", 4), (8192, False, "f16", 1))


def llama_server() -> str:
    """The llama-server (with llama-fit-params beside it) the dry run and the loads use."""
    return os.environ.get("UMEMC_LLAMA_SERVER") or str(ROOT / ".venv" / "llama-server" / "bin" / "llama-server")


def held_out(py: str, tmp: Path) -> str:
    """The held-out architectures (umemc.testing.archspecs.HELD_OUT: never used to tune the estimate), as new_archs."""
    from umemc.testing.archspecs import HELD_OUT

    return new_archs(py, tmp, HELD_OUT)


def held_out_2(py: str, tmp: Path) -> str:
    """The second held-out set (umemc.testing.archspecs.HELD_OUT_2: picked before the round that wrote out the
    first set's misses, never looked at while the estimate was worked on), as new_archs."""
    from umemc.testing.archspecs import HELD_OUT_2

    return new_archs(py, tmp, HELD_OUT_2)


def read_from_file(py: str, tmp: Path) -> str:
    """Architectures without a recipe, replayed as their files describe them (graphs.recipes.inferred): the first
    held-out set's and those the formula had sized (umemc.testing.archspecs.WITHOUT_RECIPE), as new_archs."""
    from umemc.testing.archspecs import WITHOUT_RECIPE

    return new_archs(py, tmp, {**HELD_OUT, **WITHOUT_RECIPE})


def new_archs(py: str, tmp: Path, specs: dict[str, Any] | None = None) -> str:
    """Architectures umemc was not tuned to (umemc.testing.archspecs), at their published sizes: sparse GGUFs
    laid out by llama.cpp's own loader (umemc.testing.discover), then for each configuration umemc's own estimate
    (no lock), `umemc check --measure` (llama.cpp's no_alloc dry run through llama-fit-params) and llama-server's
    real load with the argv umemc compiles (mmap, --no-repack: the holes are never read), in the same pass."""
    from umemc.testing.archspecs import FULL
    from umemc.testing.discover import discover, write_discovered

    server = llama_server()
    only = {a for a in sys.argv[2:] if not a.startswith("-")}
    lines = [
        f"llama.cpp: {server} ({_server_version(server)}). Each cell: MiB as the estimate / the dry run / the "
        "load, and the estimate's and the dry run's errors against the load. Weights exclude the repacked copy "
        "(--no-repack), KV includes the recurrent state (RS buffer), compute includes the output buffer.",
        "",
        "| model (arch) | ctx | fa | kv | seqs | weights | KV + state | compute + output | peer KV |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    worst = {"est": {"weights": 0.0, "kv": 0.0, "compute": 0.0}, "dry": {"weights": 0.0, "kv": 0.0, "compute": 0.0}}
    compute_errors: list[float] = []  # the estimate's, each row
    costs: list[str] = []
    for name, spec in (FULL if specs is None else specs).items():
        if only and name not in only:
            continue
        path = write_discovered(tmp / f"{name}.gguf", spec, discover(spec, tmp, py), "Q4_K_M")
        cost = "?"
        for ctx, fa, kv, par in NEW_CONFIGS:
            stack = tmp / f"{name}.toml"
            stack.write_text(_new_stack(server, path, ctx, fa, kv, par))
            row = f"| {name} ({spec.arch}) | {ctx} | {'on' if fa else 'off'} | {kv} | {par} | "
            try:
                hand, dry, cost = _three_ways(stack)
                real = _served_load(stack, tmp)
            except RuntimeError as exc:  # llama.cpp itself refuses this configuration: the row says so
                lines.append(row + f"llama.cpp refuses it: {str(exc)[-160:]} | | | |")
                print(lines[-1], flush=True)
                continue
            cells = []
            for key, (a, b, c) in {
                "weights": (hand.weights.bytes, dry.weights.bytes, real["model"]),
                "kv": (hand.kv.bytes, dry.kv.bytes, real["kv"]),
                "compute": (hand.compute.bytes, dry.compute.bytes, real["compute"] + real["output"]),
            }.items():
                e, d = (a - c) / c * 100 if c else 0.0, (b - c) / c * 100 if c else 0.0
                worst["est"][key] = max(worst["est"][key], e, key=abs)
                if key == "compute":
                    compute_errors.append(e)
                worst["dry"][key] = max(worst["dry"][key], d, key=abs)
                cells.append(f"{a / MiB:.2f} / {b / MiB:.2f} / {c / MiB:.2f} ({e:+.2f}% / {d:+.2f}%)")
            cells.append(_peer_kv(path, ctx, kv, par, real["kv"]))
            lines.append(row + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
        costs.append(f"| {name} | {path.stat().st_size / 1e9:.1f} GB | {cost} |")
    lines += [
        "",
        "Largest errors against the load: the estimate "
        + ", ".join(f"{k} {v:+.2f}%" for k, v in worst["est"].items())
        + "; the dry run "
        + ", ".join(f"{k} {v:+.2f}%" for k, v in worst["dry"].items())
        + f". The estimate's compute within 5% on {sum(abs(e) <= 5 for e in compute_errors)} of "
        f"{len(compute_errors)} rows, more than 5% under on {sum(e < -5 for e in compute_errors)}. Goals: the dry "
        "run within 0.1% of the load on every row; the estimate weights and KV within 0.5%, compute within 5% on "
        "at least 90% of rows and never more than 5% under.",
        "",
        "What a dry run costs (llama-server's fit pass on the sparse file, the last configuration): wall time, the",
        "process's peak resident memory and the bytes it read (/proc/PID/io rchar, sampled while it runs) against",
        "the file's size: it reads the header, never a weight.",
        "",
        "| model | file | seconds / peak RSS / bytes read |",
        "|---|---:|---:|",
        *costs,
        "",
        "peer KV: clanker-gguf's KV line (as in the preset table), against the load's KV + state.",
    ]
    return "\n".join(lines)


# (architecture, keys changed from its published shape, context, flash attention): what the sweep varies
SWEEPS: tuple[tuple[str, dict[str, int], int, bool], ...] = (
    # Gated attention (the query-gate projection) without flash attention: query width and n_embd apart
    *(
        ("qwen3-next-80b-a3b", {"block_count": 8, **keys}, 8192, False)
        for keys in (
            {},
            {"attention.head_count": 8},
            {"attention.head_count": 32},
            {"embedding_length": 4096},
            {"embedding_length": 1024},
            {"attention.key_length": 128, "attention.value_length": 128},
        )
    ),
    # Routed experts: the compute buffer against the expert width (n_ff_exp x n_expert_used) is not monotonic
    *(
        # (minimax-m2 sizes its expert tensors by feed_forward_length: both keys change)
        (
            "minimax-m2",
            {"block_count": 2, "feed_forward_length": ff, "expert_feed_forward_length": ff, "expert_used_count": k},
            8192,
            True,
        )
        for ff, k in ((384, 8), (768, 8), (1536, 8), (3072, 8), (6144, 8), (1536, 4), (3072, 4), (768, 16))
    ),
)


RESERVE_FIXTURE = ROOT / "tests" / "recorded" / "reserve-buffers.json"
_LLAMA3 = {"embedding_length": 4096, "feed_forward_length": 14336, "attention.head_count": 32,
           "attention.head_count_kv": 8, "rope.freq_base": 5e5}  # fmt: skip
_Q8 = ("-ctk", "q8_0", "-ctv", "q8_0")
# LFM2-1.2B's widths, four layers: short convolution, attention, short convolution twice
_LFM2 = {"block_count": 4, "embedding_length": 2048, "feed_forward_length": 8192, "attention.head_count": 32,
         "attention.head_count_kv": [0, 8, 0, 0], "attention.key_length": 64, "attention.value_length": 64,
         "rope.freq_base": 1e6, "shortconv.l_cache": 3}  # fmt: skip
_LLAMA70 = {**_LLAMA3, "embedding_length": 8192, "feed_forward_length": 28672, "attention.head_count": 64}
_QWEN3 = {"attention.head_count_kv": 8, "attention.key_length": 128, "attention.value_length": 128,
          "rope.freq_base": 1e6}  # fmt: skip
# (name, architecture, GGUF keys, vocabulary, llama-server's memory flags): published shapes, three layers (the
# replay's first two and last; a full-depth file reserves the same buffer)
_LLAMA4 = {"embedding_length": 5120, "feed_forward_length": 16384, "attention.head_count": 40,
           "attention.head_count_kv": 8, "rope.dimension_count": 128, "rope.freq_base": 5e5, "expert_count": 16,
           "expert_used_count": 1, "expert_feed_forward_length": 8192, "interleave_moe_layer_step": 1}  # fmt: skip
_GLM45 = {"block_count": 3, "embedding_length": 4096, "feed_forward_length": 10944, "attention.head_count": 96,
          "attention.head_count_kv": 8, "attention.key_length": 128, "attention.value_length": 128,
          "rope.dimension_count": 64, "rope.freq_base": 1e6, "expert_count": 128, "expert_used_count": 8,
          "expert_feed_forward_length": 1408, "expert_shared_count": 1, "leading_dense_block_count": 1,
          "expert_weights_norm": True, "expert_weights_scale": 1.0}  # fmt: skip
_GPT_OSS = {"block_count": 4, "embedding_length": 2880, "feed_forward_length": 2880, "attention.head_count": 64,
            "attention.head_count_kv": 8, "attention.key_length": 64, "attention.value_length": 64,
            "rope.dimension_count": 64, "rope.freq_base": 150000.0, "attention.sliding_window": 128,
            "expert_count": 32, "expert_used_count": 4, "expert_feed_forward_length": 2880}  # fmt: skip
_GRANITE_H = {"block_count": 5, "embedding_length": 4096, "feed_forward_length": 768, "attention.head_count": 32,
              "attention.head_count_kv": [0, 0, 8, 0, 0], "attention.key_length": 128, "attention.value_length": 128,
              "ssm.conv_kernel": 4, "ssm.inner_size": 8192, "ssm.state_size": 128, "ssm.time_step_rank": 128,
              "ssm.group_count": 1, "expert_count": 72, "expert_used_count": 10, "expert_feed_forward_length": 768,
              "expert_shared_feed_forward_length": 8192, "rope.scaling.finetuned": False}  # fmt: skip
_DEEPSEEK_LITE = {"block_count": 27, "embedding_length": 2048, "feed_forward_length": 10944, "attention.head_count": 16,
                  "attention.head_count_kv": 1, "attention.key_length": 576, "attention.value_length": 512,
                  "attention.key_length_mla": 192, "attention.value_length_mla": 128, "attention.kv_lora_rank": 512,
                  "rope.dimension_count": 64, "expert_count": 64, "expert_used_count": 6,
                  "expert_feed_forward_length": 1408, "expert_shared_count": 2,
                  "leading_dense_block_count": 1}  # fmt: skip
_KIMI_K2 = {**_DEEPSEEK_LITE, "block_count": 4, "embedding_length": 7168, "feed_forward_length": 18432,
            "attention.head_count": 64, "attention.q_lora_rank": 1536, "expert_count": 384, "expert_used_count": 8,
            "expert_feed_forward_length": 2048, "expert_shared_count": 1, "expert_weights_norm": True,
            "expert_weights_scale": 2.827, "expert_gating_func": 2, "expert_group_count": 1,
            "expert_group_used_count": 1}  # fmt: skip
_F32 = ("-ctk", "f32", "-ctv", "f32")
_QWEN3_NEXT = {"block_count": 8, "embedding_length": 2048, "feed_forward_length": 5120, "attention.head_count": 16,
               "attention.head_count_kv": 2, "attention.key_length": 256, "attention.value_length": 256,
               "rope.dimension_count": 64, "rope.freq_base": 1e7, "expert_count": 512, "expert_used_count": 10,
               "expert_feed_forward_length": 512, "expert_shared_feed_forward_length": 512, "ssm.conv_kernel": 4,
               "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 32, "ssm.inner_size": 4096,
               "full_attention_interval": 4}  # fmt: skip
_QWEN35 = {**_QWEN3_NEXT, "expert_count": 256, "expert_used_count": 8, "rope.dimension_sections": [11, 11, 10, 0]}
_QWEN3VL_MOE = {**_QWEN3, "block_count": 5, "embedding_length": 2048, "feed_forward_length": 6144,
                "attention.head_count": 32, "attention.head_count_kv": 4, "rope.freq_base": 5e6,
                "rope.dimension_sections": [24, 20, 20, 0], "n_deepstack_layers": 3, "expert_count": 128,
                "expert_used_count": 8, "expert_feed_forward_length": 768}  # fmt: skip
_MINISTRAL3 = {"embedding_length": 5120, "feed_forward_length": 16384, "attention.head_count": 32,
               "attention.head_count_kv": 8, "attention.key_length": 128, "attention.value_length": 128,
               "rope.freq_base": 1e9, "attention.temperature_scale": 0.1,
               "rope.scaling.original_context_length": 16384}  # fmt: skip
_QWEN2VL = {"embedding_length": 3584, "feed_forward_length": 18944, "attention.head_count": 28,
            "attention.head_count_kv": 4, "rope.freq_base": 1e6,
            "rope.dimension_sections": [16, 24, 24, 0]}  # fmt: skip
_GEMMA3 = {"block_count": 7, "embedding_length": 3840, "feed_forward_length": 15360, "attention.head_count": 16,
           "attention.head_count_kv": 8, "attention.key_length": 256, "attention.value_length": 256,
           "rope.freq_base": 1e6, "attention.sliding_window": 1024}  # fmt: skip
_PHI4 = {"embedding_length": 5120, "feed_forward_length": 17920, "attention.head_count": 40,
         "attention.head_count_kv": 10, "rope.freq_base": 250000.0, "rope.dimension_count": 128}  # fmt: skip
_STARCODER2 = {"embedding_length": 6144, "feed_forward_length": 24576, "attention.head_count": 48,
               "attention.head_count_kv": 4, "attention.layer_norm_epsilon": 1e-5, "rope.freq_base": 1e5}  # fmt: skip
_QWEN3VL = {**_QWEN3, "block_count": 5, "embedding_length": 5120, "feed_forward_length": 25600,
            "attention.head_count": 64, "rope.freq_base": 5e6, "rope.dimension_sections": [24, 20, 20, 0],
            "n_deepstack_layers": 3}  # fmt: skip
_UNRECIPED = {**HELD_OUT, **WITHOUT_RECIPE}
# (name, depth): the architectures without a recipe recorded, at their published widths (Command R: its parallel
# block without windows; Gemma 2: its windows, soft-capping and norms on both sides)
_READ_FROM_THE_FILE = (("olmo-2-32b", 3), ("exaone-4.0-32b", 5), ("hunyuan-a13b", 3), ("dots-llm1-142b", 3),
                       ("command-a-111b", 5), ("glm-4-32b", 3), ("command-r-35b", 3), ("gemma-2-9b", 4))  # fmt: skip
RESERVE_SHAPES: tuple[tuple[str, str, dict[str, object], int, tuple[str, ...]], ...] = (
    ("llama-3-8b", "llama", _LLAMA3, 128256, ("-c", "8192", "-fa", "on", "-np", "1")),
    ("llama-3-8b", "llama", _LLAMA3, 128256, ("-c", "8192", "-fa", "off", "-np", "1")),
    ("llama-3-8b", "llama", _LLAMA3, 128256, ("-c", "16384", "-fa", "on", "-np", "4")),
    ("llama-3-8b", "llama", _LLAMA3, 128256, ("-c", "32768", "-fa", "on", "-np", "1", *_Q8)),
    ("llama-3-70b", "llama", _LLAMA70, 128256, ("-c", "16384", "-fa", "on", "-np", "2")),
    ("llama-3-70b", "llama", _LLAMA70, 128256, ("-c", "16384", "-fa", "on", "-np", "2", *_Q8)),
    ("llama-3-70b", "llama", _LLAMA70, 128256, ("-c", "32768", "-fa", "off", "-np", "1")),
    ("mixtral-8x7b", "llama", {**_LLAMA3, "expert_count": 8, "expert_used_count": 2}, 32000,
     ("-c", "8192", "-fa", "on", "-np", "1")),
    ("mixtral-8x7b", "llama", {**_LLAMA3, "expert_count": 8, "expert_used_count": 2}, 32000,
     ("-c", "4096", "-fa", "off", "-np", "1")),
    ("qwen3-32b", "qwen3", {**_QWEN3, "embedding_length": 5120, "feed_forward_length": 25600,
                            "attention.head_count": 64}, 151936, ("-c", "8192", "-fa", "on", "-np", "1")),
    ("qwen3-32b", "qwen3", {**_QWEN3, "embedding_length": 5120, "feed_forward_length": 25600,
                            "attention.head_count": 64}, 151936, ("-c", "8192", "-fa", "off", "-np", "2")),
    ("qwen3-30b-a3b", "qwen3moe", {**_QWEN3, "embedding_length": 2048, "feed_forward_length": 6144,
                                   "attention.head_count": 32, "attention.head_count_kv": 4, "expert_count": 128,
                                   "expert_used_count": 8, "expert_feed_forward_length": 768}, 151936,
     ("-c", "8192", "-fa", "on", "-np", "1")),
    ("qwen3-30b-a3b", "qwen3moe", {**_QWEN3, "embedding_length": 2048, "feed_forward_length": 6144,
                                   "attention.head_count": 32, "attention.head_count_kv": 4, "expert_count": 128,
                                   "expert_used_count": 8, "expert_feed_forward_length": 768}, 151936,
     ("-c", "8192", "-fa", "off", "-np", "4")),
    ("qwen2-72b", "qwen2", {"embedding_length": 8192, "feed_forward_length": 29568, "attention.head_count": 64,
                            "attention.head_count_kv": 8, "rope.freq_base": 1e6}, 152064,
     ("-c", "8192", "-fa", "on", "-np", "1")),
    ("seed-oss-36b", "seed_oss", {**_QWEN3, "embedding_length": 5120, "feed_forward_length": 27648,
                                  "attention.head_count": 80}, 155136, ("-c", "8192", "-fa", "off", "-np", "1")),
    *(
        ("lfm2-1.2b", "lfm2", _LFM2, 65536, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "16384", "-fa", "off", "-np", "4"),
            ("-c", "32768", "-fa", "on", "-np", "1", *_Q8),
        )
    ),
    ("minimax-m2", "minimax-m2", {"embedding_length": 3072, "feed_forward_length": 1536,
                                  "attention.head_count": 48, "attention.head_count_kv": 8,
                                  "attention.key_length": 128, "attention.value_length": 128,
                                  "rope.dimension_count": 64, "expert_count": 256, "expert_used_count": 8,
                                  "expert_feed_forward_length": 1536, "expert_gating_func": 2}, 200064,
     ("-c", "8192", "-fa", "on", "-np", "1")),
    # Qwen2.5-VL-7B's text model: Qwen2 with four positions a token (M-RoPE)
    *(
        ("qwen2.5-vl-7b", "qwen2vl", _QWEN2VL, 152064, flags)
        for flags in (("-c", "8192", "-fa", "on", "-np", "1"), ("-c", "16384", "-fa", "off", "-np", "2"))
    ),
    # Gemma 3 12B's widths, seven layers (five of each six slide): its norms, scales and window caches
    *(
        ("gemma-3-12b", "gemma3", _GEMMA3, 262208, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "8192", "-fa", "off", "-np", "1"),
            ("-c", "32768", "-fa", "on", "-np", "4", *_Q8),
        )
    ),
    # Phi-4: Q, K and V in one projection, the gate and up in one, Q scaled, the FFN's residual added into itself
    *(
        ("phi-4", "phi3", _PHI4, 100352, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "8192", "-fa", "off", "-np", "1"),
            ("-c", "16384", "-fa", "on", "-np", "4", *_Q8),
        )
    ),
    # StarCoder2-15B: layer norms, biases, an FFN without a gate
    *(
        ("starcoder2-15b", "starcoder2", _STARCODER2, 49152, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "16384", "-fa", "off", "-np", "2"),
            ("-c", "32768", "-fa", "on", "-np", "1", *_Q8),
        )
    ),
    # Qwen3-VL-32B's text model, five layers: three deepstack inputs added after the first three
    *(
        ("qwen3-vl-32b", "qwen3vl", _QWEN3VL, 151936, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "8192", "-fa", "off", "-np", "1"),
            ("-c", "16384", "-fa", "on", "-np", "4", *_Q8),
        )
    ),
    # Llama 4: four layers (three chunked, one without RoPE); Scout's experts every layer, Maverick's every other
    *(
        ("llama-4-scout", "llama4", {**_LLAMA4, "block_count": 4}, 202048, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "32768", "-fa", "on", "-np", "4"),
            ("-c", "16384", "-fa", "off", "-np", "1"),
            ("-c", "32768", "-fa", "on", "-np", "1", *_Q8),
        )
    ),
    ("llama-4-maverick", "llama4", {**_LLAMA4, "block_count": 4, "expert_count": 128, "interleave_moe_layer_step": 2},
     202048, ("-c", "8192", "-fa", "on", "-np", "2")),
    # GLM-4.5-Air: a dense first layer, then 128 experts (8 used, weights normalised) and a shared one; GLM-4.5: three
    # dense layers, 160 experts, weights scaled by 2.5, per-head Q/K norms (_RESERVE_TENSORS)
    ("glm-4.5-air", "glm4moe", _GLM45, 151552, ("-c", "8192", "-fa", "on", "-np", "1")),
    ("glm-4.5-air", "glm4moe", _GLM45, 151552, ("-c", "16384", "-fa", "off", "-np", "2")),
    ("glm-4.5", "glm4moe", {**_GLM45, "block_count": 5, "embedding_length": 5120, "feed_forward_length": 12288,
                            "expert_count": 160, "expert_feed_forward_length": 1536, "leading_dense_block_count": 3,
                            "expert_weights_scale": 2.5}, 151552, ("-c", "32768", "-fa", "on", "-np", "4", *_Q8)),
    # gpt-oss-20b: a 128-token window on every other layer, sinks, 32 experts (4 used); -120b: 128 experts
    *(
        ("gpt-oss-20b", "gpt-oss", _GPT_OSS, 201088, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "16384", "-fa", "off", "-np", "2"),
            ("-c", "32768", "-fa", "on", "-np", "4", *_Q8),
        )
    ),
    ("gpt-oss-120b", "gpt-oss", {**_GPT_OSS, "block_count": 5, "expert_count": 128}, 201088,
     ("-c", "32768", "-fa", "on", "-np", "1")),
    # Granite 4.0 H Small: Mamba-2 layers around an attention layer without RoPE, 72 experts (10 used) and a shared
    # one on every layer; then the same with RoPE (as a Bamba-style file has it)
    *(
        ("granite-4.0-h-small", "granitehybrid", _GRANITE_H, 100352, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "8192", "-fa", "on", "-np", "4"),
            ("-c", "16384", "-fa", "off", "-np", "1"),
        )
    ),
    ("granite-4.0-h-small", "granitehybrid", {**_GRANITE_H, "rope.scaling.finetuned": True}, 100352,
     ("-c", "32768", "-fa", "on", "-np", "2", *_Q8)),
    # DeepSeek-V2-Lite (at its 27 layers: llama.cpp knows a Lite model, without a Q LoRA, by its depth): latent
    # attention without a Q LoRA, a dense first layer, 64 experts (6 used, soft-max, not
    # normalised) and two shared; then Kimi K2's widths: a Q LoRA, 384 experts under a sigmoid with a selection bias,
    # normalised and scaled; an f32 cache, which flash attention reads cast to f16
    *(
        ("deepseek-v2-lite", "deepseek2", _DEEPSEEK_LITE, 102400, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "16384", "-fa", "off", "-np", "2"),
            ("-c", "32768", "-fa", "on", "-np", "4", *_Q8),
        )
    ),
    *(
        ("kimi-k2", "deepseek2", _KIMI_K2, 163840, flags)
        for flags in (("-c", "8192", "-fa", "on", "-np", "1"), ("-c", "8192", "-fa", "on", "-np", "1", *_F32))
    ),
    ("gpt-oss-20b", "gpt-oss", _GPT_OSS, 201088, ("-c", "8192", "-fa", "on", "-np", "2", *_F32)),
    # Qwen3-Next: eight layers (two with gated attention), as the converter lays them out (attn_qkv and attn_gate on
    # the DeltaNet layers, attn_q/k/v on the attention layers); then its attention layers' Q, K, V in one tensor too
    *(
        ("qwen3-next", "qwen3next", _QWEN3_NEXT, 151936, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "16384", "-fa", "off", "-np", "2"),
            ("-c", "32768", "-fa", "on", "-np", "4", *_Q8),
        )
    ),
    ("qwen3-next-fused", "qwen3next", _QWEN3_NEXT, 151936, ("-c", "8192", "-fa", "off", "-np", "1")),
    # Qwen3.5's MoE: eight layers as Qwen3-Next's, its decay and beta projected apart, M-RoPE
    *(
        ("qwen3.5-moe", "qwen35moe", _QWEN35, 248320, flags)
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "16384", "-fa", "off", "-np", "2"),
            ("-c", "32768", "-fa", "on", "-np", "4", *_Q8),
        )
    ),
    # Qwen3-VL's MoE (deepstack, M-RoPE) and Ministral 3 (the queries' temperature scale)
    ("qwen3-vl-moe", "qwen3vlmoe", _QWEN3VL_MOE, 151936, ("-c", "8192", "-fa", "on", "-np", "2")),
    ("qwen3-vl-moe", "qwen3vlmoe", _QWEN3VL_MOE, 151936, ("-c", "32768", "-fa", "on", "-np", "1", *_Q8)),
    ("ministral-3", "mistral3", _MINISTRAL3, 131072, ("-c", "8192", "-fa", "on", "-np", "1")),
    ("ministral-3", "mistral3", _MINISTRAL3, 131072, ("-c", "16384", "-fa", "off", "-np", "2")),
    # architectures without a recipe, read from their files (graphs.recipes.inferred): the first held-out set's,
    # at their published widths; every tensor of a block is kept (READ_FROM_THE_FILE), as the estimate reads them
    *(
        (f"{name}-{depth}", _UNRECIPED[name].arch, {**_UNRECIPED[name].keys, "block_count": depth},
         _UNRECIPED[name].n_vocab, flags)
        for name, depth in _READ_FROM_THE_FILE
        for flags in (
            ("-c", "8192", "-fa", "on", "-np", "1"),
            ("-c", "8192", "-fa", "off", "-np", "1"),
            ("-c", "32768", "-fa", "on", "-np", "2", *_Q8),
        )
    ),
)  # fmt: skip
# the rows whose files keep every tensor of their blocks (an architecture without a recipe is read from them), with
# the optional tensors of the published model's file
READ_FROM_THE_FILE = {f"{n}-{d}": _UNRECIPED[n].optional for n, d in _READ_FROM_THE_FILE}
# tensors a row's file has beyond what llama.cpp requires (optional ones it uses where they are)
_RESERVE_TENSORS = {
    "glm-4.5": ("blk.N.attn_q_norm.weight", "blk.N.attn_k_norm.weight"),
    "kimi-k2": ("blk.N.exp_probs_b.bias",),  # the header reader sees the selection bias by its tensors
    "qwen3-next": tuple(f"blk.{i}.attn_qkv.weight" for i in range(8) if i % 4 != 3),  # the DeltaNet layers'
    "qwen3-next-fused": ("blk.N.attn_qkv.weight",),
    "qwen3.5-moe": tuple(f"blk.{i}.attn_qkv.weight" for i in range(8) if i % 4 != 3),
    "phi-4": ("blk.N.attn_qkv.weight", "blk.N.ffn_up.weight"),  # fused: the header reader sees them by these
    "starcoder2-15b": ("blk.N.ffn_up.weight",),  # an up projection and no gate: the header reader sees no gate
}
_RESERVE_WITHOUT = {"deepseek-v2-lite": "blk.N.exp_probs_b.bias"}  # an optional tensor the model has not


def record_graphs(py: str, tmp: Path) -> None:
    """llama-server's own `CPU compute buffer size` for each shape of RESERVE_SHAPES (a sparse GGUF, its load
    stopped by pid at the first such line), written to RESERVE_FIXTURE for tests/estimate/test_allocator.py."""
    import json
    import time

    from umemc.testing.discover import ArchSpec, discover, write_discovered

    server = llama_server()
    rows = []
    for name, arch, keys, n_vocab, flags in RESERVE_SHAPES:
        all_keys = {"context_length": 32768, "block_count": 3, "attention.layer_norm_rms_epsilon": 1e-6, **keys}
        extra = _RESERVE_TENSORS.get(name, ())
        optional = ("output.weight", "blk.N.exp_probs_b.bias", "blk.N.ffn_gate_exps.weight", "blk.N.attn_q.bias",
                    "blk.N.attn_k.bias", "blk.N.attn_v.bias", "blk.N.ssm_conv1d.bias", "blk.N.attn_gate.weight",
                    *extra)  # fmt: skip
        optional = tuple(t for t in optional if t != _RESERVE_WITHOUT.get(name))
        if name in READ_FROM_THE_FILE:
            optional = READ_FROM_THE_FILE[name]
        spec = ArchSpec(name, arch, all_keys, n_vocab, "bench/accuracy.py RESERVE_SHAPES", optional=optional)
        tensors = discover(spec, tmp, py)
        path = write_discovered(tmp / f"{name}.gguf", spec, tensors, "Q4_K_M")
        kinds = {pattern.split(".", 2)[-1] for pattern in extra}  # blk.N.x or blk.3.x: x
        every = name in READ_FROM_THE_FILE
        kept = {
            t: list(ne)
            for t, ne in tensors.items()
            if t.split(".", 2)[-1] in kinds or (every and t != "token_embd.weight")
        }
        log = tmp / "reserve.log"
        with log.open("w") as out:
            argv = [
                server,
                "-m",
                str(path),
                "--no-repack",
                "-v",
                "-t",
                "2",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                *flags,
            ]
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
            try:
                while proc.poll() is None and "compute buffer size" not in log.read_text(errors="replace"):
                    time.sleep(0.05)
            finally:
                proc.kill()
                proc.wait()
        found = re.findall(r"CPU compute buffer size = +([\d.]+) MiB", log.read_text(errors="replace"))
        if not found:
            raise RuntimeError(f"llama-server printed no compute buffer for {name} {flags}: {log.read_text()[-800:]}")
        rows.append({"name": name, "arch": arch, "keys": all_keys, "n_vocab": n_vocab, "flags": list(flags),
                     "compute_mib": float(found[0]), **({"tensors": kept} if kept else {})})  # fmt: skip
        print(rows[-1]["name"], " ".join(flags), found[0], flush=True)
    RESERVE_FIXTURE.write_text(json.dumps({"llama-server": _server_version(server), "rows": rows}, indent=1) + "\n")


def sweeps(py: str, tmp: Path) -> str:
    """For each row of SWEEPS a sparse GGUF of the changed shape, umemc's own estimate and llama.cpp's dry run
    (check --measure) of it: the compute buffer (with the output buffer) each says, in MiB, and the estimate's
    error. The dry run equals llama-server's load on every row of the --new table, so no load is run here."""
    import dataclasses

    from umemc.testing.archspecs import FULL
    from umemc.testing.discover import discover, write_discovered

    server = llama_server()
    lines = [
        f"llama.cpp: {server} ({_server_version(server)}); ubatch 512, f16 cache, one sequence. MiB of compute "
        "buffer + output buffer: the estimate / the dry run (error).",
        "",
        "| model | changed keys | ctx | fa | the estimate's peak | compute + output |",
        "|---|---|---:|---|---|---:|",
    ]
    for name, keys, ctx, fa in SWEEPS:
        spec = dataclasses.replace(FULL[name], keys={**FULL[name].keys, **keys})
        path = write_discovered(tmp / f"{name}.gguf", spec, discover(spec, tmp, py), "Q4_K_M")
        stack = tmp / f"{name}.toml"
        stack.write_text(_new_stack(server, path, ctx, fa, "f16", 1))
        hand, dry, _ = _three_ways(stack)
        a, b = hand.compute.bytes, dry.compute.bytes
        formula = hand.compute.parts[0].formula
        peak = "allocator replay" if formula.startswith("ggml-alloc") else formula.rpartition("[= ")[2].rstrip("]")
        changed = ", ".join(f"{k} {v}" for k, v in keys.items())
        lines.append(
            f"| {name} | {changed} | {ctx} | {'on' if fa else 'off'} | {peak} | "
            f"{a / MiB:.2f} / {b / MiB:.2f} ({(a - b) / b * 100:+.2f}%) |"
        )
        print(lines[-1], flush=True)
    return "\n".join(lines)


def _new_stack(server: str, path: Path, ctx: int, fa: bool, kv: str, par: int) -> str:
    return (
        f'version = 1\nname = "bench"\n[platform]\nkind = "cpu"\nmemory = "2048GiB"\n[models.m]\n'
        f'runtime = "llama-server"\nbin = "{server}"\nmodel = "{path}"\ncontext = {ctx}\n'
        f'flash_attn = {"true" if fa else "false"}\nkv_cache = "{kv}"\nparallel = {par}\nmmap = true\n'
        f'args = ["--no-repack"]\nport = {_free_port()}\n'
    )


def _three_ways(stack: Path) -> tuple[Estimate, Estimate, str]:
    """umemc's own estimate (no lock) and `check --measure`'s (llama.cpp's dry run), and what that dry run cost."""
    from umemc.commands.asking import Measure
    from umemc.commands.common import plan_from_arg
    from umemc.lockfile import path_for

    path_for(stack).unlink(missing_ok=True)
    hand = make_plan(load_stack(stack, locks={})).models["m"].estimate
    import contextlib
    import io

    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        dry = plan_from_arg(str(stack), Measure.FRESH).models["m"]
    if dry.estimate.source != "llama.cpp":
        raise RuntimeError(" ".join(said.getvalue().split()))
    return hand, dry.estimate, _dry_run_cost(stack)


def _dry_run_cost(stack: Path) -> str:
    """What the recorded dry run cost (umemc.estimate.dryrun measures it: wait4's peak RSS, /proc/PID/io rchar)."""
    from umemc import lockfile

    run = lockfile.load(stack)["m"].dry_run
    assert run is not None
    rss = f"{run.peak_rss_bytes / MiB:.0f} MiB" if run.peak_rss_bytes else "?"
    read = f"{run.read_bytes / 1e6:.1f} MB" if run.read_bytes is not None else "?"
    return f"{run.seconds:.2f} s / {rss} / {read}"


def _served_load(stack: Path, tmp: Path) -> dict[str, int]:
    """llama-server's own buffer report for the argv umemc compiled (its log, at --log-verbosity 4), read once it
    listens; the process is stopped by its pid."""
    import time

    from umemc.compile.bundle import compile_bundle
    from umemc.lockfile import totals
    from umemc.runtime.llamalog import parse_buffers

    plan = make_plan(load_stack(stack, locks={}))
    argv = [a.replace("@UMEMC_STATE@", str(tmp)) for a in compile_bundle(plan).programs["m"].argv]
    argv.append("--no-warmup")  # a warm-up decode would page in every (zero) weight; it allocates nothing more
    (tmp / "slots" / "m").mkdir(parents=True, exist_ok=True)
    log = tmp / "load.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                if "llama_server: listening on" in log.read_text(errors="replace"):
                    break
                time.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait()
    text = log.read_text(errors="replace")
    if "llama_server: listening on" not in text:
        raise RuntimeError(f"llama-server did not load {stack}: {text[-2000:]}")
    return totals(parse_buffers(text))


def _server_version(server: str) -> str:
    out = subprocess.run([server, "--version"], capture_output=True, text=True, check=False)
    return next((x for x in (out.stdout + out.stderr).splitlines() if x.startswith("version")), "?")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TINY_CONFIGS = [
    (2048, 512, True, "f16", 1),
    (4096, 512, False, "f16", 1),
    (4096, 256, True, "q8_0", 1),
    (1024, 512, True, "f16", 4),
]


def tiny_archs(py: str, tmp: Path) -> str:
    """Small models of each 2026 architecture family (umemc.testing.tinyarchs) against llama.cpp's report."""
    from umemc.testing.sparsegguf import write_sparse_gguf
    from umemc.testing.tinyarchs import TINY

    lines = [
        "Small sparse models of each family (umemc.testing.tinyarchs: gpt-oss windows and sinks, Mixtral-style and",
        "Qwen3 MoE, GLM's next-token-prediction layer, Llama 4 chunked attention, DeepSeek MLA, Granite's Mamba-2",
        "hybrid), loaded by llama-cpp-python; MiB, umemc / llama.cpp (error). seqs > 1 runs as llama-server does.",
        "",
        "| model | ctx | ubatch | fa | kv | seqs | weights | KV (+ state) | compute + output |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    worst = {"weights": 0.0, "kv": 0.0, "compute": 0.0}
    for name, preset in TINY.items():
        ftype = preset.default_quant if preset.default_quant != "Q4_K_M" else "Q8_0"
        path = write_sparse_gguf(tmp / f"{name}.gguf", preset, ftype)[0]
        for ctx, ub, fa, kv, par in TINY_CONFIGS:
            argv = [str(path), str(ctx), "1" if fa else "0", "0", str(_KV_ID[kv]), str(par), str(ub)]
            real = _loaded(py, argv)
            source = f'model = "{path}"\nubatch = {ub}'
            e = _estimated(tmp / "tiny.toml", source, ctx=ctx, fa=fa, kv=kv, par=par, mmap=False)
            pairs = {
                "weights": (e.weights.bytes, real["weights"]),
                "kv": (e.kv.bytes, real["kv"] + real["state"]),
                "compute": (e.compute.bytes, real["compute"] + real["output"]),
            }
            errs = {k: (a - b) / b * 100 for k, (a, b) in pairs.items()}
            worst = {k: max(worst[k], abs(errs[k]), key=abs) for k in worst}
            cells = [f"{a / MiB:.2f} / {b / MiB:.2f} ({errs[k]:+.1f}%)" for k, (a, b) in pairs.items()]
            lines.append(
                f"| {name} | {ctx} | {ub} | {'on' if fa else 'off'} | {kv} | {par} | " + " | ".join(cells) + " |"
            )
            print(lines[-1], flush=True)
    lines += [
        "",
        "Largest errors: " + ", ".join(f"{k} {v:.2f}%" for k, v in worst.items()) + ". Small models exaggerate",
        "ggml-alloc's placement effects (each buffer is a few MiB); the full-size table is the one the goals are",
        "set on.",
    ]
    return "\n".join(lines)


def _peer_kv(path: Path, ctx: int, kv: str, par: int, real: float) -> str:
    """clanker-gguf's KV figure for the same file and settings (a peer estimator, run in the same pass)."""
    import shutil

    exe = os.environ.get("UMEMC_PEER_CLANKER") or shutil.which("clanker")
    if not exe:
        return "-"
    argv = [exe, "run", str(path), "-c", str(ctx), "--ctk", kv, "--ctv", kv, "--np", str(par), "--fa"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300).stdout
    m = re.search(r"KV cache:\s+([\d.]+) MB", out)
    if not m:
        return "?"
    peer = float(m.group(1)) * MiB
    return f"{peer / MiB:.0f} ({(peer - real) / real * 100:+.0f}%)" if real else f"{peer / MiB:.0f}"


def _line(r: Row) -> str:
    return f"{r.model:14} ctx {r.ctx:5} ub {r.ub:4} fa {int(r.fa)} kv {r.kv:5} | " + " | ".join(
        f"{k} {r.est[k] / MiB:8.2f}/{r.real[k] / MiB:8.2f} MiB {r.err(k):+6.2f}%" for k in ("weights", "kv", "compute")
    )


def _table(rows: list[Row]) -> str:
    lines = [
        "llama-cpp-python (llama.cpp on CPU), random-weight GGUF models written by umemc.testing.tinygguf.",
        "Each cell: umemc estimate / llama.cpp report in MiB (relative error). compute includes the",
        "output buffer.",
        "",
        "| model | ctx | ubatch | fa | kv | weights | KV | compute | weights+KV+compute |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = []
        for k in ("weights", "kv", "compute"):
            cells.append(f"{r.est[k] / MiB:.2f} / {r.real[k] / MiB:.2f} ({r.err(k):+.1f}%)")
        tot_e = sum(r.est.values())
        tot_r = sum(r.real.values())
        cells.append(f"{tot_e / MiB:.2f} / {tot_r / MiB:.2f} ({(tot_e - tot_r) / tot_r * 100:+.1f}%)")
        lines.append(
            f"| {r.model} | {r.ctx} | {r.ub} | {'on' if r.fa else 'off'} | {r.kv} | " + " | ".join(cells) + " |"
        )
    worst = {k: max(rows, key=lambda r: abs(r.err(k))) for k in ("weights", "kv", "compute")}
    tot = max(abs(sum(r.est.values()) - sum(r.real.values())) / sum(r.real.values()) * 100 for r in rows)
    lines += [
        "",
        "Worst relative errors: "
        + ", ".join(f"{k} {w.err(k):+.2f}% ({w.model}, ctx {w.ctx}, ub {w.ub})" for k, w in worst.items())
        + f", total {tot:.2f}%.",
        "Goals: weights and KV within 1%, compute within 25%, weights+KV+compute within 5%. "
        "llama.cpp prints model and KV sizes with two decimals of MiB.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
