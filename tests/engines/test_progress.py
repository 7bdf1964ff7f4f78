"""The phases of a vLLM start as the gateway says them to a request that waits for it, read from a real vLLM start's
log (tests/recorded/vllm-cpu-start.log): the log as it stood at each moment is its first lines, and the phase the
gateway says is the last one begun by then."""

from __future__ import annotations

from pathlib import Path

from umemc.runtime.gateway.progress import load_step

LOG = Path(__file__).resolve().parents[1] / "recorded" / "vllm-cpu-start.log"


def test_each_phase_of_a_vllm_start_is_said_as_it_begins(tmp_path: Path) -> None:
    lines = LOG.read_text().splitlines(keepends=True)
    log = tmp_path / "vllm.err.log"
    said = []
    for n in range(len(lines) + 1):
        log.write_text("".join(lines[:n]))
        step = load_step(log, 0)
        if not said or said[-1] != step:
            said.append(step)
    assert said == [
        None,
        "starting its engine",
        "loading weights",
        "allocating the KV cache",
        "KV cache allocated",
        "starting its API server",
    ]
