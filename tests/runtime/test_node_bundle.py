"""A node's share of a stack with [nodes] runs like any stack: `umemc up STACK --node NAME --simulate` under
the real supervisord starts exactly the models placed on that node, with their quotas."""

from __future__ import annotations

import json

from tests.runtime.conftest import free_port, live_sysctl_table


def test_up_runs_only_the_models_placed_on_this_node(stack) -> None:  # type: ignore[no-untyped-def]
    def node(name: str) -> str:
        return f'\n[nodes.{name}]\nkind = "cpu"\nmemory = "4GiB"\nos_reserve = "1GiB"\n'

    def model(name: str, mib: int, priority: int) -> str:
        return (
            f'\n[models.{name}]\nruntime = "command"\ncommand = ["true"]\nmemory = "{mib}MiB"\n'
            f"priority = {priority}\nport = {free_port()}\n"
        )

    # budgets (4 - 1) GiB x 0.85 = 2611 MiB each: big (1500 -> 1650 MiB) goes to a, next (1200 -> 1320)
    # cannot join it (961 MiB left) and goes to b; tiny (60 -> 66) fits a with the least room left
    text = 'version = 1\nname = "pair"\n' + live_sysctl_table() + node("a") + node("b")
    text += model("big", 1500, 90) + model("next", 1200, 80) + model("tiny", 60, 10)
    r = stack(text, "--simulate", "--node", "a")
    plan = json.loads((r.run_dir / "bundle" / "plan.json").read_text())
    assert list(plan["models"]) == ["big", "tiny"]
    status = r.status()
    assert sorted(status) == ["big", "tiny"]
    assert {n: m["state"] for n, m in status.items()} == {"big": "RUNNING", "tiny": "RUNNING"}
    assert status["big"]["quota_hard_bytes"] == 1650 * 2**20
