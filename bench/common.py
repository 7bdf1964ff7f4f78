"""Shared by the benchmarks: medians, the llama-cpp-python interpreter, RESULTS.md sections."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "RESULTS.md"
LLAMA_VENV = BENCH / ".venv-llama"


def llama_python() -> str:
    """An interpreter with llama-cpp-python: $UMEMC_LLAMA_PYTHON, else bench/.venv-llama (created on
    first use; pip compiles llama.cpp from source, about 5 minutes on 2 cores)."""
    given = os.environ.get("UMEMC_LLAMA_PYTHON")
    if given:
        return given
    py = LLAMA_VENV / "bin" / "python"
    if not py.exists():
        print(f"creating {LLAMA_VENV} and building llama-cpp-python (about 5 minutes)...", file=sys.stderr)
        venv.create(LLAMA_VENV, with_pip=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "llama-cpp-python", "gguf", "psutil"], check=True)
    return str(py)


def timed(argv: list[str], ok: tuple[int, ...] = (0,)) -> float:
    """Seconds the command took. A bench of a command that fails times nothing: an exit outside `ok` (e.g. 2, an
    invalid stack, which a check reaches at its first error) stops the bench, saying what the command said."""
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    took = time.perf_counter() - start
    if done.returncode not in ok:
        said = done.stderr.decode(errors="replace").strip()[-2000:]
        sys.exit(f"bench: {' '.join(argv)} exited {done.returncode}, so it times nothing:\n{said}")
    return took


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section `## name` of bench/RESULTS.md."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nWritten by the scripts in bench/.\n"
    block = f"## {name}\n\n{body.rstrip()}\n"
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: block + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + block
    RESULTS.write_text(text.rstrip() + "\n")


def gateway_process(run_dir: Path) -> psutil.Process:
    """The gateway process of the stack running from `run_dir` (its command line names the run's bundle)."""
    bundle = str(Path(run_dir) / "bundle")
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if "umemc.runtime.gateway" in argv and bundle in argv:
            return proc
    raise RuntimeError(f"no gateway runs from {run_dir}")


def cpu_seconds(proc: psutil.Process) -> float:
    """User and system CPU seconds the process has used so far."""
    times = proc.cpu_times()
    return times.user + times.system


def until_listening(port: int, t: float) -> float:
    """Seconds from t until the port accepts a connection (asked every millisecond)."""
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return time.perf_counter() - t
        time.sleep(0.001)
