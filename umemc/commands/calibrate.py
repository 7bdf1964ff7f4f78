"""`umemc calibrate STACK [MODEL…] [--lock-only]`: start each llama.cpp-family model that has a real
file once, with exactly the compiled flags; read llama.cpp's own buffer report from its log and the
process's resident memory after a warm-up request; stop it; store the result (and the GGUF header
facts: the stack's lock) in `<stack>.calibration.json` beside the stack."""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import RuntimeFailure, UsageError
from ..units import human

WARMUP: dict[str, tuple[str, dict[str, Any]]] = {"llm": ("/v1/completions", {"prompt": "Hello, my name is", "max_tokens": 8}),
          "embedding": ("/v1/embeddings", {"input": "Hello, my name is"})}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("calibrate", help="measure llama.cpp models with their compiled flags; write the lock")
    p.add_argument("stack", help="the stack file (TOML)")
    p.add_argument("models", nargs="*", metavar="MODEL", help="only these models (default: every one with a file)")
    p.add_argument("--lock-only", action="store_true", help="record the GGUF header facts only; start nothing")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each model to load")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import calibration
    from ..budget import make_plan
    from ..compile import compile_bundle
    from ..estimate.gguf_file import read as read_gguf
    from ..estimate.llama import current_flags
    from ..estimate.other import torch_flags
    from ..stack.resolve import LLAMA_RUNTIMES, load_stack

    stack_path = Path(args.stack)
    loaded = load_stack(stack_path, shown=args.stack)
    unknown = [m for m in args.models if m not in loaded.models]
    if unknown:
        raise UsageError(f"umemc calibrate: no model {unknown[0]!r} in {args.stack}")
    chosen = [m for m in loaded.models.values() if (not args.models or m.name in args.models)
              and ((m.spec.runtime in LLAMA_RUNTIMES and m.model_present) or m.spec.runtime == "torch")]
    if not chosen:
        raise UsageError(f"umemc calibrate: nothing to calibrate in {args.stack} (llama.cpp models with a present "
                         "file, torch workers)")
    before = make_plan(loaded)
    bundle = compile_bundle(before)
    entries = calibration.load(stack_path)
    for m in chosen:
        if m.spec.runtime == "torch":
            if not args.lock_only:
                entries[m.name] = {"flags": torch_flags(loaded, m),
                                   "measured": measure_peak(bundle.programs[m.name], args.timeout)}
                print(f"{m.name}: peak resident after its warm-up {human(entries[m.name]['measured']['peak_bytes'])}")
            continue
        assert m.model_path is not None
        facts = read_gguf(m.model_path)
        entry: dict[str, Any] = {"file": calibration.identity(m.model_path), "header": calibration.header(facts)}
        if not args.lock_only:
            entry["flags"] = current_flags(loaded, m)
            entry["measured"] = measure(bundle.programs[m.name], before.models[m.name].estimate.facts, args.timeout)
        entries[m.name] = entry
        _report(m.name, before.models[m.name].estimate, entry)
    path = calibration.save(stack_path, entries)
    print(f"wrote {path}")
    return 0


def _report(name: str, est: Any, entry: dict[str, Any]) -> None:
    if "measured" not in entry:
        print(f"{name}: locked {entry['header']['n_tensors']} tensors, {human(entry['header']['tensor_bytes'])}")
        return
    from ..calibration import totals

    t, meas = totals(entry["measured"]["buffers"]), entry["measured"]
    rows = [("weights", est.weights.bytes, t["model"]), ("kv", est.kv.bytes, t["kv"]),
            ("compute", est.compute.bytes, t["compute"] + t["output"])]
    print(f"{name}: estimate vs llama.cpp, resident after warm-up {human(meas['rss_bytes'])}")
    for label, e, real in rows:
        err = (e - real) / real * 100 if real else 0.0
        print(f"  {label:8} {human(e):>12} vs {human(real):>12}  ({err:+.1f}%)")


def measure(program: Any, facts: dict[str, Any], timeout: float, fill_tokens: int = 0) -> dict[str, Any]:
    """Run the worker's exact argv, wait for health, warm it up (optionally with a prompt of about
    fill_tokens tokens, to fill the context), sample its tree's RSS, stop it."""
    from ..calibration import parse_buffers
    from ..runtime.control import healthy
    from ..runtime.probes.proc import ProcTree

    env = dict(os.environ, **dict(program.env))
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(list(program.argv), stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=program.cwd, start_new_session=True)
        try:
            model = {"port": program.port, "health": program.health}
            deadline = time.monotonic() + timeout
            while not healthy(model):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeFailure(f"{program.name} did not become healthy:\n{log.read()[-3000:]}")
                time.sleep(0.2)
            _warm_up(program.port, facts.get("family", "llm"), fill_tokens)
            tree, rss = ProcTree(), 0
            for _ in range(5):          # the peak of a few samples after the warm-up request
                rss = max(rss, tree.tree_rss(proc.pid)[0])
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
    return {"buffers": buffers, "rss_bytes": rss, "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "runtime_version": _version(program)}


def measure_peak(program: Any, timeout: float, settle_s: float = 3.0) -> dict[str, Any]:
    """A torch worker: run it with its compiled argv and environment, let it do its own warm-up
    (it reports healthy when loaded), and sample its process tree's peak resident memory."""
    from ..runtime.control import healthy
    from ..runtime.probes.proc import ProcTree

    env = dict(os.environ, **dict(program.env))
    proc = subprocess.Popen(list(program.argv), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, cwd=program.cwd, start_new_session=True)
    tree, peak = ProcTree(), 0
    try:
        deadline = time.monotonic() + timeout
        model = {"port": program.port, "health": program.health}
        while not healthy(model):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeFailure(f"{program.name} did not become healthy (exit {proc.poll()})")
            peak = max(peak, tree.tree_rss(proc.pid)[0])
            time.sleep(0.05)
        end = time.monotonic() + settle_s
        while time.monotonic() < end:
            peak = max(peak, tree.tree_rss(proc.pid)[0])
            time.sleep(0.05)
    finally:
        tree.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {"peak_bytes": peak, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


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
        out = subprocess.run([program.argv[0], "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True, check=False)
        return f"llama-cpp-python {out.stdout.strip()}"
    return str(program.argv[0])
