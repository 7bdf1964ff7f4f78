"""The advice stage, above budget, run only for a stack that does not fit: the decisive fact first (a
model that alone exceeds the budget), then the smallest changes that make the whole stack fit, each
computed by re-estimating the stack with that one change; when no single change is enough, the
changes that save the most. With nodes: why each unplaced model fits nowhere, then each node's own."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from ..catalog.quant import FILE_TYPE_BITS, quantized_kv
from ..catalog.runtimes import LLAMA_RUNTIMES
from ..estimate.estimator import estimate_model
from ..stack.resolved import LoadedStack
from ..units import gib
from .plan import ModelPlan, Plan, model_plan

# lower quantizations to try for a model estimated from an architecture preset, mildest first: the k-quants and
# the importance-matrix types published GGUF repositories carry (bits per weight falling)
QUANT_LADDER = (
    "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "IQ3_M", "Q2_K", "IQ3_XXS", "IQ2_M", "IQ2_XS",
    "IQ2_XXS", "IQ1_M",
)  # fmt: skip
MIN_CONTEXT = 2048
COLD = 3
QUALITY = 4  # a lower quantization changes the model's answers: suggested after every other change
SHOWN = 5


class Change(NamedTuple):
    model: str
    text: str
    rank: int  # how intrusive: KV type, mmap < context < cold < quantization (it changes the answers)
    saved: int  # hard quota (all memory) freed
    saved_gpu: int


def advise(loaded: LoadedStack, plan: Plan) -> Plan:
    """The plan with its advice: unchanged (nothing re-estimated) when it fits."""
    if plan.fits:
        return plan
    if not plan.nodes:
        return replace(plan, advice=tuple(advice(loaded, plan)))
    nodes = {name: advise(loaded.for_node(name, list(p.models)), p) for name, p in plan.nodes.items()}
    assert plan.placement is not None
    lines = [f"models.{n}: {why}" for n, why in plan.placement.unplaced.items()]
    for name, p in nodes.items():
        lines += [f"node {name}: {a}" for a in p.advice]
    return replace(plan, nodes=nodes, advice=tuple(lines))


def advice(loaded: LoadedStack, plan: Plan) -> list[str]:
    cap = plan.capacity
    lines = []
    if not plan.fits_ram:
        lines.append(
            f"does not fit: the hot set's hard quotas total {gib(plan.hot_total)} GiB, the budget is "
            f"{gib(cap.budget)} GiB (over by {gib(-plan.headroom)} GiB)"
        )
    gpu_over = -plan.gpu_headroom if plan.gpu_headroom is not None and plan.gpu_headroom < 0 else 0
    if gpu_over:
        lines.append(
            f"does not fit: the hot set needs {gib(plan.hot_gpu_total)} GiB of the GPU window, its budget is "
            f"{gib(cap.gpu_budget or 0)} GiB (over by {gib(gpu_over)} GiB)"
        )
    for m in plan.models.values():
        if m.hot and m.quota_hard > cap.budget:
            lines.append(
                f"model {m.name} alone ({gib(m.quota_hard)} GiB hard quota) exceeds the {gib(cap.budget)} GiB budget"
            )
    over, changes = max(0, -plan.headroom), _changes(loaded, plan)
    changes = [c for c in changes if c.rank != COLD or plan.models[c.model].quota_hard <= cap.budget]
    fitting = [c for c in changes if c.saved >= over and c.saved_gpu >= gpu_over]
    if not fitting:
        big = max((m for m in plan.models.values() if m.hot), key=lambda m: m.quota_hard)
        lines.append(_combined(loaded, plan, big, over, gpu_over))
    if fitting:
        best: dict[tuple[str, int], Change] = {}
        for c in sorted(fitting, key=lambda c: (c.rank, c.saved)):
            best.setdefault((c.model, c.rank), c)  # per model and knob, the mildest step that fits
        shown = sorted(best.values(), key=lambda c: (c.rank, c.saved))[:SHOWN]
        lines.append("smallest changes that fit (each alone, re-estimated):")
        lines += [f"  models.{c.model}: {c.text} frees {gib(c.saved)} GiB" for c in shown]
    elif changes:
        lines.append("no single change fits; these free the most:")
        most = sorted(changes, key=lambda c: -c.saved)[:SHOWN]
        lines += [f"  models.{c.model}: {c.text} frees {gib(c.saved)} GiB" for c in most]
    return lines


def _changes(loaded: LoadedStack, plan: Plan) -> list[Change]:
    out: list[Change] = []
    for m in plan.models.values():
        if not m.hot:
            continue
        spec = m.model.spec
        if any(p.name == "repacked copy" for p in m.estimate.weights.parts):
            out += _try(loaded, m, "mmap = false (no second copy of the repacked weights)", {"mmap": False}, 0)
        if spec.memory is None and spec.runtime in LLAMA_RUNTIMES and m.estimate.kv.bytes:
            if not quantized_kv(spec.kv_cache):
                fa = "" if spec.flash_attn else " with flash_attn = true"
                out += _try(loaded, m, f'kv_cache = "q8_0"{fa}', {"kv_cache": "q8_0", "flash_attn": True}, 0)
            context = spec.context // 2
            while context >= MIN_CONTEXT:
                out += _try(loaded, m, f"context = {context}", {"context": context}, 1)
                context //= 2
        if spec.memory is None and m.estimate.source == "arch" and spec.runtime in LLAMA_RUNTIMES:
            for q in lower_quants(m):
                out += _try(loaded, m, f'quant = "{q}"', {"quant": q}, QUALITY)
        out.append(Change(m.name, f'mode = "cold" (priority {m.priority})', COLD, m.quota_hard, m.gpu_quota_hard))
    return out


def lower_quants(m: ModelPlan) -> tuple[str, ...]:
    """The ladder's types below the model's quantization (fewer bits per weight), down to its floor."""
    ftype = str(m.estimate.facts.get("file type"))
    now = FILE_TYPE_BITS.get(ftype)
    if now is None or ftype == "MXFP4_MOE":  # experts trained in MXFP4: a k-quant of them saves next to nothing
        return ()
    floor = FILE_TYPE_BITS[quant_floor(m)]
    return tuple(q for q in QUANT_LADDER if floor <= FILE_TYPE_BITS[q] < now)


def quant_floor(m: ModelPlan) -> str:
    """The lowest quantization advice suggests: the model's min_quant, else by what it is. Embeddings and vision
    lose most (retrieval and detection quality fall off at 4 bits); a language model's tolerance grows with its
    size (a 200B mixture of experts is still useful at 2 bits, an 8B one hardly below 4)."""
    spec = m.model.spec
    if spec.min_quant is not None:
        return spec.min_quant.upper()
    family = m.estimate.facts.get("family")
    if family == "embedding":
        return "Q8_0"
    if family == "vision" or m.model.mmproj_path is not None:
        return "Q5_K_M"
    bits = FILE_TYPE_BITS.get(str(m.estimate.facts.get("file type")), 16.0)
    params = m.estimate.weights.bytes * 8 / bits
    return "IQ2_XXS" if params >= 100e9 else "IQ3_XXS" if params >= 25e9 else "Q3_K_M"


def _try(loaded: LoadedStack, m: ModelPlan, text: str, update: dict[str, object], rank: int) -> list[Change]:
    alt = m.model._replace(spec=m.model.spec.model_copy(update=update))
    if "quant" in update:
        alt = alt._replace(quant=str(update["quant"]))
    if "mmap" in update:
        alt = alt._replace(mmap=bool(update["mmap"]))
    new = model_plan(loaded, alt, estimate_model(loaded, alt))
    saved, saved_gpu = m.quota_hard - new.quota_hard, m.gpu_quota_hard - new.gpu_quota_hard
    return [Change(m.name, text, rank, saved, saved_gpu)] if saved > 0 else []


def _combined(loaded: LoadedStack, plan: Plan, m: ModelPlan, over: int, gpu_over: int) -> str:
    """The mildest combination of quantization, KV type and context that lets the largest model fit."""
    spec = m.model.spec
    if spec.memory is not None or spec.runtime not in LLAMA_RUNTIMES:
        fixed = f"models.{m.name}: its memory is fixed ({gib(m.quota_hard)} GiB hard quota)"
        return fixed + ": a bigger machine or fewer hot models"
    quants: list[str | None] = [None]
    if m.estimate.source == "arch":
        quants += list(lower_quants(m))
    kvs: list[str | None] = [None] + (["q8_0"] if not quantized_kv(spec.kv_cache) else [])
    contexts: list[int | None] = [None]
    half = spec.context // 2
    while half >= MIN_CONTEXT:
        contexts.append(half)
        half //= 2
    combos = [(q, k, c) for q in quants for k in kvs for c in contexts if (q, k, c) != (None, None, None)]
    combos.sort(key=lambda t: (sum(x is not None for x in t), quants.index(t[0]), contexts.index(t[2])))
    tried: list[tuple[str, dict[str, object]]] = []
    for q, k, c in combos:
        update: dict[str, object] = {}
        words: list[str] = []
        if q is not None:
            update["quant"] = q
            words.append(f'quant = "{q}"')
        if k is not None:
            update |= {"kv_cache": k, "flash_attn": True}
            words.append(f'kv_cache = "{k}"')
        if c is not None:
            update["context"] = c
            words.append(f"context = {c}")
        tried.append((", ".join(words), update))
    others = [o for o in plan.models.values() if o.hot and o.name != m.name]
    for cold in ([], others):  # first with the other hot models as they are, then with them all cold
        freed, freed_gpu = sum(o.quota_hard for o in cold), sum(o.gpu_quota_hard for o in cold)
        also = f"; and {', '.join(o.name for o in cold)} cold" if cold else ""
        for text, update in tried:
            for ch in _try(loaded, m, text, update, 4):
                if ch.saved + freed >= over and ch.saved_gpu + freed_gpu >= gpu_over:
                    hard, spare = gib(m.quota_hard - ch.saved), gib(ch.saved + freed - over)
                    return (
                        f"smallest change that fits: models.{m.name}: {ch.text} ({hard} GiB hard quota, "
                        f"{spare} GiB to spare){also}"
                    )
    why = "its min_quant" if spec.min_quant is not None else "min_quant lets advice go lower"
    tried_quants, now = lower_quants(m), m.estimate.facts.get("file type")
    floor = f" down to {tried_quants[-1]} ({why})" if tried_quants else f" below {now} ({why})"
    floor = floor if m.estimate.source == "arch" else ""
    return (
        f"models.{m.name}: no quantization{floor}, KV type or context umemc can try makes the stack fit: "
        "a smaller model, fewer hot models or a bigger machine"
    )
