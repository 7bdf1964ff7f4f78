"""Shared fixtures: inline stacks, tiny GGUF files, and a guard that makes touching /etc fail."""

from __future__ import annotations

import builtins
import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from umemc.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_etc_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests must never write host configuration: any write under /etc fails loudly."""
    real_open, real_os_open = builtins.open, os.open

    def guarded_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(file, (str, Path)) and str(file).startswith("/etc") and any(c in mode for c in "wax+"):
            raise AssertionError(f"test tried to write {file}")
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).startswith("/etc") and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise AssertionError(f"test tried to write {path}")
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(os, "open", guarded_os_open)


@pytest.fixture
def write_stack(tmp_path: Path) -> Callable[[str], Path]:
    """write_stack('''…''') -> path of a stack.toml holding the dedented text."""

    def write(text: str, name: str = "stack.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    return write


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str, str]]:
    """Run the real CLI entry point in-process; returns (exit code, stdout, stderr)."""

    def run(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


BASE = """
version = 1
name = "t"

[platform]
kind = "cpu"
memory = "16GiB"
"""


SLOW_MARKERS = ("llama", "llama_server", "torch")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`slow`: every test that brings up a real stack (the `stack` fixture) or needs a long-built lane, besides
    the modules and tests marked by hand; `pytest -m "not slow"` is the fast lane while editing."""
    for item in items:
        if "stack" in getattr(item, "fixturenames", ()) or any(item.get_closest_marker(m) for m in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)
