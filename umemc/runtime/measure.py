"""Running a worker once to measure it (`umemc calibrate`): its exact compiled argv and environment,
a warm-up request, its process tree's resident memory, llama.cpp's own buffer report."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from ..errors import RuntimeFailure
from ..lockfile import Measured

WARMUP: dict[str, tuple[str, dict[str, Any]]] = {
    "llm": ("/v1/completions", {"prompt": "Hello, my name is", "max_tokens": 8}),
    "embedding": ("/v1/embeddings", {"input": "Hello, my name is"}),
}


def measure(program: Any, facts: dict[str, Any], timeout: float, fill_tokens: int = 0) -> Measured:
    """Run the worker's exact argv, wait for health, warm it up (optionally with a prompt of about
    fill_tokens tokens, to fill the context), sample its tree's RSS, stop it."""
    from .llamalog import parse_buffers
    from .probes.host import processes, tree_memory
    from .waits import healthy
    from .wrap import fill_state

    env = dict(os.environ, **dict(program.env))
    # a path in the run's state dir (llama-server's --slot-save-path) is filled in as the exec wrapper does, with
    # a state dir of the measurement's own
    with tempfile.TemporaryFile("w+") as log, tempfile.TemporaryDirectory(prefix="umemc-measure-") as state:
        argv = fill_state(list(program.argv), state)
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=program.cwd, start_new_session=True
        )
        try:
            deadline = time.monotonic() + timeout
            while not healthy(program.port, program.health):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeFailure(f"{program.name} did not become healthy:\n{log.read()[-3000:]}")
                time.sleep(0.2)
            _warm_up(program.port, facts.get("family", "llm"), fill_tokens)
            tree, rss = processes(), 0
            for _ in range(5):  # the peak of a few samples after the warm-up request
                rss = max(rss, tree_memory(tree, proc.pid)[0])
                time.sleep(0.1)
            tree.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.seek(0)
        buffers = parse_buffers(log.read())
    if not buffers:
        raise RuntimeFailure(f"{program.name}: no llama.cpp buffer report in its log (not a llama.cpp server?)")
    return Measured(
        buffers=buffers,
        rss_bytes=rss,
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        runtime_version=_version(program),
    )


def measure_peak(program: Any, timeout: float, settle_s: float = 3.0) -> Measured:
    """A torch worker: run it with its compiled argv and environment, let it do its own warm-up
    (it reports healthy when loaded), and sample its process tree's peak resident memory."""
    from .probes.host import processes, tree_memory
    from .waits import healthy

    env = dict(os.environ, **dict(program.env))
    proc = subprocess.Popen(
        list(program.argv),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=program.cwd,
        start_new_session=True,
    )
    tree, peak = processes(), 0
    try:
        deadline = time.monotonic() + timeout
        while not healthy(program.port, program.health):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeFailure(f"{program.name} did not become healthy (exit {proc.poll()})")
            peak = max(peak, tree_memory(tree, proc.pid)[0])
            time.sleep(0.05)
        end = time.monotonic() + settle_s
        while time.monotonic() < end:
            peak = max(peak, tree_memory(tree, proc.pid)[0])
            time.sleep(0.05)
    finally:
        tree.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return Measured(peak_bytes=peak, at=datetime.now(UTC).isoformat(timespec="seconds"))


def _warm_up(port: int, family: str, fill_tokens: int = 0) -> None:
    path, body = WARMUP["embedding" if family == "embedding" else "llm"]
    if fill_tokens:
        body = dict(body, prompt=" ".join(["a"] * fill_tokens), max_tokens=1)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeFailure(f"warm-up request {path} answered {response.status}")
    finally:
        conn.close()


def _version(program: Any) -> str:
    if "llama_cpp.server" in program.argv:
        out = subprocess.run(
            [program.argv[0], "-c", "import llama_cpp; print(llama_cpp.__version__)"],
            capture_output=True,
            text=True,
            check=False,
        )
        return f"llama-cpp-python {out.stdout.strip()}"
    return str(program.argv[0])
