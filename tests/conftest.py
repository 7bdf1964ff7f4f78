"""Shared fixtures: inline stacks, tiny GGUF files, and a guard that makes touching /etc fail."""

from __future__ import annotations

import builtins
import os
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from umemc.cli import main

REPO = Path(__file__).resolve().parents[1]


def _patience() -> float:
    """How much longer than on an idle machine a wait may take here: UMEMC_TEST_PATIENCE, else from the load
    average when the session starts (a busy 2-core machine at load 9 waits up to 10x). Waits follow events; this
    only scales the bound after which a test gives up."""
    given = os.environ.get("UMEMC_TEST_PATIENCE")
    if given:
        return max(1.0, float(given))
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(10.0, max(1.0, 1.0 + 2.0 * load))


PATIENCE = _patience()


def patience(seconds: float) -> float:
    """A wait's bound on this machine, now (see _patience)."""
    return seconds * PATIENCE


def patience_now(seconds: float) -> float:
    """A bound on this machine as loaded at this moment (the session's start may have come before a load did)."""
    return seconds * max(PATIENCE, _patience())


@pytest.fixture(autouse=True, scope="session")
def own_state_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The stacks the tests run are recorded in a directory of the test session's (`umemc ps`), never the user's."""
    os.environ["UMEMC_STATE_HOME"] = str(tmp_path_factory.mktemp("state-home"))


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


# What makes a test slow is what it starts: a supervisord (a real stack) or a llama.cpp server. A test that starts
# one must be in the slow lane (the `stack` fixture, a lane marker, or @pytest.mark.slow); fast_lane_starts_none
# fails any other test at the moment it would start one.
SLOW_PROGRAMS = ("supervisord", "supervisor.supervisord", "umemc.runtime.supervisord", "llama-server", "rpc-server")


def _slow_program(args: object) -> str | None:
    words = args if isinstance(args, (list, tuple)) else [args]
    for word in map(str, words):
        if word in SLOW_PROGRAMS or Path(word).name in SLOW_PROGRAMS:
            return word
    return None


_running: list[pytest.Item] = []  # the test being set up, run or torn down


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


@pytest.fixture(autouse=True, scope="session")
def fast_lane_starts_none() -> Iterator[None]:
    """A test outside the slow lane that starts supervisord or a llama.cpp server (in its body or in any fixture
    it sets up, module-wide ones included) fails, naming it, before the process starts: the lanes are assigned by
    what a test starts, and checked here."""
    real = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):  # type: ignore[no-untyped-def]
        program = _slow_program(args)
        test = _running[-1] if _running else None
        if program is not None and test is not None and not test.get_closest_marker("slow"):
            raise AssertionError(
                f"{test.nodeid} starts {program}, which makes it a slow test: mark it @pytest.mark.slow"
            )
        real(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist a module's tests stay on one worker, in their order (`--dist loadscope`, also where `-n`
    is given alone): a module-wide fixture brings up one real stack for all its tests, and some tests take the
    stack from where the one before left it (a model its keep_alive unloaded)."""
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadscope"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`slow`: every test that brings up a real stack through the `stack` fixture, or needs a long-built lane,
    besides the modules and tests marked by hand (fast_lane_starts_none holds everything else to it); `pytest -m
    "not slow"` is the fast lane while editing."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "stack" in fixtures or any(item.get_closest_marker(m) for m in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)
