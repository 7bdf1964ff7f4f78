"""vLLM and MLX (mlx-lm's server): a Hugging Face model directory sized from its files, as each engine holds it.

Weights: the safetensors headers' byte ranges (exact; umemc pins each engine to the stored dtype). KV cache:
config.json's attention geometry x the tokens each engine allocates for `context` x `parallel`:

- vLLM allocates its KV cache once, at start, as the bytes umemc gives it (--kv-cache-memory-bytes, which its
  CPU backend takes too: vllm/v1/worker/cpu_worker.py), in blocks of --block-size tokens (umemc pins vLLM's own
  defaults: 16 on a GPU, 128 on its CPU backend, vllm/platforms/cpu.py); umemc gives it exactly what `context` x
  `parallel` needs in whole blocks, and the null block vLLM keeps: the figure is what vLLM holds, by construction.
- mlx-lm grows each sequence's cache in steps of 256 tokens (mlx_lm/models/cache.py, KVCache.step), keys and
  values in the model's activation dtype; a sliding-window layer keeps at most its window (RotatingKVCache). The
  server keeps finished requests' caches for reuse (its prompt cache), bounded by umemc to `prompt_cache` bytes.

Compute: the activations of one prefill step (attention scores of a step of `ubatch` tokens against the whole
context, and the MLP's intermediate), and for vLLM its sampler's logits for `parallel` sequences. Overhead: the
engine's processes beyond these buffers, measured here (bench/engines.py).
"""

from __future__ import annotations

import math

from ..catalog.hfdir import HfModel, positive
from ..catalog.runtimes import MLX_KV, VLLM_KV
from ..stack.resolved import LoadedStack, ResolvedModel
from .figures import Estimate, Figure
from .finish import finish
from .overhead import overhead_figure


def vllm_block(kind: str) -> int:
    """Tokens per KV block: vLLM's default on a GPU (CacheConfig) and on its CPU backend."""
    return 128 if kind == "cpu" else 16


MLX_STEP = 256  # tokens per growth step of an mlx-lm KVCache
MLX_KV_GROUP = 64  # --kv-group-size: one scale and one bias (the activation dtype) per 64 elements


def kv_bytes(
    runtime: str, model: HfModel, context: int, parallel: int, kv_cache: str, kind: str
) -> tuple[int, dict[str, object]]:
    """The KV cache's bytes and the inputs that made them."""
    a = model.attention
    dense = a.n_layer - a.sliding_layers
    if runtime == "vllm":
        _, size = VLLM_KV[kv_cache]
        element, block = size or model.dtype_bytes, vllm_block(kind)
        per_token = 2 * a.n_kv_head * a.head_dim * element  # one layer's keys and values
        blocks = math.ceil(context / block)
        window_blocks = min(blocks, math.ceil((a.sliding_window or 0) / block) + 1)
        # and one block more: vLLM keeps the pool's first block as its null block (vllm/v1/core/block_pool.py), never
        # given to a request; without it a full-length request is refused at start
        tokens = block * ((dense * blocks + a.sliding_layers * window_blocks) * parallel + a.n_layer)
        return tokens * per_token, {"block": block, "element bytes": element, "layer tokens": tokens}
    bits = MLX_KV[kv_cache]
    width = model.dtype_bytes if bits is None else bits / 8 + 2 * model.dtype_bytes / MLX_KV_GROUP
    steps = math.ceil(context / MLX_STEP) * MLX_STEP
    window = min(steps, a.sliding_window or steps)
    tokens = (dense * steps + a.sliding_layers * window) * parallel
    return math.ceil(tokens * 2 * a.n_kv_head * a.head_dim * width), {
        "step": MLX_STEP,
        "element bytes": width,
        "layer tokens": tokens,
    }


def estimate_engine(loaded: LoadedStack, m: ResolvedModel) -> Estimate:
    spec, runtime = m.spec, m.spec.runtime
    model = m.engine
    assert model is not None  # read at load (umemc.stack.engine_keys)
    a = model.attention
    weights = Figure(
        "weights",
        model.tensor_bytes,
        "sum of the tensors' bytes in the safetensors headers (exact; the engine holds them as stored)",
        {
            "directory": str(model.path),
            "files": len(model.files),
            "tensors": model.n_tensors,
            "dtypes": ", ".join(f"{k}:{v}" for k, v in sorted(model.by_dtype.items())),
        },
    )
    kv, how = kv_bytes(runtime, model, spec.context, spec.parallel, spec.kv_cache, loaded.platform.kind)
    geometry = {
        "layers": a.n_layer,
        "kv heads": a.n_kv_head,
        "head dim": a.head_dim,
        "context": spec.context,
        "parallel": spec.parallel,
        **({"sliding window": a.sliding_window, "sliding layers": a.sliding_layers} if a.sliding_window else {}),
        **how,
    }
    if runtime == "vllm":
        formula = (
            "layers x 2 (k,v) x kv heads x head dim x element bytes x context (whole blocks) x parallel: "
            "--kv-cache-memory-bytes, which vLLM allocates at start"
        )
        kv_fig = Figure("kv", kv, formula, geometry)
    else:
        formula = (
            f"layers x 2 (k,v) x kv heads x head dim x element bytes x context (grown in {MLX_STEP}-token steps; "
            "a sliding layer its window) x parallel"
        )
        kv_fig = Figure("kv", kv, formula, geometry)
    compute = _activations(runtime, model, spec.context, spec.parallel, spec.ubatch)
    overhead = overhead_figure(runtime, loaded.platform.kind, prompt_cache=spec.prompt_cache if runtime == "mlx" else 0)
    facts: dict[str, object] = {"family": m.family, "dtype": model.dtype, "format": "safetensors"}
    if model.quantization:
        facts["quantization"] = {k: v for k, v in model.quantization.items() if isinstance(v, (int, str))}
    return finish(loaded, m, "safetensors", weights, kv_fig, compute, overhead, [], facts)


def _activations(runtime: str, model: HfModel, context: int, parallel: int, ubatch: int) -> Figure:
    cfg = model.text
    hidden = positive(cfg, "hidden_size") or 0
    ff = positive(cfg, "intermediate_size") or 4 * hidden
    heads = positive(cfg, "num_attention_heads") or 1
    # vLLM's step is --max-num-batched-tokens across every sequence; mlx-lm prefills --prompt-concurrency (=
    # parallel) prompts at once, a step of each
    step = min(ubatch, context) * (parallel if runtime == "mlx" else 1)
    element = model.dtype_bytes
    scores = heads * step * context * 4  # one step's attention scores against the whole context, f32
    mlp = 3 * step * ff * element  # gate, up and their product
    parts = [
        Figure(
            "prefill step",
            scores + mlp,
            "heads x step x context x 4 (scores) + 3 x step x intermediate x dtype"
            + (" (a step of each of the parallel prompts prefilled at once)" if runtime == "mlx" else ""),
            {"step": step, "heads": heads, "intermediate": ff},
        )
    ]
    if runtime == "vllm" and model.vocab:
        logits = parallel * model.vocab * 4
        parts.append(Figure("logits", logits, "parallel x vocabulary x 4 (the sampler's f32 logits)"))
    return Figure.total("compute", parts)
