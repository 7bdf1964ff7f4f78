"""`umemc up` on a running stack: the same admission as the gateway (never over budget, never
evicting), umemc's own programs left alone when nothing they read changed, and a token set after a
failed start picked up. Real supervisord, real placeholder workers, the real gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import patience
from tests.runtime.test_gateway import Gateway, model, stack_text
from umemc.cli import main

MiB = 2**20


def up_again(r: Any, *flags: str) -> int:
    return main(
        [
            "up",
            str(r.run_dir.parent / "stack.toml"),
            "--run-dir",
            str(r.run_dir),
            "--timeout",
            str(patience(60)),
            *flags,
        ]
    )


def own_pids(r: Any) -> tuple[int, int]:
    def pid(name: str) -> int:
        return int((r.run_dir / "state" / "pids" / name).read_text().split()[0])

    return pid("umemc-enforcer"), pid("umemc-gateway")


def test_up_again_does_not_restart_a_hot_worker_evicted_for_a_cold_one(stack: Any, capsys: Any) -> None:
    text = stack_text("rc-evict", model("image", priority=10, mode="hot") + model("coder", priority=80), slots=1)
    gw = Gateway(stack(text, "--simulate"))
    assert gw.complete("coder")[0] == 200  # the budget holds one: image is evicted for coder
    assert [m for m, _, _ in gw.kinds("evict")] == ["image"]
    capsys.readouterr()
    assert up_again(gw.run, "--simulate") == 0
    out = capsys.readouterr().out
    assert (
        f"  image (hot) not started: image needs {80 * MiB} bytes (0.08 GiB), 0 bytes (0.00 GiB) free; blocked by "
        "coder (priority 80 >= 10)\n" in out
    )
    status = gw.run.status()
    assert status["image"]["state"] == "STOPPED" and status["coder"]["state"] in ("STARTING", "RUNNING")
    assert gw.run.events("reconcile")[0]["detail"]["started"] == []


def test_up_again_leaves_the_enforcer_and_gateway_alone_unless_the_plan_changed(stack: Any, tmp_path: Path) -> None:
    text = stack_text("rc-own", model("w", mode="hot"), slots=2)
    r = stack(text, "--simulate")
    before = own_pids(r)
    assert up_again(r, "--simulate") == 0
    assert own_pids(r) == before  # unchanged stack: nothing restarted
    (tmp_path / "stack.toml").write_text(
        (tmp_path / "stack.toml").read_text().replace("[gateway]\n", "[gateway]\nqueue = 7\n")
    )
    assert up_again(r, "--simulate") == 0
    after = own_pids(r)
    assert after[0] != before[0] and after[1] != before[1]  # they read the new plan
    assert Gateway(r).status()["models"]["w"]["state"] == "RUNNING"


def test_up_again_after_setting_the_missing_token(stack: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.delenv("UMEMC_RC_TOKEN", raising=False)
    text = stack_text("rc-token", model("w", mode="hot"), slots=1, gateway='token_env = "UMEMC_RC_TOKEN"\n')
    r = stack(text, "--simulate", "--force", expect=1)  # the gateway refuses to run without its token
    assert (
        "umemc-gateway: gateway.token_env names UMEMC_RC_TOKEN, which is not set (or empty)" in capsys.readouterr().err
    )
    monkeypatch.setenv("UMEMC_RC_TOKEN", "late-token")
    assert up_again(r, "--simulate") == 0
    gw = Gateway(r)
    assert gw.call("GET", "/v1/models")[0] == 401
    assert gw.call("GET", "/v1/models", headers={"Authorization": "Bearer late-token"})[0] == 200


def test_try_stop_says_what_happened(stack: Any, tmp_path: Path) -> None:
    """Stopping a worker never claims success it did not have (events record the real outcome)."""
    from umemc.runtime.supervisor import Supervisor

    r = stack(stack_text("rc-stop", model("w", mode="hot") + model("c"), slots=2), "--simulate")
    sup = Supervisor(r.run_dir / "state" / "supervisor.sock")
    assert sup.try_stop("c") == "not running"
    assert sup.try_stop("nope") == "supervisord refused: BAD_NAME: nope"
    assert sup.try_stop("w") is None
    assert r.status()["w"]["state"] == "STOPPED"
    assert Supervisor(tmp_path / "none.sock").try_stop("w") == (
        "supervisord did not answer: [Errno 2] No such file or directory"
    )


def test_up_again_reports_a_hot_worker_the_update_started(stack: Any, tmp_path: Path) -> None:
    """A hot model added to the stack is started by supervisord's update (autostart): the reconcile event
    names it instead of saying started=[]."""
    r = stack(stack_text("rc-add", model("w", mode="hot"), slots=2), "--simulate")
    (tmp_path / "stack.toml").write_text((tmp_path / "stack.toml").read_text() + model("v", mode="hot"))
    assert up_again(r, "--simulate") == 0
    assert r.events("reconcile")[0]["detail"] == {"held_back": {}, "started": ["v"]}
    assert r.status()["v"]["state"] == "RUNNING"
