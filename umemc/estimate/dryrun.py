"""llama.cpp's own dry run: what it would allocate for a model, asked of the llama.cpp that will run it.

llama.cpp can load a model's metadata and simulate every allocation without reading a weight
(`llama_model_params.no_alloc`, llama.h; it asserts with an mmap load, so the load mode is `none`). The ways
that reach it, asked in this order:

- llama-server itself (builds with `--fit`, 2026-10 on): started with the model's own memory flags and
  `--fit on -v`, it first sizes the model exactly as it will run it (common/fit.cpp, step 1: a no_alloc load
  and context with the server's own settings, such as its output limit of one logits row per sequence,
  tools/server/server-context.cpp server_output_limits) and logs a memory breakdown; umemc stops it by its pid
  as soon as that breakdown is logged, before it loads a weight (0.1 s on the test machine).
- `llama-fit-params`, a tool of the same cmake tree (tools/fit-params/), beside a llama-server without
  `--fit`: the same dry run with llama.cpp's generic context settings. It reserves logits for the whole
  ubatch where llama-server reserves one row per sequence, so its compute figure can be higher than the
  server's (never lower).
- llama-cpp-python: its own server's settings parser and model loader (llama_cpp.server), run by that
  runtime's interpreter with `no_alloc` set on the model parameters.

Each logs the KV cache, recurrent state (`RS`), compute and output buffers to 0.01 MiB; the first two also a
memory breakdown per buffer type in whole MiB (common_memory_breakdown_print), the only place that names a
`CPU_REPACK` buffer.

A no_alloc load logs the weights' and the KV cache's buffers as 0.00 MiB (nothing was allocated); the KV
figure comes from the cache's own `size =` line and the weights from the breakdown table (and the GGUF
header, which is exact): umemc.estimate.recorded combines them. This module runs the tool and parses what it
says; it never reads a stack.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

from ..chars import shown as escaped
from ..errors import RuntimeFailure
from ..helptext import llama_cpp_version, probe
from ..lockfile import LOG_FIGURE, MAX_BYTES, BufferReport, DryRun, ToolIdentity, tool_identity

SERVER = "llama-server"
FIT_PARAMS = "llama-fit-params"
LLAMA_CPP_PYTHON = "llama-cpp-python"
MiB = 1024 * 1024


@dataclass(frozen=True)
class Tool:
    kind: str  # SERVER | FIT_PARAMS | LLAMA_CPP_PYTHON
    argv0: str  # llama-server, llama-fit-params, or the interpreter that imports llama_cpp
    identity: ToolIdentity  # a changed file here is another llama.cpp


def find_tool(runtime: str, bin: str | None, python: str = sys.executable) -> Tool | str:
    """The dry-run tool of the llama.cpp this runtime would start, or why there is none (one sentence).
    Cheap (a PATH lookup and a stat): `umemc check` asks it to know whether a recorded dry run still holds."""
    return _find(runtime, bin, python)


@lru_cache(maxsize=64)
def _find(runtime: str, bin: str | None, python: str) -> Tool | str:
    if runtime == "llama-server":
        return _fit_params(bin)
    if runtime == "llama-cpp-python":
        return _llama_cpp_python(bin or python, python)
    return f"{runtime} is not llama.cpp"


def still_answers(run: DryRun, runtime: str, bin: str | None, python: str = sys.executable) -> bool | None:
    """Whether the llama.cpp that answered `run` is the one this runtime would use now, unchanged (a PATH
    lookup and a stat, no process: `umemc check` asks it for every recorded answer). None: no llama.cpp of that
    kind is on this machine (a CI runner with the lock only): the recorded answer stands."""
    now: str | None
    if run.tool == LLAMA_CPP_PYTHON:
        tool = _llama_cpp_python(bin or python, python)
        return None if isinstance(tool, str) else tool.identity == run.identity
    server = server_binary(bin)
    if server is None:
        return None
    now = server if run.tool == SERVER else str(Path(server).parent / FIT_PARAMS)
    return now == run.identity.path and tool_identity(Path(now)) == run.identity


def server_binary(bin: str | None) -> str | None:
    """The llama-server the runtime would start (its `bin`, else the one on PATH)."""
    found = shutil.which(bin or "llama-server")
    return os.path.realpath(found) if found else None


def _fit_params(bin: str | None) -> Tool | str:
    server = server_binary(bin)
    if server is None:
        return f"no {bin or 'llama-server'} {'found' if bin else 'on PATH'}"
    described = probe(server)
    if described is not None and described.has("--fit"):
        ident = tool_identity(Path(server))
        return Tool(SERVER, server, ident) if ident else f"cannot stat {server}"
    fit = Path(server).parent / FIT_PARAMS
    ident = tool_identity(fit) if os.access(fit, os.X_OK) else None
    if ident is None:
        return (
            f"no {FIT_PARAMS} beside {server} (llama.cpp builds it from the same tree: "
            f"`cmake --build BUILD --target {FIT_PARAMS}`)"
        )
    return Tool(FIT_PARAMS, str(fit), ident)


def _llama_cpp_python(interpreter: str, python: str) -> Tool | str:
    found = shutil.which(interpreter)
    if found is None:
        return f"no interpreter {interpreter}"
    if os.path.realpath(found) != os.path.realpath(python):
        ident = tool_identity(Path(found))  # another venv: its interpreter stands for its llama.cpp
        return Tool(LLAMA_CPP_PYTHON, found, ident) if ident else f"cannot stat {found}"
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return f"llama_cpp is not importable by {python} (pip install llama-cpp-python)"
    lib = sorted(Path(spec.submodule_search_locations[0], "lib").glob("libllama.*"))
    ident = tool_identity(lib[0]) if lib else None
    if ident is None:
        return f"no libllama in {spec.submodule_search_locations[0]}/lib"
    return Tool(LLAMA_CPP_PYTHON, found, ident)


START_S = 30.0  # llama.cpp's start, its backends' probing and its fit pass, on a busy machine
HEADER_RATE = 8 * 1024 * 1024  # bytes a second of a GGUF header, read from the slowest disk or mount


def bound(header_bytes: int) -> tuple[float, str]:
    """How long a dry run may take (it reads the file's header and no weight), and how that bound was made."""
    reading = header_bytes / HEADER_RATE
    return START_S + reading, f"{START_S:g} s to start and {reading:.1f} s for its {header_bytes >> 20} MiB header"


def run(
    tool: Tool, args: list[str], flags: dict[str, object], timeout: tuple[float, str] = (300.0, "the default")
) -> DryRun:
    """Ask llama.cpp: `args` are the runtime's own memory-relevant arguments (the launcher's spelling); `timeout`:
    its bound in seconds and how it was made (bound()). Raises RuntimeFailure saying what happened (refused,
    killed by a signal, silent past its bound) with llama.cpp's last words."""
    if tool.kind == SERVER:
        # it binds its port before it loads: an ephemeral one on loopback, never a worker's
        argv = [tool.argv0, *args, "--fit", "on", "-v", "--host", "127.0.0.1", "--port", "0"]
    elif tool.kind == FIT_PARAMS:
        argv = [tool.argv0, "--fit-print", "on", "-v", *args]
    else:
        argv = [tool.argv0, "-c", LLAMA_CPP_PYTHON_DRY_RUN, *args]
    # llama.cpp's logger writes from a thread of its own and is not flushed at exit: llama-fit-params may exit
    # before the tail of its log (the buffer lines, the breakdown table) is written. The breakdown table is
    # logged after every buffer line, so a log holding its Host row is whole; one without it is asked again.
    for _ in range(FIT_PARAMS_TRIES if tool.kind == FIT_PARAMS else 1):
        done = _watch(argv, timeout, stop_at=_BREAKDOWN_HOST if tool.kind == SERVER else None)
        if done.timed_out:
            said = f": its last words: {last_words(done.log)}" if done.log.strip() else ": it wrote nothing"
            raise RuntimeFailure(
                f"{tool.kind} did not answer within {timeout[0]:.0f} s ({timeout[1]}) and was stopped{said}"
            )
        ok = _BREAKDOWN_HOST in done.log if tool.kind == SERVER else done.code == 0
        if tool.kind == LLAMA_CPP_PYTHON:
            ok = ok and _OK in done.log
        if not ok or tool.kind != FIT_PARAMS or _BREAKDOWN_HOST in done.log:
            break
    else:
        raise RuntimeFailure(
            f"{tool.kind} exited {FIT_PARAMS_TRIES} times before its log was written out (llama.cpp's logger "
            "is not flushed at exit): its answer is incomplete"
        )
    if not ok:
        if done.code < 0:
            raise RuntimeFailure(
                f"{tool.kind} was killed by {signal.Signals(-done.code).name} while sizing the model: "
                f"{last_words(done.log)}"
            )
        raise RuntimeFailure(f"{tool.kind} refused the model (exit {done.code}): {last_words(done.log)}")
    shown = argv if tool.kind != LLAMA_CPP_PYTHON else [tool.argv0, "-c", "<LLAMA_CPP_PYTHON_DRY_RUN>", *args]
    for line in done.log.splitlines():
        if _CLAIM.search(line) and not any(
            p.search(line) for p in (_KV_SIZE, _KV_BUFFER, _RS_BUFFER, _COMPUTE, _OUTPUT, _MODEL_BUFFER)
        ):
            raise RuntimeFailure(f"{tool.kind}'s answer cannot be read (not a figure): {escaped(line.strip()[:200])}")
    buffers, table = parse_buffers(done.log), parse_table(done.log)
    for where, figures in (*buffers.items(), *table.items()):
        for what, value in figures.items():
            if value > MAX_BYTES:
                raise RuntimeFailure(
                    f"{tool.kind}'s answer is beyond sense: {value / MiB:.2f} MiB for the {where} {what} buffer "
                    f"(no machine holds {MAX_BYTES >> 60} EiB); not used: {last_words(done.log)}"
                )
    return DryRun(
        tool=tool.kind,
        build=_build(tool, done.log),
        identity=tool.identity,
        flags=dict(flags),
        argv=shown,
        buffers=buffers,
        table=table,
        seconds=round(done.seconds, 3),
        peak_rss_bytes=done.peak_rss,
        read_bytes=done.read_bytes,
        at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


_BREAKDOWN_HOST = "common_memory_breakdown_print: |   - Host"
FIT_PARAMS_TRIES = 5


@dataclass
class _Done:
    code: int
    log: str  # stdout and stderr together
    seconds: float
    peak_rss: int | None  # the process's peak resident set (wait4's ru_maxrss)
    read_bytes: int | None  # what it read through read() and friends (/proc/PID/io rchar), Linux
    timed_out: bool = False  # silent past its bound: stopped


def _watch(argv: list[str], timeout: tuple[float, str], stop_at: str | None) -> _Done:
    """Run argv, collecting its output; with `stop_at`, SIGKILL it (by its pid) as soon as that line is logged
    (llama-server's fit pass: its answer, before it loads a weight). Measures what the run cost."""
    import selectors

    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    except OSError as exc:
        raise RuntimeFailure(f"cannot run {argv[0]}: {exc.strerror}") from None
    assert proc.stdout is not None
    out, read, stop = bytearray(), None, stop_at.encode() if stop_at else None
    deadline, finished, timed_out = start + timeout[0], False, False
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                read = _rchar(proc.pid, read)
                if not sel.select(timeout=min(0.05, max(0.0, deadline - time.monotonic()))):
                    continue
                data = os.read(proc.stdout.fileno(), 65536)
                out += data
                finished = not data or (stop is not None and _line_complete(out, stop))
                if finished:
                    break
            else:
                timed_out = True
    finally:
        read = _rchar(proc.pid, read)
        if not finished or stop:  # its answer is in (or it hung): stop it before it loads a weight
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    if stop is not None and _line_complete(out, stop):
        # the answer ends with that line: on a busy machine the kill may come after the real load has logged
        # its own buffers too (a second model and context), which are not the dry run's
        del out[out.find(b"\n", out.find(stop)) + 1 :]
    return _Done(proc.returncode, out.decode(errors="replace"), time.monotonic() - start, peak, read, timed_out)


def _line_complete(out: bytearray, marker: bytes) -> bool:
    """Whether a whole line holding `marker` has arrived (the pipe cuts lines anywhere)."""
    at = out.find(marker)
    return at >= 0 and out.find(b"\n", at) >= 0


def _rchar(pid: int, last: int | None) -> int | None:
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return last
    m = re.search(r"rchar: (\d+)", text)
    return max(last or 0, int(m.group(1))) if m else last


def last_words(log: str, n: int = 3) -> str:
    """The error lines of a llama.cpp log (else its last lines), for a message."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\bE\b|error|failed|what\(\)", line)]
    return " | ".join((errors or lines)[-n:]) or "no output"


# -- parsing -----------------------------------------------------------------------------------------------
# llama-kv-cache.cpp / llama-memory-recurrent.cpp / llama-context.cpp (LLAMA_LOG_INFO; the fit tool logs them
# at debug level): "<buffer> KV buffer size = 0.00 MiB" then "llama_kv_cache: size = 4.00 MiB (...)".
_KV_BUFFER = re.compile(rf"(\S+) KV buffer size =\s+{LOG_FIGURE} MiB\b")
_KV_SIZE = re.compile(rf"llama_kv_cache: size =\s+{LOG_FIGURE} MiB\b")
_RS_BUFFER = re.compile(rf"(\S+) RS buffer size =\s+{LOG_FIGURE} MiB\b")
_COMPUTE = re.compile(rf"(\S+) compute buffer size =\s+{LOG_FIGURE} MiB\b")
_OUTPUT = re.compile(rf"(\S+)\s+output buffer size =\s+{LOG_FIGURE} MiB\b")
# any line that claims a figure: one the patterns above cannot read is an answer umemc cannot trust
_CLAIM = re.compile(r"(?:buffer size|llama_kv_cache: size) =")
_MODEL_BUFFER = re.compile(rf"(\S+) model buffer size =\s+{LOG_FIGURE} MiB\b")
# common_memory_breakdown_print: "|   - Host | 25 = 3 + 4 + 17 |" (host and buffer types) and
# "|   - ROCm0 (8060S) | 131072 = 9000 + (25 = 3 + 4 + 17) + 100 |" (devices), whole MiB.
_ROW = re.compile(
    r"\|\s+- (?P<name>.+?)\s+\|[^|]*?(?P<self>\d{1,15}) =\s+(?P<model>\d{1,15}) \+\s+(?P<context>\d{1,15}) \+"
    r"\s+(?P<compute>\d{1,15})\b"
)


def _mib(text: str) -> int:
    return round(float(text) * MiB)


def parse_buffers(log: str) -> BufferReport:
    """{buffer: {kv, rs, compute, output, model}} from a dry run's log; `model` is 0 (a no_alloc load does not
    size the weights' buffers here) but says which buffers the weights would go to (CPU_REPACK: repacked)."""
    out: BufferReport = {}
    lines = log.splitlines()
    kv_device = "CPU"
    for line in lines:
        if m := _KV_BUFFER.search(line):
            kv_device = m.group(1)
        elif m := _KV_SIZE.search(line):
            slot = out.setdefault(kv_device, {})
            slot["kv"] = slot.get("kv", 0) + _mib(m.group(1))
        elif m := _RS_BUFFER.search(line):
            slot = out.setdefault(m.group(1), {})
            slot["rs"] = slot.get("rs", 0) + _mib(m.group(2))
        elif m := _COMPUTE.search(line):
            out.setdefault(m.group(1), {})["compute"] = _mib(m.group(2))
        elif m := _OUTPUT.search(line):
            out.setdefault(m.group(1), {})["output"] = _mib(m.group(2))
        elif m := _MODEL_BUFFER.search(line):
            out.setdefault(m.group(1), {}).setdefault("model", 0)
    return out


def parse_table(log: str) -> BufferReport:
    """{row: {model, context, compute}} in bytes (whole MiB) from the memory breakdown table; a device row is
    named without its description ("ROCm0 (Radeon 8060S)" -> "ROCm0")."""
    out: BufferReport = {}
    for m in _ROW.finditer(log):
        name = m.group("name").split(" (")[0].strip()
        out[name] = {k: int(m.group(k)) * MiB for k in ("model", "context", "compute")}
    return out


def _build(tool: Tool, log: str) -> str:
    if tool.kind == LLAMA_CPP_PYTHON:
        m = re.search(rf"{_OK} (\S+)", log)
        return m.group(1) if m else "unknown"
    described = probe(tool.argv0) if tool.kind == SERVER else None
    return described.version if described is not None else llama_cpp_version(tool.argv0)


_OK = "UMEMC-DRY-RUN-OK"
# Run by the llama-cpp-python runtime's own interpreter with the server's argv (after `-m llama_cpp.server`):
# its own settings parser and loader build the model exactly as the server would, with no_alloc set on the
# model parameters (and the load mode none: a no_alloc load asserts with mmap). Standalone: that interpreter
# may not have umemc.
LLAMA_CPP_PYTHON_DRY_RUN = f"""
import argparse, sys
import llama_cpp
from llama_cpp import _internals
_init = _internals.LlamaModel.__init__
def _no_alloc(self, *, path_model, params, verbose=True):
    params.no_alloc = True
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
    _init(self, path_model=path_model, params=params, verbose=True)
_internals.LlamaModel.__init__ = _no_alloc
from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
from llama_cpp.server.model import LlamaProxy
from llama_cpp.server.settings import ModelSettings, Settings
parser = argparse.ArgumentParser()
add_args_from_model(parser, Settings)
settings = parse_model_from_args(ModelSettings, parser.parse_args(sys.argv[1:]))
settings = settings.model_copy(update={{"verbose": True}})
LlamaProxy.load_llama_from_model_settings(settings)
sys.stderr.flush()
print("{_OK}", llama_cpp.__version__, flush=True)
"""
