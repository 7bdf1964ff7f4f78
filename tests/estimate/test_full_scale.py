"""Full-size shapes where the runtime, not the model, decides the memory: sliding-window caches under
llama-cpp-python and the repacked copy of CPU weights. Expected figures are llama.cpp's own buffer
report for full-size sparse GGUFs (umemc.testing.sparsegguf) loaded by llama-cpp-python 0.3.36 on
x86-64 (AVX2), as recorded in bench/RESULTS.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umemc.budget.plan import make_plan
from umemc.catalog.archs import LLM_PRESETS
from umemc.stack.resolve import load_stack
from umemc.units import MiB

GEMMA = """version = 1
name = "g"
[platform]
kind = "cpu"
memory = "64GiB"
[models.m]
runtime = "{runtime}"
arch = "gemma-3-27b"
model = "gemma-3-27b-q4_k_m.gguf"
context = 8192
mmap = false
"""


@pytest.mark.parametrize(
    "runtime,kv_mib",
    [
        ("llama-server", 640 + 624),  # 'creating SWA KV cache, size = 1536 cells': 640 + 624 MiB
        ("llama-cpp-python", 640 + 3328),  # 'using full-size SWA cache': 640 + 3328 MiB
    ],
)
def test_sliding_window_cache_follows_the_runtime(write_stack, runtime: str, kv_mib: int) -> None:
    plan = make_plan(load_stack(write_stack(GEMMA.format(runtime=runtime))))
    assert plan.models["m"].estimate.kv.bytes == kv_mib * MiB


def test_llama_cpp_python_warns_about_its_full_sliding_window_cache(write_stack, run_cli, tmp_path: Path) -> None:
    write_stack(GEMMA.format(runtime="llama-cpp-python"))
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 0
    assert json.loads(out)["warnings"][1:2] == [
        "stack.toml:7:11: models.m.runtime: llama-cpp-python keeps full-size KV caches on the model's "
        "sliding-window layers (llama.cpp's swa_full default; its server has no setting for it): KV 4160749568 "
        "bytes (3.88 GiB) instead of 1325400064 bytes (1.23 GiB) with llama-server, which keeps only the window"
    ]
    code, out, _ = run_cli("explain", "stack.toml", "m", cwd=tmp_path)
    assert (
        "      sliding-window layers: 52 of 62 hold all 8192 cells (the runtime keeps full-size caches: swa_full)"
        in (out.splitlines())
    )
    assert out.splitlines()[-1] == (
        "  warning: stack.toml:7:11: models.m.runtime: llama-cpp-python keeps full-size KV caches on the model's "
        "sliding-window layers (llama.cpp's swa_full default; its server has no setting for it): KV 4160749568 "
        "bytes (3.88 GiB) instead of 1325400064 bytes (1.23 GiB) with llama-server, which keeps only the window"
    )


REPACK = """version = 1
name = "r"
[platform]
kind = "{kind}"
memory = "64GiB"
[models.m]
runtime = "{runtime}"
model = "{model}"
mmap = {mmap}
args = {args}
"""
MAPPED_MIB = 4685.30  # 'CPU_Mapped model buffer size = 4685.30 MiB' (the whole file)
REPACK_MIB = 3204.00  # 'CPU_REPACK model buffer size = 3204.00 MiB' (its 192 Q4_K matrices)


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from umemc.testing.sparsegguf import write_sparse_gguf

    path, _ = write_sparse_gguf(
        tmp_path_factory.mktemp("sparse") / "llama-3-8b.gguf", LLM_PRESETS["llama-3-8b"], "Q4_K_M"
    )
    return path


def _weights(write_stack, model: Path, kind: str = "cpu", runtime: str = "llama-cpp-python", **kw: str) -> int:
    text = REPACK.format(
        kind=kind, runtime=runtime, model=model, mmap=kw.get("mmap", "true"), args=kw.get("args", "[]")
    )
    if kind != "cpu":
        text = text.replace('memory = "64GiB"', 'memory = "64GiB"\ngpu_window = "48GiB"')
    return make_plan(load_stack(write_stack(text))).models["m"].estimate.weights.bytes


def test_repacked_copy_is_budgeted_beside_the_mapped_file(write_stack, llama8b: Path) -> None:
    got = _weights(write_stack, llama8b)
    assert round(got / MiB, 2) == round(MAPPED_MIB + REPACK_MIB, 2)  # llama.cpp prints 2 decimals


def test_no_second_copy_without_mmap_with_no_repack_or_on_a_gpu(write_stack, llama8b: Path) -> None:
    mapped = round(MAPPED_MIB, 2)
    assert round(_weights(write_stack, llama8b, mmap="false") / MiB, 2) == mapped  # the copy replaces the tensors
    assert round(_weights(write_stack, llama8b, runtime="llama-server", args='["--no-repack"]') / MiB, 2) == mapped
    assert round(_weights(write_stack, llama8b, runtime="llama-server", args='["-nr"]') / MiB, 2) == mapped
    assert round(_weights(write_stack, llama8b, kind="amd-apu") / MiB, 2) == mapped  # weights on the GPU


def test_explain_gives_the_load_peak_and_the_steady_figure(write_stack, run_cli, tmp_path: Path) -> None:
    write_stack(
        'version = 1\nname = "p"\n[platform]\nkind = "cpu"\nmemory = "64GiB"\n'
        '[models.m]\nruntime = "llama-server"\nmodel = "models/m.gguf"\narch = "llama-3-8b"\n'
    )
    code, out, _ = run_cli("explain", "stack.toml", "m", cwd=tmp_path)
    lines = out.splitlines()
    total = int(next(x for x in lines if x.startswith("  estimate = ")).split("(")[1].split()[0])
    steady = total - 3204 * MiB  # the repacked copy, as llama.cpp reports it for this file
    assert (
        code == 0
        and (
            "  load peak = the estimate; steady once the kernel reclaims the file pages of the repacked tensors = "
            f"{steady / 2**30:.2f} GiB ({steady} bytes): quotas are sized on the peak"
        )
        in lines
    )


def test_preset_path_repacks_the_same_tensors(write_stack) -> None:
    text = (
        'version = 1\nname = "p"\n[platform]\nkind = "cpu"\nmemory = "64GiB"\n'
        '[models.m]\nruntime = "llama-server"\narch = "llama-3-8b"\n'
    )
    weights = make_plan(load_stack(write_stack(text))).models["m"].estimate.weights
    assert {p.name: round(p.bytes / MiB, 2) for p in weights.parts} == {
        "weights": MAPPED_MIB,
        "repacked copy": REPACK_MIB,
    }
