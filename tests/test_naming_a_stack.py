"""Commands about a running stack name it by its name or by its stack file, from any directory; where exactly one
stack runs, they may leave it out. The registry is a folder of records (UMEMC_STATE_HOME here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.stack.resolve import load_stack

STACK = 'version = 1\nname = "{name}"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n[models.m]\nruntime = "command"\n'
STACK += 'command = ["true"]\nmemory = "64MiB"\n'


def recorded(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A stack file and a run dir with its bundle (as `up` leaves them), recorded as running."""
    folder = tmp_path / name
    folder.mkdir()
    stack = folder / "stack.toml"
    stack.write_text(STACK.format(name=name))
    run = folder / "run"
    build(make_plan(load_stack(stack)), run / "bundle", files_later=True)
    (run / "state").mkdir()
    runs = tmp_path / "home" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    record = {"name": name, "run_dir": str(run), "stack_file": str(stack), "gateway": None}
    (runs / f"{name}.json").write_text(json.dumps(record))
    return stack, run


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UMEMC_STATE_HOME", str(tmp_path / "home"))
    away = tmp_path / "elsewhere"
    away.mkdir()
    monkeypatch.chdir(away)
    return away


def test_the_one_running_stack_is_taken_from_any_directory(tmp_path: Path, elsewhere: Path, run_cli) -> None:
    _, run = recorded(tmp_path, "solo")
    code, out, err = run_cli("status", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["stack"] == "solo"
    code, _, err = run_cli("events", "--json")  # the one running stack's run dir, where nothing has run yet
    assert (code, err) == (2, f"no event log in {run} (nothing has run there)\n")
    from umemc.commands.up import find_run_dir

    assert find_run_dir(running=True) == str(run)
    assert find_run_dir() == ".umemc/run"  # `up` starts a new stack where it is asked to, never in another's run


def test_with_two_running_a_name_is_needed_and_the_hint_says_how(tmp_path: Path, elsewhere: Path, run_cli) -> None:
    recorded(tmp_path, "one")
    recorded(tmp_path, "two")
    code, out, err = run_cli("logs", "m")
    running = f"one ({tmp_path / 'one' / 'run'}), two ({tmp_path / 'two' / 'run'})"
    assert (code, out, err) == (
        2,
        "",
        f"no stack in .umemc/run; running: {running}: name one (`umemc logs MODEL --stack NAME`)\n",
    )
    code, out, _ = run_cli("status", "two", "--json")
    assert code == 0 and json.loads(out)["stack"] == "two"


def test_a_stack_file_names_its_running_stack(tmp_path: Path, elsewhere: Path, run_cli) -> None:
    stack, _ = recorded(tmp_path, "byfile")
    recorded(tmp_path, "other")
    code, out, _ = run_cli("status", str(stack), "--json")
    assert code == 0 and json.loads(out)["stack"] == "byfile"
    code, out, _ = run_cli("status", "../byfile/stack.toml", "--json")  # relative to where the command runs
    assert code == 0 and json.loads(out)["stack"] == "byfile"
