"""The last step of every estimate: the GPU-window share and the explicit override."""

from __future__ import annotations

from ..stack.resolve import LoadedStack, ResolvedModel
from .figures import Estimate, Figure


def finish(
    loaded: LoadedStack,
    m: ResolvedModel,
    source: str,
    weights: Figure,
    kv: Figure,
    compute: Figure,
    overhead: Figure,
    warnings: list[str],
    facts: dict[str, object],
) -> Estimate:
    if loaded.platform.kind == "cpu":
        gpu = Figure("gpu", 0, 'kind = "cpu": nothing in a GPU window')
    else:
        gpu = Figure(
            "gpu", weights.bytes + kv.bytes + compute.bytes, "weights + kv + compute: every layer offloaded (-ngl all)"
        )
    explicit = m.spec.memory
    if explicit is not None:
        source = "explicit"
        if loaded.platform.kind != "cpu":
            gpu = Figure("gpu", explicit, "explicit memory, all of it assumed to be in the GPU window")
    return Estimate(m.name, source, weights, kv, compute, overhead, gpu, explicit, facts, tuple(warnings))
