"""The gateway's model lifecycle (umemc/runtime/gateway/lifecycle.py): the transitions the scheduler
makes are in the table, anything else is refused as a bug."""

from __future__ import annotations

import pytest

from umemc.runtime.gateway.lifecycle import IllegalTransition, Lifecycle, Phase

PATHS = {
    "cold start": [Phase.STARTING, Phase.READY],
    "failed start": [Phase.STARTING, Phase.DOWN],
    "found running by a poll": [Phase.READY],
    "evicted while idle": [Phase.READY, Phase.STOPPING, Phase.DOWN],
    "drained, then stopped": [Phase.READY, Phase.DRAINING, Phase.STOPPING, Phase.DOWN],
    "drain abandoned": [Phase.READY, Phase.DRAINING, Phase.READY],
    "stop failed": [Phase.READY, Phase.STOPPING, Phase.READY],
    "hung, then recovered": [Phase.READY, Phase.UNHEALTHY, Phase.READY],
    "hung, then crashed": [Phase.READY, Phase.UNHEALTHY, Phase.DOWN],
    "crashed while serving": [Phase.READY, Phase.DOWN],
}


@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
def test_the_scheduler_s_paths_are_allowed(path: list[Phase]) -> None:
    life = Lifecycle()
    for phase in path:
        life.to(phase, "test")
    assert life.phase is path[-1]


@pytest.mark.parametrize(
    "path,message",
    [
        ([Phase.DRAINING], "down -> draining (no reason given)"),
        ([Phase.STARTING, Phase.STOPPING], "starting -> stopping (no reason given)"),
        ([Phase.STARTING, Phase.UNHEALTHY], "starting -> unhealthy (no reason given)"),
        ([Phase.STOPPING, Phase.UNHEALTHY], "stopping -> unhealthy (no reason given)"),
    ],
)
def test_anything_else_is_a_bug(path: list[Phase], message: str) -> None:
    life = Lifecycle()
    with pytest.raises(IllegalTransition) as err:
        for phase in path:
            life.to(phase)
    assert str(err.value) == message


def test_serving_means_ready_or_draining() -> None:
    life = Lifecycle()
    seen = {}
    for phase in (Phase.STARTING, Phase.READY, Phase.DRAINING, Phase.STOPPING, Phase.DOWN):
        life.to(phase)
        seen[phase] = life.serving
    assert [p for p, serving in seen.items() if serving] == [Phase.READY, Phase.DRAINING]
