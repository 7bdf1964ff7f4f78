"""The compute buffer's fallback, counted: the presets and the measured not-tuned-to architectures whose reserve
graph umemc does not write out, so that their compute buffer is a formula (docs/ESTIMATES.md). Each is a thing to
retire: when an architecture's graph is written out, it leaves these lists, and the test says so."""

from __future__ import annotations

from umemc.catalog.archs import LLM_PRESETS
from umemc.estimate import graphs, llm
from umemc.testing.archspecs import FULL

# What falls to the formula today, and why: an encoder (bert: no encoder graph is written out)
PRESETS_ON_THE_FORMULA = {"bge-m3"}
# by architecture (umemc.testing.archspecs.FULL): Falcon-H1's and Nemotron-H's Mamba-2 mixers (Nemotron 3's with
# ungated experts), Gemma 3n's altup streams, ERNIE 4.5's shared experts with a dense lead, EmbeddingGemma (an
# encoder: no encoder graph is written out)
ARCHS_ON_THE_FORMULA = {"falcon-h1", "nemotron_h", "nemotron_h_moe", "gemma3n", "ernie4_5-moe", "gemma-embedding"}


def test_the_presets_that_fall_to_the_formula_are_these() -> None:
    fallen = {name for name, p in LLM_PRESETS.items() if not graphs.supported(p.shape)}
    assert fallen == PRESETS_ON_THE_FORMULA
    assert (len(LLM_PRESETS) - len(fallen), len(fallen)) == (20, 1)


def test_a_fallen_preset_says_its_compute_is_a_formula_and_a_replayed_one_says_it_is_replayed() -> None:
    for name, p in LLM_PRESETS.items():
        graph = llm.compute_figure(p.shape, 8192, 1, 512, flash_attn=True, outputs=1).parts[0]
        replayed = graph.formula.startswith("ggml-alloc's placement replayed")
        assert replayed is (name not in PRESETS_ON_THE_FORMULA), (name, graph.formula)


def test_the_measured_architectures_that_fall_to_the_formula_are_these() -> None:
    # the shapes as their headers give them are what bench/accuracy.py --new writes; here the architectures alone
    fallen = {spec.arch for spec in FULL.values() if spec.arch not in graphs.RECIPES}
    assert fallen == ARCHS_ON_THE_FORMULA


def test_the_docs_table_of_replayed_architectures_is_the_codes() -> None:
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "ESTIMATES.md").read_text()
    table = text.split("## Architectures: how each one's compute buffer is sized", 1)[1].split("\n## ", 1)[0]
    replayed = set()
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[1] == "replayed":
            replayed.add(cells[0].split(" (")[0])
    assert replayed == set(graphs.RECIPES)
    # the rows read from the file are architectures without a recipe
    inferred = {c[0] for c in (r.strip("|").split("|") for r in table.splitlines()) if len(c) == 3 and
                c[1].strip() == "read from the file"}  # fmt: skip
    assert {c.strip() for c in inferred} == {
        "olmo2", "exaone4", "hunyuan-moe", "dots1", "cohere2", "glm4", "gemma2", "gemma", "command-r", "granite",
        "qwen2moe",
    }  # fmt: skip
    assert not {c.strip() for c in inferred} & set(graphs.RECIPES)


def test_q_k_and_v_in_one_projection_are_replayed_only_as_phi_3_lays_them_out() -> None:
    # the common decoder writes attn_qkv's views RoPE'd and not normed (Phi-3); a Qwen3 file (per-head Q/K norms) or
    # a Llama 4 one (its own attention) with attn_qkv falls to the formula rather than be replayed wrong
    phi, qwen3, llama4 = (LLM_PRESETS[n].shape for n in ("phi-4", "qwen3-32b", "llama-4-scout"))
    assert graphs.supported(phi) and phi.qkv_fused
    assert graphs.supported(qwen3) and not graphs.supported(qwen3._replace(qkv_fused=(True,) * qwen3.n_layer))
    assert graphs.supported(llama4) and not graphs.supported(llama4._replace(qkv_fused=(True,) * llama4.n_layer))


def _sized(arch: str) -> str:
    """How the code sizes an architecture's compute buffer, in the words of the docs table below."""
    from umemc.catalog.llama_archs import facts

    f = facts(arch)
    if arch in graphs.RECIPES:
        return "replayed: its recipe"
    if f.encoder:
        return "encoder rules"
    if f.layers in ("recurrent", "parallel", "interval", "ffn-only", "zero-kv"):
        return "formula: recurrent layers"
    if f.altup:
        return "formula: altup streams"
    if f.layers == "shared-kv":
        return "formula: layers reading another's cache"
    return "read from the file"


def test_the_docs_table_of_every_architecture_is_the_codes_and_the_gguf_packages() -> None:
    from pathlib import Path

    import gguf

    text = (Path(__file__).parents[2] / "docs" / "ESTIMATES.md").read_text()
    table = text.split("## Every architecture a GGUF can name", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("architecture", "---"):
            rows[cells[0]] = cells[1]
    assert set(rows) == set(gguf.constants.MODEL_ARCH_NAMES.values())
    assert {arch: how for arch, how in rows.items() if how != _sized(arch)} == {}
    assert sum(how == "read from the file" for how in rows.values()) > 50  # the reading is what most get
