"""The exec wrapper removes the variables `umemc up` named in the run's state (secrets/unset-env: the gateway
token's name) from every program but the gateway's (--keep-secrets): a worker never sees the token even where
supervisord was given it, and the name is read at each start, not written into a worker's command (adding
token_env to a stack changes no worker's command, so a gateway-only change restarts no worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import patience
from umemc.names import WRAP_ENTRY

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the wrapper's records: Linux")


def env_seen(tmp_path: Path, *flags: str) -> dict[str, str]:
    out = tmp_path / f"env{len(flags)}.json"
    argv = [sys.executable, "-I", "-S", WRAP_ENTRY, "--stack", "s", "--model", "m", "--hard", "0", "--soft", "0"]
    argv += ["--cgroup", "off", "--state", str(tmp_path / "state"), "--outlive-parent", *flags, "--"]
    argv += [sys.executable, "-c", f"import json, os; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"]
    env = {**os.environ, "MY_GATEWAY_TOKEN": "s3cret", "OTHER": "kept"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=patience(60), check=False)
    assert done.returncode == 0, done.stderr
    seen: dict[str, str] = json.loads(out.read_text())
    return seen


def test_the_token_named_in_the_state_is_removed_from_all_but_the_gateway(tmp_path: Path) -> None:
    secrets = tmp_path / "state" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "unset-env").write_text("MY_GATEWAY_TOKEN\n")
    worker = env_seen(tmp_path)
    assert "MY_GATEWAY_TOKEN" not in worker and worker["OTHER"] == "kept"
    gateway = env_seen(tmp_path, "--keep-secrets")
    assert gateway["MY_GATEWAY_TOKEN"] == "s3cret"


def test_without_a_name_nothing_is_removed(tmp_path: Path) -> None:
    assert env_seen(tmp_path)["MY_GATEWAY_TOKEN"] == "s3cret"


def test_a_worker_command_does_not_name_the_token(tmp_path: Path) -> None:
    from umemc.budget.plan import make_plan
    from umemc.commands.build import build
    from umemc.contract import PlanDoc, read
    from umemc.stack.resolve import load_stack

    base = 'version = 1\nname = "t"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n[gateway]\nport = 10999\n{}'
    base += '[models.w]\nruntime = "command"\ncommand = ["true"]\nmemory = "64MiB"\n'
    wrapped = {}
    for token in ("", 'token_env = "MY_GATEWAY_TOKEN"\n'):
        (tmp_path / "s.toml").write_text(base.format(token))
        build(make_plan(load_stack(tmp_path / "s.toml")), tmp_path / f"b{len(token)}", files_later=True)
        wrapped[token] = read(PlanDoc, tmp_path / f"b{len(token)}" / "plan.json").models["w"].wrap
    assert wrapped[""] == wrapped['token_env = "MY_GATEWAY_TOKEN"\n']
    assert "--unset" not in wrapped[""] and "MY_GATEWAY_TOKEN" not in " ".join(wrapped[""])
