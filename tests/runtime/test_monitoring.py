"""Kill metrics and the shipped alert rules and dashboard, against a real stack: a leaker the enforcer kills
twice and gives up on, a slow climber, a worker over its estimate. /metrics must count exactly what the event
log holds, and every series docs/monitoring/ queries must be one the gateway really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.conftest import free_port, worker
from tests.runtime.test_enforcement import base
from tests.runtime.test_gateway import Gateway
from umemc.runtime.supervisor import Supervisor

MiB = 2**20
MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"


def scrape(gw: Gateway) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], set[str]]:
    """Samples by (name, sorted labels), and every sample name the scrape declared a family for."""
    status, _, text = gw.call("GET", "/metrics")
    assert status == 200
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_count", "_sum"))
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, names


# The rule-file format as Prometheus documents it (configuration/alerting_rules and recording_rules): groups of
# named rules, each an alert with expr, optional for/keep_firing_for durations, string labels and annotations.
DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
RULE_FILE = {
    "type": "object",
    "required": ["groups"],
    "additionalProperties": False,
    "properties": {
        "groups": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "rules"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "interval": DURATION,
                    "rules": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["alert", "expr"],
                            "additionalProperties": False,
                            "properties": {
                                "alert": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                                "expr": {"type": "string", "minLength": 1},
                                "for": DURATION,
                                "keep_firing_for": DURATION,
                                "labels": STRINGS,
                                "annotations": STRINGS,
                            },
                        },
                    },
                },
            },
        }
    },
}


def queried(expr: str) -> set[str]:
    return set(re.findall(r"\bumemc_[a-z_]+", expr))


def test_kill_metrics_count_what_the_event_log_holds(stack: Any) -> None:
    r = stack(
        base("off", 'quota_headroom = 0.5\nleak_window = "3s"\nleak_threshold = "100MiB"\n')
        + worker("leaker", "leaker.py", 1024, 8, memory="270MiB", priority=10, mode="cold")
        + worker("slow", "leaker.py", 10, 2, 120, memory="300MiB", priority=20)
        + worker("fat", "steady.py", "{port}", 110, memory="100MiB", priority=50, port=free_port())
    )
    Supervisor(r.run_dir / "state" / "supervisor.sock").start("leaker")
    r.wait_for(lambda: r.events("give_up", "leaker"), timeout=60, what="the enforcer to give up on the leaker")
    r.wait_for(lambda: r.events("leak_suspected", "slow"), timeout=30, what="leak_suspected")
    r.wait_for(lambda: r.events("estimate_drift", "fat"), timeout=30, what="estimate_drift")
    gw = Gateway(r)
    rate = r.wait_for(
        lambda: scrape(gw)[0].get(("umemc_model_leak_rate_bytes_per_second", (("model", "slow"),))),
        timeout=30,
        what="a leak rate for slow (10 s of samples)",
    )
    samples, _ = scrape(gw)
    kills = len(r.events("hard_limit_kill", "leaker"))
    assert kills == 2  # max_kills = 2, then the give-up
    assert samples[("umemc_hard_limit_kills_total", (("by", "enforcer"), ("model", "leaker")))] == kills
    assert samples[("umemc_give_ups_total", (("model", "leaker"),))] == 1.0
    assert samples[("umemc_leaks_suspected_total", (("model", "slow"),))] == len(r.events("leak_suspected", "slow"))
    assert samples[("umemc_estimate_drift_events_total", (("model", "fat"),))] == 1.0
    assert ("umemc_hard_limit_kills_total", (("by", "enforcer"), ("model", "slow"))) not in samples
    assert isinstance(rate, float) and 5 * MiB <= rate <= 15 * MiB, rate  # it climbs 10 MiB/s
    live = json.loads((r.run_dir / "state" / "enforcer.json").read_text())["models"]["fat"]["drift"]
    assert samples[("umemc_model_estimate_drift_ratio", (("model", "fat"),))] == live > 0.05
    for process in ("enforcer", "gateway"):
        assert samples[("umemc_process_resident_bytes", (("process", process),))] > 10 * MiB


def test_alert_rules_and_dashboard_query_only_exported_series(stack: Any) -> None:
    r = stack(base("off") + worker("w", "steady.py", "{port}", 20, memory="64MiB", port=free_port()))
    gw = Gateway(r)
    assert gw.call("POST", "/umemc/leases", {"holder": "t", "bytes": "1MiB"})[0] == 201
    _, names = scrape(gw)

    rules = yaml.safe_load((MONITORING / "umemc.rules.yml").read_text())
    jsonschema.validate(rules, RULE_FILE)
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert len(alerts) >= 8 and all({"alert", "expr", "labels", "annotations"} <= set(a) for a in alerts)
    assert len({a["alert"] for a in alerts}) == len(alerts)
    assert all(a["labels"]["severity"] in ("info", "warning", "critical") for a in alerts)

    board = json.loads((MONITORING / "grafana-umemc.json").read_text())
    targets = [t for panel in board["panels"] for t in panel.get("targets", [])]
    assert len(targets) >= 12 and len({p["id"] for p in board["panels"]}) == len(board["panels"])

    used = set().union(*(queried(a["expr"]) for a in alerts), *(queried(t["expr"]) for t in targets))
    assert used - names == set(), "queried but never exported"
    # and the series the operator most needs are alerted on, not only drawn
    alerted = set().union(*(queried(a["expr"]) for a in alerts))
    assert {"umemc_hard_limit_kills_total", "umemc_give_ups_total", "umemc_pressure"} <= alerted
