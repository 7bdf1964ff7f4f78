"""Rough edges a first-time user met: each expected message is written out whole."""

from __future__ import annotations

import json
from pathlib import Path

BASE = """version = 1
name = "t"
[platform]
kind = "cpu"
memory = "64GiB"
[models.m]
runtime = "llama-server"
"""


def test_explicit_memory_below_the_weights_warns(write_stack, run_cli, tmp_path: Path) -> None:
    # llama-3-8b Q4_K_M on a CPU with mmap: 4685.30 MiB of tensors + 3204.00 MiB repacked (docs/ESTIMATES.md)
    write_stack(BASE + 'arch = "llama-3-8b"\nmodel = "m.gguf"\nmemory = "2GiB"\n')
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    weights = json.loads(out)["models"]["m"]["weights_bytes"]
    assert (code, weights) == (0, 8_272_535_552)
    assert json.loads(out)["warnings"][1] == (
        "stack.toml:10:10: models.m.memory: memory = 2147483648 bytes (2.00 GiB) is below the weights alone "
        '(8272535552 bytes (7.70 GiB), from arch = "llama-3-8b"): the worker would be killed at its hard quota '
        "while loading; remove memory to use the estimate"
    )


def test_a_missing_projector_is_said_like_a_missing_model_file(write_stack, run_cli, tmp_path: Path) -> None:
    from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

    write_tiny_gguf(tmp_path / "chat.gguf", TinySpec())
    write_stack(BASE + 'model = "chat.gguf"\nmmproj = "proj.gguf"\n')
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 0
    assert json.loads(out)["warnings"][:1] == [
        f"stack.toml:9:10: models.m.mmproj: file not found: {tmp_path / 'proj.gguf'}; the projector is "
        'not counted (no arch preset has one for it): give memory = "…" or the file',
    ]
    code, _, err = run_cli("build", "stack.toml", "-o", "out", cwd=tmp_path)
    assert code == 2 and not (tmp_path / "out").exists()
    assert err.splitlines()[-1] == (
        "stack.toml:9:10: models.m.mmproj: proj.gguf does not exist yet: `umemc build` needs --files-later, "
        "`umemc up` needs the file"
    )
    assert run_cli("build", "stack.toml", "-o", "out", "--files-later", cwd=tmp_path)[0] == 0


def test_a_preset_projector_sizes_a_missing_mmproj(write_stack, run_cli, tmp_path: Path) -> None:
    write_stack(BASE + 'arch = "qwen2.5-vl-7b"\nmodel = "vl.gguf"\nmmproj = "proj.gguf"\n')
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 0
    report = json.loads(out)
    assert report["warnings"][1] == (
        'stack.toml:10:10: models.m.mmproj: file not found, estimating from the projector of arch = "qwen2.5-vl-7b"'
    )
    from umemc.budget.plan import make_plan
    from umemc.stack.resolve import load_stack

    weights = make_plan(load_stack(tmp_path / "stack.toml")).models["m"].estimate.weights
    assert [p.name for p in weights.parts][:2] == ["weights", "projector"]  # the preset's vision tower counts
