"""Nothing found where a state file should be hangs or sinks a reader: a FIFO at state/enforcer.json, state/gateway.json
or a run's plan.json (a plain open(2) of a FIFO without a writer blocks for good), a link, a file too large, JSON
nested past Python's recursion limit. `status` and `ps` run as their own processes, bounded in time, so a hang is a
failure, not a stuck test run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import patience
from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.contract import EnforcerStatus, read_optional
from umemc.records import read_file
from umemc.stack.resolve import load_stack

STACK = 'version = 1\nname = "st"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n[models.m]\nruntime = "command"\n'
STACK += 'command = ["true"]\nmemory = "64MiB"\n'


def test_read_file_refuses_what_is_no_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "real").write_bytes(b"x" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError, match="not a regular file"):
        read_file(tmp_path / "fifo")
    with pytest.raises(OSError):  # ELOOP: a link at the file's own name is not followed
        read_file(tmp_path / "link")
    with pytest.raises(OSError, match="larger than 99 bytes"):
        read_file(tmp_path / "real", limit=99)
    assert read_file(tmp_path / "real", limit=100) == b"x" * 100
    assert read_optional(EnforcerStatus, tmp_path / "fifo") is None


def run_dir_with_fifos(tmp_path: Path, plan_fifo: bool = False) -> Path:
    (tmp_path / "stack.toml").write_text(STACK)
    run = tmp_path / "run"
    build(make_plan(load_stack(tmp_path / "stack.toml")), run / "bundle", files_later=True)
    (run / "state").mkdir()
    for name in ("enforcer.json", "gateway.json"):
        os.mkfifo(run / "state" / name)
    if plan_fifo:
        (run / "bundle" / "plan.json").unlink()
        os.mkfifo(run / "bundle" / "plan.json")
    return run


def umemc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "umemc", *args],
        capture_output=True,
        text=True,
        timeout=patience(60),
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_status_answers_beside_fifo_state_files(tmp_path: Path) -> None:
    run = run_dir_with_fifos(tmp_path)
    done = umemc("status", "--run-dir", str(run), "--json")
    assert done.returncode == 0, done.stderr
    models = json.loads(done.stdout)["models"]
    assert models["m"]["state"] == "STOPPED" and models["m"]["pid"] is None


def test_ps_answers_for_a_run_whose_plan_is_a_fifo(tmp_path: Path) -> None:
    run = run_dir_with_fifos(tmp_path, plan_fifo=True)
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    record = {"name": "st", "run_dir": str(run), "stack_file": str(tmp_path / "stack.toml"), "gateway": None}
    (home / "runs" / "st.json").write_text(json.dumps(record))
    done = umemc("ps", "--json", env={"UMEMC_STATE_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["name"] for r in rows] == ["st"]


def test_gateway_figures_nested_past_reason_are_not_used(tmp_path: Path, capsys) -> None:
    from umemc.runtime.gateway.history import Memory, Requests
    from umemc.runtime.gateway.page_figures import load

    path = tmp_path / "gateway-figures.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert load(path, 1, {}, Requests(), Memory(1.0)) is False
    assert capsys.readouterr().err == f"umemc-gateway: its kept figures in {path} are not used: it nests too deep\n"
    path.unlink()
    os.mkfifo(path)
    assert load(path, 1, {}, Requests(), Memory(1.0)) is False
    assert "not a regular file" in capsys.readouterr().err


def test_a_record_claiming_another_stacks_name_is_not_used(tmp_path: Path) -> None:
    """`a.json` saying it is stack "real" must not win over real.json: umemc writes NAME.json and reads no other."""
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    real, forged = tmp_path / "real-run", tmp_path / "forged-run"
    (home / "runs" / "real.json").write_text(json.dumps({"name": "real", "run_dir": str(real)}))
    (home / "runs" / "a.json").write_text(json.dumps({"name": "real", "run_dir": str(forged)}))
    from umemc.runtime import registry

    os.environ["UMEMC_STATE_HOME"] = str(home)
    try:
        records, unreadable = registry.known()
        assert [r.run_dir for r in records] == [str(real)]
        assert unreadable == [
            f"{home / 'runs' / 'a.json'}: claims the stack name 'real', which is not its own file's: not used"
        ]
        assert registry.find("real") == real
    finally:
        del os.environ["UMEMC_STATE_HOME"]


def test_ps_shows_a_records_control_characters_escaped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    run = str(tmp_path / "run\x1b[2Jcleared")
    (home / "runs" / "evil.json").write_text(json.dumps({"name": "evil", "run_dir": run, "gateway": "\x07bell"}))
    done = umemc("ps", env={"UMEMC_STATE_HOME": str(home), "COLUMNS": "300"})
    assert done.returncode == 0
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "\\x1b[2Jcleared" in done.stdout and "\\x07bell" in done.stdout
