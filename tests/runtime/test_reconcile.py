"""`umemc up` on a running stack: the same admission as the gateway (never over budget, never
evicting), umemc's own programs left alone when nothing they read changed, and a token set after a
failed start picked up. Real supervisord, real placeholder workers, the real gateway."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import patience
from tests.runtime.conftest import settled
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


def test_a_gateway_only_change_restarts_no_worker(stack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding token_env (and its token) and `up` again: the gateway takes the token, the hot worker keeps its
    process (its command never names the token: the wrapper reads the name from the run's state)."""
    r = stack(stack_text("rc-gwonly", model("w", mode="hot"), slots=1), "--simulate")
    before = r.status()["w"]["pid"]
    monkeypatch.setenv("UMEMC_RC_GW_TOKEN", "gw-token")
    stack_file = tmp_path / "stack.toml"
    stack_file.write_text(stack_file.read_text().replace("[gateway]\n", '[gateway]\ntoken_env = "UMEMC_RC_GW_TOKEN"\n'))
    assert up_again(r, "--simulate") == 0
    gw = Gateway(r)
    assert gw.call("GET", "/v1/models")[0] == 401
    assert gw.call("GET", "/v1/models", headers={"Authorization": "Bearer gw-token"})[0] == 200
    assert r.status()["w"]["pid"] == before  # the same process: not restarted


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
    settled(r)
    assert r.status()["v"]["state"] == "RUNNING"


def test_up_again_with_changed_models_keeps_the_gateway_and_the_enforcer(stack: Any, tmp_path: Path) -> None:
    """A plan that changes only its models is taken on in place (SIGHUP): the gateway and the enforcer keep
    running, each says so in an event naming what it added, changed and removed, and `up` returns once both
    say they run the new plan: the added model is served at once, the removed one is no longer routed."""
    w, c = model("w", mode="hot"), model("c", priority=40)
    r = stack(stack_text("rc-models", w + c, slots=3), "--simulate")
    gw = Gateway(r)
    assert gw.complete("w")[0] == 200
    before = own_pids(r)
    path = tmp_path / "stack.toml"
    path.write_text(path.read_text().replace(c, "").replace("priority = 50", "priority = 60") + model("v", mode="hot"))
    assert up_again(r, "--simulate") == 0
    assert own_pids(r) == before  # neither was restarted
    adopted = sorted((e["detail"]["by"], e["detail"]) for e in r.events("plan_adopted"))
    expected = {"added": ["v"], "changed": ["w"], "removed": ["c"]}
    assert adopted == [("enforcer", {"by": "enforcer", **expected}), ("gateway", {"by": "gateway", **expected})]
    assert [m["id"] for m in gw.call("GET", "/v1/models")[2]["data"]] == ["w", "v"]
    assert gw.complete("v")[0] == 200
    status, _, body = gw.complete("c")
    assert (status, body["error"]["message"]) == (404, "model 'c' is not in this stack (known: v, w)")
    enforcer = json.loads((r.run_dir / "state" / "enforcer.json").read_text())
    assert sorted(enforcer["models"]) == ["v", "w"]
    plan = (r.run_dir / "bundle" / "plan.json").read_bytes()
    gateway_state = json.loads((r.run_dir / "state" / "gateway.json").read_text())
    assert enforcer["plan_sha256"] == gateway_state["plan_sha256"] == hashlib.sha256(plan).hexdigest()


def test_what_changed_for_umemc_own_programs(tmp_path: Path) -> None:
    """Models alone: taken on in place; the gateway's settings, the policy or the token: a restart."""
    from umemc.budget.plan import make_plan
    from umemc.commands.build import build
    from umemc.runtime.reconcile import Change, what_changed
    from umemc.stack.resolve import load_stack

    def plan(models: str, gateway: str = "") -> bytes:
        (tmp_path / "stack.toml").write_text(stack_text("rc-what", models, slots=3, gateway=gateway, port=10998))
        build(make_plan(load_stack(tmp_path / "stack.toml")), tmp_path / "bundle")
        return (tmp_path / "bundle" / "plan.json").read_bytes()

    w, c = model("w", mode="hot"), model("c")
    first = plan(w)
    assert what_changed((first, b"t"), (first, b"t")) is Change.NONE
    assert what_changed((first, b"t"), (plan(w + c), b"t")) is Change.MODELS
    assert what_changed((first, b"t"), (plan(w.replace("priority = 50", "priority = 70")), b"t")) is Change.MODELS
    assert what_changed((first, b"t"), (plan(w, gateway="queue = 7\n"), b"t")) is Change.ALL
    assert what_changed((first, b"t"), (first, b"new token")) is Change.ALL
    assert what_changed((first, None), (first, b"t")) is Change.ALL
    assert what_changed((None, None), (first, None)) is Change.ALL
    assert what_changed((b"{not json", None), (first, None)) is Change.ALL
