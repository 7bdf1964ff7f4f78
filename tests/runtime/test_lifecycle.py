"""up/down/status/events end to end: --simulate on the bundled 16 GB example, preflight refusal
and --skip, idempotent up (reconcile) and down, stale state from a crash, the pressure guard."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import patience
from tests.runtime.conftest import REPO, free_port, live_sysctl_table, settled, worker
from umemc.cli import main
from umemc.runtime.preflight import read_sysctl

# `umemc status --json`: the contract's keys per model, first and in this order
CONTRACT_KEYS = ["state", "pid", "rss_bytes", "gpu_bytes", "quota_soft_bytes", "quota_hard_bytes", "restarts"]

MiB = 2**20


def on_free_ports(text: str) -> tuple[str, dict[str, int]]:
    """A bundled example with every model and the gateway on a free port (a running stack may hold the
    defaults); the ports by model."""
    import re

    ports: dict[str, int] = {}

    def add(m: re.Match[str]) -> str:
        ports[m.group(1)] = free_port()
        return f"{m.group(0)}\nport = {ports[m.group(1)]}"

    text = re.sub(r"^\[models\.([a-z0-9_-]+)\]$", add, text, flags=re.M)
    return text + f"\n[gateway]\nport = {free_port()}\n", ports


def test_simulate_small_16g_end_to_end(stack, capsys) -> None:
    text, ports = on_free_ports((REPO / "examples/small-16g.toml").read_text())
    # its hot set holds most of its 16 GiB: its VM tunables matter, and this machine's are not the example's
    r = stack(text, "--simulate", "--skip", "sysctl")
    status = r.status()
    assert [status[n]["state"] for n in ("chat", "embed", "speech")] == ["RUNNING", "RUNNING", "STOPPED"]
    for name in ("chat", "embed"):  # the placeholder really holds its soft quota, just under it
        r.wait_for(
            lambda n=name: r.status()[n]["rss_bytes"] > 0.97 * r.status()[n]["quota_soft_bytes"],
            what=f"{name} to be sampled",
        )
        m = r.status()[name]
        assert m["rss_bytes"] <= m["quota_soft_bytes"]
    capsys.readouterr()
    assert r.cli("status", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc)[0] == "models"  # the contract first; everything the table shows follows
    assert list(doc["models"]["chat"])[:7] == CONTRACT_KEYS
    assert r.cli("events", "--json") == 0
    events = json.loads(capsys.readouterr().out)
    assert [e["kind"] for e in events[:2]] == ["up", "enforcer_start"]
    assert {e["model"] for e in events if e["kind"] == "start"} == {"chat", "embed"}
    assert set(events[0]) == {"time", "model", "kind", "detail"}
    # a request to the placeholder answers like the runtime would
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", ports["chat"], timeout=patience(5))
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "chat", "messages": []}))
    reply = json.loads(conn.getresponse().read())
    assert reply["choices"][0]["message"]["content"] == "(simulated reply from chat)"


def test_preflight_refuses_a_wrong_sysctl_where_it_matters_then_skip(stack, capsys) -> None:
    """A hot set of half the machine's memory or more (990 MiB of 1.5 GiB usable: 900 MiB and its 10% headroom):
    the VM tunables matter, one short of the plan refuses the start, `--skip sysctl` starts it anyway."""
    live = int(read_sysctl("vm.min_free_kbytes"))
    wrong = live + 1024  # the plan asks for a larger free-memory reserve than the machine keeps
    text = (
        'version = 1\nname = "pf"\n[platform]\nkind = "cpu"\nmemory = "2GiB"\nos_reserve = "512MiB"\n'
        + live_sysctl_table(vm_min_free_kbytes=wrong)
        + worker("w", "steady.py", "{port}", 5, memory="900MiB", port=free_port())
    )
    stack(text, expect=1)
    out, err = capsys.readouterr()
    assert f"    FAIL  sysctl: vm.min_free_kbytes is {live}, the plan needs at least {wrong}" in out
    assert f"          or now, until the next boot: sudo sysctl -w vm.min_free_kbytes={wrong}" in out
    assert err == "umemc up: preflight refused: 1 problem, 1 fix above; fix them, or start anyway with --skip sysctl\n"
    r = stack(text, "--skip", "sysctl")
    out, _ = capsys.readouterr()
    assert f"    warn  sysctl: vm.min_free_kbytes is {live}, the plan needs at least {wrong}" in out
    assert "starting despite the preflight's sysctl (--skip)" in out
    assert r.status()["w"]["state"] == "RUNNING"


def test_a_small_stack_starts_beside_untuned_vm_settings(stack, capsys) -> None:
    """64 MiB on an 8 GiB machine: the same setting short of the plan is a warning with its fix, and it starts."""
    live = int(read_sysctl("vm.min_free_kbytes"))
    text = (
        'version = 1\nname = "pfs"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        + live_sysctl_table(vm_min_free_kbytes=live + 1024)
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
    )
    r = stack(text)
    out, _ = capsys.readouterr()
    assert f"    warn  sysctl: vm.min_free_kbytes is {live}, the plan needs at least {live + 1024} (this stack's" in out
    assert r.status()["w"]["state"] == "RUNNING"


def test_up_twice_reconciles_and_down_twice_is_fine(stack, capsys, tmp_path: Path) -> None:
    port = free_port()
    text = (
        'version = 1\nname = "idem"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        + live_sysctl_table()
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=port)
        + worker("c", "steady.py", "{port}", 5, memory="64MiB", port=free_port(), mode="cold")
    )
    r = stack(text)
    pid = r.status()["w"]["pid"]
    from umemc.runtime.supervisor import Supervisor

    sup = Supervisor(r.run_dir / "state" / "supervisor.sock")
    sup.stop("w")  # someone stopped a hot worker
    capsys.readouterr()
    assert main(["up", str(tmp_path / "stack.toml"), "--run-dir", str(r.run_dir)]) == 0
    out, _ = capsys.readouterr()
    assert "stack idem is already running: reconciling" in out
    settled(r)  # `up` returns once it answers its health; RUNNING is supervisord's word 5 s after the start
    assert r.status()["w"]["state"] == "RUNNING" and r.status()["w"]["pid"] != pid
    assert r.status()["c"]["state"] == "STOPPED"  # cold stays cold
    assert r.events("reconcile")[0]["detail"] == {"started": ["w"], "held_back": {}}
    assert r.cli("down") == 0
    capsys.readouterr()
    assert r.cli("down") == 0
    assert capsys.readouterr().out == "stack idem is not running\n"


def test_stale_pid_file_and_socket_are_cleaned(stack, capsys, tmp_path: Path) -> None:
    text = (
        'version = 1\nname = "stale"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        + live_sysctl_table()
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
    )
    r = stack(text)
    assert r.cli("down") == 0
    state = r.run_dir / "state"
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # a pid that surely is not running
    (state / "supervisord.pid").write_text(f"{dead}\n")
    (state / "supervisor.sock").write_text("")
    capsys.readouterr()
    assert main(["up", str(tmp_path / "stack.toml"), "--run-dir", str(r.run_dir)]) == 0
    assert (
        "found state left by a crashed run (pid file or socket without supervisord): cleaned" in capsys.readouterr().out
    )
    settled(r)
    assert r.status()["w"]["state"] == "RUNNING"


def test_pressure_guard_evicts_lowest_priority_first(stack, tmp_path: Path) -> None:
    go = tmp_path / "go"  # the leakers grow once `up` has returned: the gateway answers by then
    text = (
        'version = 1\nname = "press"\n[platform]\nkind = "cpu"\nmemory = "1400MiB"\nos_reserve = "100MiB"\n'
        '[policy]\nsafety_margin = 0.0\nkernel_enforcement = "off"\nevict_above = 0.5\nload_below = 0.4\n'
        + live_sysctl_table()
        + worker("low", "leaker.py", 100, 2, 340, go, memory="400MiB", priority=10)
        + worker("mid", "leaker.py", 100, 2, 340, go, memory="400MiB", priority=50)
        + worker("high", "steady.py", free_port(), 80, memory="150MiB", priority=90)
    )
    r = stack(text)
    go.write_text("")
    evicted = r.wait_for(lambda: r.events("evict"), timeout=30, what="an eviction")
    assert evicted[0]["model"] == "low"
    assert evicted[0]["detail"]["pressure"] > 0.5
    assert (evicted[0]["detail"]["by"], evicted[0]["detail"]["reason"]) == ("gateway", "pressure")  # it owns stops
    r.wait_for(lambda: r.status()["mid"]["rss_bytes"] > 330 * MiB, timeout=30, what="mid to finish growing")
    import time

    grown = time.time()  # the enforcer's next status write comes after ~10 pressure checks at mid's full size
    published = r.run_dir / "state" / "enforcer.json"
    r.wait_for(lambda: json.loads(published.read_text())["time"] > grown + 0.5, what="the enforcer to look again")
    assert [e["model"] for e in r.events("evict")] == ["low"]  # below load_below after one eviction
    status = r.status()
    assert (status["low"]["state"], status["mid"]["state"], status["high"]["state"]) == (
        "STOPPED",
        "RUNNING",
        "RUNNING",
    )


def test_without_a_gateway_the_enforcer_evicts_alone(stack) -> None:
    text = (
        'version = 1\nname = "press-alone"\n[platform]\nkind = "cpu"\nmemory = "1400MiB"\nos_reserve = "100MiB"\n'
        '[policy]\nsafety_margin = 0.0\nkernel_enforcement = "off"\nevict_above = 0.5\nload_below = 0.4\n'
        + live_sysctl_table()
        + "[gateway]\nenabled = false\n"
        + worker("low", "leaker.py", 100, 2, 340, 6, memory="400MiB", priority=10)
        + worker("mid", "leaker.py", 100, 2, 340, 6, memory="400MiB", priority=50)
    )
    r = stack(text)
    evicted = r.wait_for(lambda: r.events("evict"), timeout=30, what="an eviction")
    assert (evicted[0]["model"], evicted[0]["detail"]["by"]) == ("low", "enforcer")


@pytest.mark.parametrize("arg", ["--json", ""])
def test_status_without_a_stack(tmp_path: Path, run_cli, arg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UMEMC_STATE_HOME", str(tmp_path / "state-home"))  # no stack recorded
    args = ["status", "--run-dir", str(tmp_path / "none")] + ([arg] if arg else [])
    assert run_cli(*args) == (
        2,
        "",
        f"no stack in {tmp_path / 'none'}, and none runs (`umemc up STACK` starts one)\n",
    )


def test_stacks_are_known_by_name_from_anywhere(stack, run_cli, tmp_path: Path, monkeypatch, capsys) -> None:
    """`up` records the stack in the user's state dir: `ps` lists it from any directory, `status`, `events` and
    `logs` find it by its name, `down NAME` stops it and `ps` forgets it."""
    home = tmp_path / "state-home"
    monkeypatch.setenv("UMEMC_STATE_HOME", str(home))
    port = free_port()
    r = stack(
        'version = 1\nname = "named"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        + live_sysctl_table()
        + f"[gateway]\nport = {port}\n"
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
        + '\n[models.c]\nruntime = "command"\ncommand = ["true"]\nmemory = "16MiB"\nmode = "cold"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no run dir here or above
    capsys.readouterr()  # what up said
    code, out, _ = run_cli("ps", "--json")
    assert code == 0
    assert json.loads(out) == [
        {
            "name": "named",
            "run_dir": str(r.run_dir),
            "stack_file": str(tmp_path / "stack.toml"),
            "gateway": f"http://127.0.0.1:{port}/v1",
            "state": "running",
            "models": {"w": "hot", "c": "cold"},
        }
    ]
    assert (home / "runs" / "named.json").stat().st_mode & 0o777 == 0o600
    code, out, _ = run_cli("status", "named", "--json")
    assert code == 0 and json.loads(out)["models"]["w"]["state"] == "RUNNING"
    code, out, _ = run_cli("events", "named", "--json")
    assert code == 0 and [e["kind"] for e in json.loads(out)][:1] == ["up"]
    assert run_cli("logs", "umemc-enforcer", "--stack", "named")[0] == 0
    assert run_cli("status", "other") == (
        2,
        "",
        "no running stack named 'other' (running: named; `umemc ps` lists them)\n",
    )
    assert run_cli("status", "--run-dir", str(elsewhere)) == (
        2,
        "",
        f"no stack in {elsewhere}; running: named ({r.run_dir}): name one (`umemc status NAME`)\n",
    )
    code, out, _ = run_cli("down", "named")
    assert code == 0 and out.startswith("down: named stopped (")
    assert run_cli("ps") == (0, "no stack runs (`umemc up STACK` starts one)\n", "")


def test_observing_a_running_stack(stack, capsys) -> None:
    """top (a snapshot off a terminal, `q` quits on one), logs, events filters, status --json."""
    r = stack(
        'version = 1\nname = "top"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        + live_sysctl_table()
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
    )
    capsys.readouterr()
    assert r.cli("top") == 0  # stdout is captured, not a terminal: one snapshot
    out = capsys.readouterr().out
    assert "umemc top: running" in out and " w " in out and "RUNNING" in out

    import pty
    import select
    import subprocess

    leader, follower = pty.openpty()
    top = subprocess.Popen(
        [sys.executable, "-m", "umemc", "top", "--run-dir", str(r.run_dir), "--interval", "0.2"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "COLUMNS": "160"},
    )
    os.close(follower)
    seen = b""
    try:
        while b"RUNNING" not in seen:
            ready, _, _ = select.select([leader], [], [], 30)
            assert ready, f"top printed nothing: {seen!r}"
            seen += os.read(leader, 65536)
        os.write(leader, b"q")
        assert top.wait(timeout=10) == 0
    finally:
        top.kill()
        top.wait()
        os.close(leader)

    r.wait_for(lambda: (r.run_dir / "state/logs/w.err.log").read_text(), what="the worker's stderr")
    capsys.readouterr()
    assert r.cli("logs", "w") == 0
    lines = capsys.readouterr().out.splitlines()
    port = json.loads((r.run_dir / "bundle/plan.json").read_text())["models"]["w"]["port"]
    assert lines == [f"out| steady: holding 5 MiB, serving on {port}", "err| steady: ready"]
    assert r.cli("logs", "nope") == 2
    assert "no logs for 'nope'" in capsys.readouterr().err

    assert r.cli("events", "--json", "--model", "w", "--kind", "start") == 0
    events = json.loads(capsys.readouterr().out)
    assert events and {(e["model"], e["kind"]) for e in events} == {("w", "start")}
    assert r.cli("events", "--json", "--since", "2h") == 0
    assert {e["kind"] for e in json.loads(capsys.readouterr().out)} >= {"up", "start"}
    assert r.cli("events", "--json", "--since", "2999-01-01T00:00:00") == 0
    assert json.loads(capsys.readouterr().out) == []
    assert r.cli("events", "--since", "yesterday") == 2
    assert capsys.readouterr().err == (
        '--since \'yesterday\': not a duration ("10m", "2h") or an ISO-8601 time ("2026-12-01T05:00:00")\n'
    )
    assert r.cli("events", "--kind", "hard_kill") == 2  # a filter that can never match is a typo
    assert capsys.readouterr().err == "--kind 'hard_kill': no such event kind (did you mean 'hard_limit_kill'?)\n"
    assert r.cli("events", "--model", "nope") == 2
    assert capsys.readouterr().err == "--model 'nope': not a model of this stack (models: w)\n"

    assert r.cli("status", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == [
        "models",
        "stack",
        "running",
        "pressure",
        "gateway",
        "leases",
        "generation",
        "orphans",
        "problems",
        "rehearsal",
        "machine",
        "nodes",  # a stack of several nodes: the other nodes' models (none here)
    ]
    assert doc["nodes"] == {}
    w = doc["models"]["w"]
    assert list(w)[:7] == CONTRACT_KEYS
    assert set(w) - set(list(w)[:7]) == {
        "uptime_s",
        "last_event",
        "last_event_text",
        "priority",
        "mode",
        "drift",
        "reserved_bytes",
        "allowance_bytes",
        "requests",
        "health",
        "tokens_per_s",
        "enforced_by",
        "swapped_bytes",
        "resident_bytes",
        "held_beyond_bytes",
        "gpu_visible",
    }
    assert w["gpu_visible"] is None  # a cpu stack: no NVIDIA figure to see or miss
    assert (doc["stack"], doc["running"], w["mode"], w["priority"]) == ("top", True, "hot", 50)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["stack", "bundle"])
def test_deep_run_dir_runs_with_a_private_socket(tmp_path: Path, target: str) -> None:
    """The socket of a run dir too deep for a unix socket path is given to supervisord from outside the
    bundle: a prebuilt bundle is copied byte for byte, never edited."""
    stack = tmp_path / "stack.toml"
    stack.write_text(
        'version = 1\nname = "deep"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        + live_sysctl_table()
        + worker("w", "steady.py", "{port}", 5, memory="64MiB", port=free_port())
        + f"[gateway]\nport = {free_port()}\n"
    )
    source = tmp_path / "built"
    if target == "bundle":
        assert main(["build", str(stack), "-o", str(source)]) == 0
    run = tmp_path / ("d" * 60) / ("e" * 60) / "run"
    code = main(
        ["up", str(stack if target == "stack" else source), "--run-dir", str(run), "--timeout", str(patience(60))]
    )
    try:  # a failed up still leaves down to stop whatever it started
        assert code == 0
        sock = Path((run / "state" / "socket").read_text().strip())
        assert sock.exists() and len(str(sock)) <= 107
        conf = (run / "bundle" / "supervisord.conf").read_text()
        assert "file=%(ENV_UMEMC_SUPERVISOR_SOCKET)s\n" in conf
        if target == "bundle":
            for f in ("supervisord.conf", "plan.json"):
                assert (run / "bundle" / f).read_bytes() == (source / f).read_bytes()
        from tests.runtime.conftest import Running

        settled(Running(run))
        assert Running(run).status()["w"]["state"] == "RUNNING"
    finally:
        assert main(["down", "--run-dir", str(run)]) == 0
    assert not sock.parent.exists() and not (run / "state" / "socket").exists()


def test_up_refuses_a_stack_that_does_not_fit(stack, capsys) -> None:
    text = (
        'version = 1\nname = "big"\n[platform]\nkind = "cpu"\nmemory = "1GiB"\n'
        + live_sysctl_table()
        + worker("w", "steady.py", "{port}", 5, memory="2GiB", port=free_port())
    )
    stack(text, expect=1)
    out, err = capsys.readouterr()
    assert "  fix 1: umemc check STACK  # says what would make it fit" in out
    assert "    FAIL  budget: the hot set does not fit its budget (over by 1.5 GiB)" in out
    assert err == "umemc up: preflight refused: 1 problem, 1 fix above; fix them, or start anyway with --skip budget\n"


def test_a_128gb_stack_rehearsed_at_a_twentieth_of_its_size(stack, capsys, run_cli) -> None:
    """The Strix Halo 128 GB example on this machine: every quota and the machine's memory times 0.05, the same
    decisions as the full-size report (its cold admissions: code evicts image and vision), said everywhere."""
    from tests.runtime.test_gateway import Gateway

    text, _ = on_free_ports((REPO / "examples/strix-halo-5.toml").read_text())
    _, out, _ = run_cli("check", str(REPO / "examples/strix-halo-5.toml"), "--format", "json")
    full = json.loads(out)
    r = stack(text, "--simulate", "--scale", "0.05", "--skip", "sysctl")  # the example's VM tunables are not ours
    plan = json.loads((r.run_dir / "bundle" / "plan.json").read_text())
    assert plan["scale"] == 0.05
    mib = 2**20

    def ceil_div(a: int, b: int) -> int:
        return (a + b - 1) // b

    for name, m in full["models"].items():  # hard quotas: the full size's times 0.05, up to a whole MiB
        assert plan["models"][name]["quota_hard_bytes"] == ceil_div(ceil_div(m["quota_hard_bytes"] * 5, 100), mib) * mib
    assert plan["capacity"]["budget_bytes"] == full["capacity"]["budget_bytes"] * 5 // 100
    capsys.readouterr()
    assert r.cli("status") == 0
    assert (
        "rehearsal: placeholders at 0.05 of the size (every quota and the machine times 0.05)"
        in capsys.readouterr().out
    )
    assert [e["detail"]["scale"] for e in r.events("up")] == [0.05]
    gw = Gateway(r)
    assert gw.status()["rehearsal"] == {"scale": 0.05}
    status, _, body = gw.complete("code")  # cold: at full size it evicts image and vision
    assert status == 200, body
    assert sorted(e["model"] for e in r.events("evict")) == sorted(full["cold_admission"]["code"]["evicts"])


def test_a_scale_too_small_for_a_placeholder_is_refused(tmp_path: Path, run_cli) -> None:
    code, _, err = run_cli(
        "up",
        str(REPO / "examples/strix-halo-5.toml"),
        "--simulate",
        "--scale",
        "0.01",
        "--run-dir",
        str(tmp_path / "r"),
    )
    assert code == 2
    assert err == (
        "umemc up: at --scale 0.01 speech (3.85 GiB) would hold 39.43 MiB, less than a placeholder process needs for "
        "itself (64.00 MiB): use --scale 0.016 or more\n"
    )
