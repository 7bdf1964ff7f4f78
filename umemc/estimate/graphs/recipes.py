"""What each architecture's reserve graph does beyond the common decoder layer (src/models/<arch>.cpp), and
its router's gating."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from umemc.catalog.archs import LlmShape


@dataclass(frozen=True)
class Recipe:
    """What an architecture's graph does beyond the common decoder layer (src/models/<arch>.cpp)."""

    qk_norm: str = ""  # "": none; "flat": on the whole projection (in place); "heads": per head, on a view
    # the router: "softmax" (probabilities), "sigmoid" (with a selection bias), "softmax_weight" (the top k taken
    # on the logits, a soft-max over the chosen ones' weights), "header" (expert_gating_func; a selection bias
    # where the file has exp_probs_b tensors)
    gating: str = "softmax"
    residual_first: bool = False  # the residual add takes the layer's input first (written in place into it)
    qk_norm_optional: bool = False  # the Q/K norms are there only where the file has them (LlmShape.qk_norm)
    # the chosen experts' weights: "normalised" (divided by their sum), "header" (normalised and scaled as
    # expert_weights_norm / _scale say), "plain" (neither)
    expert_weights: str = "normalised"
    shared_expert: bool = False  # a shared expert (a dense FFN of n_ff_shexp) beside the routed ones, added
    dense_lead: bool = False  # the first leading_dense_block_count layers run a dense FFN
    mla: bool = False  # multi-head latent attention (Graph.attend_mla), the only attention of the recipe
    windows: bool = False  # sliding-window layers attend to a cache of their own (llama-kv-cache-iswa.cpp)
    k_before_v: bool = False  # the graph reaches K before V (else V, then K)
    # every layer runs all the tokens; the output rows are taken after the last, whose whole output is kept as a
    # graph output (llm_graph_result t_h_nextn: never freed)
    rows_at_end: bool = False
    # the queries multiplied by a per-token scale input where the header has attention.temperature_scale
    # (llama.cpp's temperature tuning, build_inp_attn_scale)
    temp_scale: bool = False
    q_scaled: bool = False  # Q multiplied by 1/sqrt(head) before the attention (an op of its own, in place)
    embed_scale: bool = False  # the token embeddings scaled (by sqrt(n_embd): Gemma), in place
    post_norms: bool = False  # the attention's and the FFN's outputs normed before their residual adds (Gemma)
    pre_norms: bool = True  # the attention's and the FFN's inputs normed (OLMo 2 norms only their outputs)
    # the attention and the FFN both read the block's one normed input; their outputs and the residual are added
    # (Cohere's Command R and A)
    parallel: bool = False
    # the graph that writes it out (graphs.GRAPHS): "decoder" the common one, else its own (llama4, shortconv,
    # mamba2, deltanet, qwen35), which says which of its shapes it replays
    graph: str = "decoder"
    # its layers place their tensors alike every `period` layers (after the first few): the replay runs the last
    # two periods and the depth's remainder
    period: int = 2


# Architectures whose reserve graph is written out here, each checked against llama.cpp's dry run.
RECIPES: dict[str, Recipe] = {
    "llama": Recipe(),  # Llama, Mistral, Mixtral (its experts: soft-max, normalised weights)
    "qwen2": Recipe(),  # its q/k/v biases are added in place
    "qwen2vl": Recipe(),  # Qwen2-VL's text model: Qwen2 with four positions a token (M-RoPE: a wider input only)
    "qwen3": Recipe(qk_norm="heads"),
    "qwen3moe": Recipe(qk_norm="heads"),
    "seed_oss": Recipe(),
    # Gemma 3: the embeddings scaled, Q and K normed per head, Q scaled, post-attention and post-FFN norms, five
    # layers of six attending to a window's cache of their own (src/models/gemma3.cpp)
    "gemma3": Recipe(qk_norm="heads", q_scaled=True, windows=True, embed_scale=True, post_norms=True, period=6),
    # Phi-3 and Phi-4: Q, K and V in one projection, the gate and up in one (split by the SwiGLU), Q scaled before
    # the attention, the FFN's residual added into the residual (src/models/phi3.cpp)
    "phi3": Recipe(residual_first=True, q_scaled=True),
    # Mistral 3 (Ministral 3, Mistral Small 3.x files of this architecture): Llama's graph, with the queries'
    # temperature scale where the header has one (src/models/mistral3.cpp)
    "mistral3": Recipe(temp_scale=True),
    # Qwen3-VL's text model: Qwen3 with deepstack inputs added after its first layers (src/models/qwen3vl.cpp)
    "qwen3vl": Recipe(qk_norm="heads"),
    "qwen3vlmoe": Recipe(qk_norm="heads"),  # Qwen3-VL's MoE: Qwen3 MoE with deepstack inputs (qwen3vlmoe.cpp)
    # StarCoder2: layer norms and biases (in place), an FFN without a gate (src/models/starcoder2.cpp)
    "starcoder2": Recipe(),
    "minimax-m2": Recipe(qk_norm="flat", gating="sigmoid"),
    # LFM2: short-convolution layers between attention layers (src/models/lfm2.cpp), dense FFN
    "lfm2": Recipe(qk_norm="heads", residual_first=True, graph="shortconv"),
    # Llama 4: chunked attention on three layers of four, the fourth without RoPE; routed and shared experts
    # (src/models/llama4.cpp; Llama4Graph)
    "llama4": Recipe(shared_expert=True, windows=True, graph="llama4", period=4),  # its own attention and experts
    # GLM-4.5: dense lead layers, sigmoid routing with a selection bias, one shared expert; per-head Q/K norms in
    # the 355B model only (src/models/glm4-moe.cpp)
    "glm4moe": Recipe(
        qk_norm="heads",
        qk_norm_optional=True,
        gating="sigmoid",
        expert_weights="header",
        shared_expert=True,
        dense_lead=True,
    ),
    # gpt-oss: a 128-token window on every other layer, attention sinks (an input of the attention, no op of
    # their own), biases everywhere (added in place), the top 4 of the router's logits soft-maxed
    # (src/models/openai-moe.cpp)
    "gpt-oss": Recipe(gating="softmax_weight", expert_weights="plain", windows=True, k_before_v=True, rows_at_end=True),
    # Granite 4.0 H: Mamba-2 layers between a few attention layers (without RoPE where the file says so), routed
    # experts and a shared one on every layer (src/models/granite-hybrid.cpp; Mamba2Graph)
    "granitehybrid": Recipe(shared_expert=True, graph="mamba2"),
    # DeepSeek V2 / V3 and their kin: multi-head latent attention (Q absorbed into the latent, one K row a token, V
    # read from K and projected after the attention), dense lead layers, the router and the weights as the header
    # says, shared experts (src/models/deepseek2.cpp; Graph.attend_mla)
    "deepseek2": Recipe(gating="header", expert_weights="header", shared_expert=True, dense_lead=True, mla=True),
    # Qwen3-Next: gated DeltaNet layers, every fourth layer gated attention (Q/K normed per head), routed experts
    # and a gated shared expert (src/models/qwen3next.cpp; DeltaNetGraph)
    "qwen3next": Recipe(qk_norm="heads", shared_expert=True, graph="deltanet"),
    # Qwen3.5's MoE: Qwen3-Next's layers with decay and beta projected apart, M-RoPE (src/models/qwen35moe.cpp;
    # Qwen35Graph)
    "qwen35moe": Recipe(qk_norm="heads", shared_expert=True, graph="qwen35"),
}
GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}  # llama_expert_gating_func_type


def recipe_of(shape: LlmShape) -> Recipe:
    """The architecture's recipe; for one without, the common decoder as the file's tensors and keys describe it
    (`inferred`)."""
    return RECIPES.get(shape.arch) or inferred(shape)


@lru_cache(maxsize=64)
def inferred(shape: LlmShape) -> Recipe:
    """An architecture without a recipe, read as the common decoder from what its file says: Q/K norms where it has
    attn_q_norm (over the whole projection where the tensor is that wide, else per head), the router and the
    experts' weights as the header says (soft-max where it says nothing), a shared expert and dense lead layers
    where it has them, a window's own cache where layers slide, the queries' temperature scale where the header has
    one, its norms where its tensors put them (LlmShape.block_norms). What no file says (an op of its own, a
    residual taken first, RoPE left out of some layers) is not in it: the graph is then the common one, which is
    what most of llama.cpp's builders are."""
    return Recipe(
        qk_norm=("flat" if shape.qk_norm_flat else "heads") if shape.qk_norm else "",
        gating="header",
        expert_weights="header",
        shared_expert=bool(shape.n_ff_shexp),
        dense_lead=bool(shape.n_layer_dense_lead),
        windows=any(shape.swa_layers),
        k_before_v=any(shape.swa_layers),  # build_attn for a cache with windows adds Q, K, V in that order
        temp_scale=shape.attn_temp_scale,
        post_norms=shape.block_norms in ("sandwich", "post"),
        pre_norms=shape.block_norms != "post",
        parallel=shape.block_norms == "parallel",
        period=math.lcm(2, _repeats_every(shape.swa_layers[: shape.n_layer_main])),
    )


def _repeats_every(pattern: tuple[bool, ...]) -> int:
    """The shortest period the layers' pattern (which slide) repeats with; 1 for none or one alike."""
    for period in range(1, len(pattern) + 1):
        if all(pattern[i] == pattern[i % period] for i in range(len(pattern))):
            return period
    return 1


def gating(shape: LlmShape) -> str:
    """The router's gating: the recipe's, else the header's (soft-max where the file says nothing; deepseek2 with
    GLM 4.7 Lite's shape: sigmoid), "" where the graph does not know it."""
    recipe = recipe_of(shape)
    if recipe.gating != "header":
        return recipe.gating
    glm_lite = shape.arch == "deepseek2" and shape.n_layer_main in (47, 48) and shape.n_vocab == 154880
    code = shape.expert_gating or (2 if glm_lite else 1)
    return GATING.get(code, "")
