"""One model split by layers across nodes with llama.cpp's RPC backend, where no one node holds it whole.

The node that runs llama-server (the main node) keeps the input layer (token embeddings, always on its CPU) and a
run of blocks; every other node of the split runs an RPC server (`ggml-rpc-server`) that holds the blocks llama.cpp
sends it. Which device holds which block follows llama.cpp's own rule (src/llama-model.cpp, load_tensors): the
devices are the RPC servers in --rpc order, then the main node's own GPU; the last `-ngl` of the n_layer + 1 layers
(the blocks and the output layer) are spread over them in the proportions of `--tensor-split`, the rest stay on the
main node's CPU. umemc writes whole layer counts there, so block k of the offloaded run lands on device i exactly when
the counts of the devices before i sum to at most k and with i's to more than k. So:

- a main node of kind cpu holds the first blocks on its CPU; the helpers the blocks after, the last helper the
  output layer too;
- a main node with a GPU holds the last blocks on its GPU, and the output layer; the helpers the blocks before.

Each part's memory: its blocks' tensor bytes (the file's header, block by block), their KV cache (llama.cpp
allocates a layer's cache on its device: the KV formula per layer), one compute buffer (each device reserves its
own; the model's compute figure, which the widest layer sets, stands for each), and its process. The output layer
of a file without output.weight is its token embeddings again: llama.cpp copies them to the output's device.

The placement asks this after it has placed the whole models: a split model takes what they leave. Of the nodes
the model may use, the main node is the one with the most room (then the stack's order), and the fewest helpers
that hold the rest, roomiest first. With the order of the parts fixed, filling each part with as many blocks as
its room holds, in order, finds a split whenever one exists (a later part only ever gets fewer blocks to hold).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from ..catalog.runtimes import holds_gpu_device
from ..estimate.figures import Estimate, Figure
from ..estimate.gguf_file import GgufFacts
from ..estimate.llm import kv_by_layer
from ..estimate.overhead import GPU_CONTEXT
from ..units import MiB

# ggml-rpc-server's resident memory beyond the buffers it holds (its binary, threads and the CPU backend), measured
# on CPU with the llama.cpp the tests build: 5.2 MiB resident before its first client
RPC_SERVER_BASE = 8 * MiB
RPC_PROGRAM = "ggml-rpc-server"  # the binary (llama.cpp's tools/rpc, built with -DGGML_RPC=ON)
Quota = Callable[[int], int]  # a part's hard quota from its estimate (the stack's quota_headroom)


class Room(NamedTuple):
    node: str
    ram: int  # budget left after the whole models (bytes, hard quotas)
    gpu: int | None  # GPU window left (None: the node has no GPU ledger)
    kind: str  # its platform kind
    address: str  # where the other nodes reach it
    port: int  # the port its RPC server for this model listens on
    devices: int | None = None  # GPU devices pods may still hold there (None: not counted)


class Part(NamedTuple):
    node: str
    first: int  # first block it holds
    blocks: int  # how many blocks it holds
    input: bool  # the token embeddings (the main node)
    output: bool  # the output layer
    estimate: Estimate
    endpoint: str | None  # a helper: HOST:PORT of its RPC server (None: the main node)
    quota_hard: int = 0  # its hard quota on its node (estimate x (1 + quota_headroom))

    @property
    def holds(self) -> str:
        return holds(self.first, self.blocks, has_input=self.input, output=self.output)


def holds(first: int, count: int, *, has_input: bool, output: bool) -> str:
    """What a part holds, in words: 'blocks 0-9, the token embeddings'."""
    blocks = "no blocks" if not count else f"block {first}" if count == 1 else f"blocks {first}-{first + count - 1}"
    extra = (["the token embeddings"] if has_input else []) + (["the output layer"] if output else [])
    return ", ".join([blocks, *extra])


class Split(NamedTuple):
    model: str
    main: str
    n_layer: int
    gpu_main: bool  # the main node's part is on its GPU (else on its CPU)
    parts: tuple[Part, ...]  # in llama.cpp's layer order

    @property
    def helpers(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if p.endpoint is not None)

    @property
    def main_part(self) -> Part:
        return next(p for p in self.parts if p.endpoint is None)

    def args(self) -> list[str]:
        """llama-server's flags for the split: the RPC servers, the offloaded layers, and whole layer counts per
        device in its order (the RPC servers, then the main node's GPU)."""
        devices = [p for p in self.parts if p.endpoint is not None or self.gpu_main]
        counts = [p.blocks + int(p.output) for p in devices]
        ngl = sum(counts)
        rpc = ",".join(p.endpoint for p in self.helpers if p.endpoint is not None)
        return ["--rpc", rpc, "-ngl", str(ngl), "--tensor-split", ",".join(map(str, counts))]

    def said(self) -> str:
        """One line for the report: where each part is."""
        return "; ".join(f"{p.node}: {p.holds} ({p.estimate.estimate_bytes / MiB:.1f} MiB)" for p in self.parts)


class Serving(NamedTuple):
    """How the model runs: what sizes its KV cache, whether the main node maps the file (its part then holds the range
    its CPU's tensors span), and its `gpu` key (whether its pods hold a GPU device on a GPU node)."""

    context: int
    parallel: int
    ubatch: int
    kv_cache: str
    flash_attn: bool
    mmap: bool = False
    gpu: bool | None = None


def plan_split(
    name: str,
    whole: Estimate,
    facts: GgufFacts,
    rooms: Sequence[Room],
    quota: Quota,
    serving: Serving,
    *,
    on_node: Mapping[str, Estimate] | None = None,
    measured: dict[str, int] | None = None,
) -> Split | None:
    """The split of model NAME over the nodes of ROOMS (its allowed nodes, in the stack's order), or None where
    none holds it. `quota` turns a part's estimate into its hard quota (what the node's room is counted in; a GPU
    device where the model's pods hold one, counted in ROOMS' devices). `on_node`: the model as each node's kind
    estimates it (its process overhead, GPU context, compute and whether the CPU repacks; default: `whole`
    everywhere). `measured`: compute buffers llama.cpp's dry run gave with the helpers up (by endpoint, and
    "main"), which replace the model's figure for those parts."""
    shape = facts.shape
    assert shape is not None
    s = serving
    kv = kv_by_layer(shape, s.context, s.parallel, s.ubatch, s.kv_cache, swa_full=False, flash_attn=s.flash_attn)
    state = _state_by_layer(whole, kv)
    layers = [facts.layer_bytes[i] + kv[i] + state[i] for i in range(shape.n_layer)]
    input_bytes = facts.tensor_bytes - sum(facts.layer_bytes) - (0 if facts.tied else facts.output_bytes)
    costs = _Costs(
        name, whole, facts, kv, state, input_bytes, on_node=on_node or {}, measured=measured or {}, mmap=s.mmap
    )
    # a node whose GPU devices are all held cannot take a part at all (its pod would wait for one for ever)
    ranked = sorted((r for r in rooms if _device_free(r, s.gpu)), key=lambda r: -r.ram)
    for main in ranked:
        others = [r for r in ranked if r is not main]
        for n_helpers in range(1, len(others) + 1):
            helpers = others[:n_helpers]
            gpu_main = main.kind != "cpu"
            order = [*helpers, main] if gpu_main else [main, *helpers]
            got = _fill(order, main, layers, costs, quota)
            if got is not None:
                return Split(name, main.node, shape.n_layer, gpu_main, got)
    return None


def _state_by_layer(whole: Estimate, kv: list[int]) -> list[int]:
    """What the KV figure holds beyond the per-layer caches (a hybrid model's recurrent state), spread over the
    layers that keep one like the caches (in proportion)."""
    rest = whole.kv.bytes - sum(kv)
    if rest <= 0 or not sum(kv):
        return [0] * len(kv)
    total = sum(kv)
    return [rest * k // total for k in kv]


class _Costs:
    """Each part's figures, from the layers it holds."""

    def __init__(
        self,
        name: str,
        whole: Estimate,
        facts: GgufFacts,
        kv: list[int],
        state: list[int],
        input_bytes: int,
        *,
        on_node: Mapping[str, Estimate],
        measured: dict[str, int],
        mmap: bool,
    ):
        self.name, self.whole, self.facts, self.kv, self.state = name, whole, facts, kv, state
        self.input_bytes, self.on_node, self.measured, self.mmap = input_bytes, on_node, measured, mmap

    def estimate(self, room: Room, first: int, count: int, *, main: bool, output: bool, gpu_main: bool) -> Estimate:
        f, n = self.facts, len(self.kv)
        mine = self.on_node.get(room.node, self.whole)  # the model as this node's kind estimates it
        span = range(first, first + count)
        weights = [Figure("blocks", sum(f.layer_bytes[i] for i in span), "tensor bytes of its blocks (GGUF header)")]
        if main:
            weights.append(Figure("token embeddings", self.input_bytes, "the input layer, on the main node's CPU"))
        if output:
            how = "output.weight and output_norm" if not f.tied else "the token embeddings again (tied: copied here)"
            weights.append(Figure("output layer", f.output_bytes, how))
        if main and not gpu_main and self.mmap and f.layer_spans:
            # llama.cpp maps the file from its first tensor on this CPU to its last: the other devices' tensors in
            # between are read through that map to be sent, and stay mapped (files order their tensors as they like:
            # with blk.10 before blk.2, the first blocks span most of the file)
            mapped = [f.input_span, *(f.layer_spans[i] for i in span)]
            lo, hi = min(a for a, _ in mapped if a >= 0), max(b for _, b in mapped)
            between = hi - lo - sum(x.bytes for x in weights)
            if between > 0:
                weights.append(Figure("mapped between", between, "other devices' tensors inside its mapped range"))
        repack = any(x.name == "repacked copy" for x in mine.weights.parts)
        if main and not gpu_main and repack:  # its blocks stay on its CPU, which repacks some of them
            weights.append(
                Figure("repacked copy", sum(f.layer_repack[i] for i in span), "CPU_REPACK buffer of its blocks")
            )
        w = Figure.total("weights", weights)
        kv_bytes = sum(self.kv[i] + self.state[i] for i in span)
        kv = Figure("kv", kv_bytes, f"the KV cache of its {count} of {n} layers (allocated on the layer's device)")
        key = "main" if main else f"{room.address}:{room.port}"
        if key in self.measured:
            how = "llama.cpp's dry run with the RPC servers of its other nodes up: this device's compute buffer"
            compute = Figure("compute", self.measured[key], how + (" and the output buffer" if main else ""))
        else:
            how = "one compute buffer per device: the model's, which its widest layer sets"
            compute = Figure("compute", mine.compute.bytes, how)
        if main:
            overhead = mine.overhead
        else:
            base = Figure("process", RPC_SERVER_BASE, f"{RPC_PROGRAM} resident beyond its buffers")
            # each tensor reaches it as one message, read whole into memory of its own before it is copied into
            # its buffer: while its part loads it holds up to the largest once more (measured: 24.5 MiB above its
            # buffers for a part with SmolLM2's 28.6 MiB output layer); a whole block bounds any of its tensors
            sent = max([f.layer_bytes[i] for i in span] + ([f.output_bytes] if output else []), default=0)
            message = Figure("receive buffer", sent, "its largest tensor: at most a block's bytes, or the output's")
            ctx = GPU_CONTEXT[room.kind]
            gpu_ctx = [Figure("gpu context", ctx, f"GPU driver context on {room.kind}")] if ctx else []
            overhead = Figure.total("overhead", [base, message, *gpu_ctx])
        on_gpu = 0 if room.kind == "cpu" or (main and not gpu_main) else w.bytes + kv_bytes + compute.bytes
        if main and gpu_main:
            on_gpu -= self.input_bytes
        gpu = Figure("gpu", on_gpu, "its layers on the node's GPU" if on_gpu else "nothing in a GPU window")
        facts = {**self.whole.facts, "split": holds(first, count, has_input=main, output=output)}
        return Estimate(self.name, "split", w, kv, compute, overhead, gpu, None, facts, ())


def _fill(order: list[Room], main: Room, layers: list[int], costs: _Costs, quota: Quota) -> tuple[Part, ...] | None:
    """Fill the parts of ORDER (llama.cpp's layer order) with blocks, the main node's first: each takes as many as
    its room holds, leaving one for each helper after it, from the front when the main node leads (its CPU), from
    the back when it ends the order (its GPU, with the output layer); the part filled last takes the rest. Taking
    more only ever leaves a later part less, so this finds the split of this order whenever one exists. None where
    the rest does not fit the last, or a helper would hold no block."""
    n = len(layers)
    gpu_main = order[-1] is main
    filling = list(reversed(order)) if gpu_main else order
    counts: dict[int, int] = {}
    left = n
    for i, room in enumerate(filling):
        at = order.index(room)
        output = at == len(order) - 1
        if i == len(filling) - 1:
            count = left
        else:
            later = sum(1 for r in filling[i + 1 :] if r is not main)  # each helper after it holds a block at least
            count = _most(room, left, left - later, costs, quota, main=room is main, output=output,
                          gpu_main=gpu_main, from_front=not gpu_main, n=n)  # fmt: skip
        if count == 0 and room is not main:
            return None
        counts[at] = count
        left -= count
    parts, first = [], 0
    for at, room in enumerate(order):
        count = counts[at]
        output = at == len(order) - 1
        est = costs.estimate(room, first, count, main=room is main, output=output, gpu_main=gpu_main)
        if not _fits(room, est, quota):
            return None
        endpoint = None if room is main else f"{room.address}:{room.port}"
        parts.append(Part(room.node, first, count, room is main, output, est, endpoint, quota(est.estimate_bytes)))
        first += count
    return tuple(parts)


def _fits(room: Room, est: Estimate, quota: Quota) -> bool:
    gpu_need = quota(est.gpu.bytes) if est.gpu.bytes else 0
    return quota(est.estimate_bytes) <= room.ram and (room.gpu is None or gpu_need <= room.gpu)


def _device_free(room: Room, gpu: bool | None) -> bool:
    """A GPU device for a part's pod where it holds one (the model's llama-server and each RPC server alike)."""
    return room.devices is None or room.devices >= 1 or not holds_gpu_device("llama-server", room.kind, gpu)


def _most(
    room: Room, left: int, cap: int, costs: _Costs, quota: Quota, *, main: bool, output: bool, gpu_main: bool,
    from_front: bool, n: int,
) -> int:  # fmt: skip
    """How many of the LEFT blocks not yet given the part fits, CAP at most: the first of them (filling from the
    front) or the last (from the back)."""
    count = 0
    while count < cap:
        first = n - left if from_front else left - count - 1
        est = costs.estimate(room, first, count + 1, main=main, output=output, gpu_main=gpu_main)
        if not _fits(room, est, quota):
            break
        count += 1
    return count
