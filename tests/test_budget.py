"""Budget arithmetic, quota rounding and cold-admission choices, on explicit sizes (exact)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from umemc.budget.plan import hard_quota, make_plan
from umemc.stack.resolve import load_stack
from umemc.units import GiB, MiB

ADMISSION = """
version = 1
name = "adm"

[platform]
kind = "cpu"
memory = "10GiB"
os_reserve = "1GiB"

[policy]
safety_margin = 0.0
quota_headroom = 0.1
load_below = 0.98
evict_above = 0.99
"""


def worker(name: str, mib: int, priority: int, mode: str = "hot") -> str:
    return (
        f'\n[models.{name}]\nruntime = "command"\ncommand = ["true"]\nmemory = "{mib}MiB"\n'
        f'priority = {priority}\nmode = "{mode}"\n'
    )


def test_cold_admission_choices(write_stack) -> None:
    text = ADMISSION + worker("a", 3000, 90) + worker("b", 2000, 30) + worker("c", 1000, 20)
    text += worker("x", 2000, 50, "cold") + worker("y", 3000, 50, "cold") + worker("z", 4000, 50, "cold")
    text += worker("w", 4000, 25, "cold") + worker("v", 4000, 20, "cold")
    plan = make_plan(load_stack(write_stack(text)))
    assert plan.capacity.budget == 9 * GiB
    assert [plan.models[n].quota_hard for n in "abc"] == [3300 * MiB, 2200 * MiB, 1100 * MiB]
    assert plan.hot_total == 6600 * MiB and plan.headroom == 2616 * MiB and plan.fits
    adm = {n: (a.fits_alongside_hot, a.admissible, list(a.evicts)) for n, a in plan.cold_admission.items()}
    assert adm == {
        "x": (True, True, []),  # 2200 <= 2616
        "y": (False, True, ["c"]),  # needs 684: the lowest priority is enough
        "z": (False, True, ["c", "b"]),  # needs 1784: lowest first, then the next
        "w": (False, False, []),  # only c (20) is below 25, and 1100 < 1784
        "v": (False, False, []),  # equal priority is never evicted
    }


def test_cold_admission_keeps_the_pressure_rule(write_stack) -> None:
    """load_below is part of the one policy: a cold start is admitted only while the pressure (on paper, the hot
    hard quotas over usable memory), less what its evictions free, is below it."""
    text = ADMISSION.replace("load_below = 0.98", "load_below = 0.70").replace(
        "evict_above = 0.99", "evict_above = 0.9"
    )
    text += worker("a", 3000, 90) + worker("b", 2000, 30) + worker("c", 1000, 20)
    text += worker("x", 2000, 50, "cold") + worker("s", 100, 10, "cold")
    plan = make_plan(load_stack(write_stack(text)))
    usable = 9 * 1024  # MiB
    assert plan.capacity.usable == usable * MiB
    # hot 3300 + 2200 + 1100 = 6600 MiB: 6600 / 9216 = 0.716, not below 0.70
    # x (priority 50) fits the 2616 MiB left, but must evict c: (6600 - 1100) / 9216 = 0.597
    # s (priority 10) may evict nobody: it can never start, though 110 MiB would fit
    adm = {n: (a.fits_alongside_hot, a.admissible, list(a.evicts)) for n, a in plan.cold_admission.items()}
    assert adm == {"x": (False, True, ["c"]), "s": (False, False, [])}
    assert [w for w in plan.warnings if w.startswith("models.")] == [
        "models.x: cold model fits the budget beside the hot set, but the hot set's hard quotas hold 0.72 of usable "
        "memory, not below load_below 0.7: it starts only by evicting c",
        "models.s: cold model can never start: it fits the budget, but the hot set's hard quotas hold 0.72 of usable "
        "memory, not below load_below 0.7 and evicting every lower-priority hot model does not bring it under; lower "
        "the hot set or raise load_below",
    ]


def test_hard_quota_rounds_up_to_a_mib() -> None:
    assert hard_quota(1000 * MiB, 0.1) == 1100 * MiB
    assert hard_quota(1, 0.1) == MiB
    assert hard_quota(4 * GiB, 0.1) == 4506 * MiB  # 4505.6 MiB rounded up
    assert hard_quota(3 * 10**9, 0.0) == 2862 * MiB  # 2861.02 MiB rounded up


def test_capacity_unified_window_bounds_usable(write_stack) -> None:
    text = 'version = 1\nname = "u"\n[platform]\npreset = "apple-silicon-128"\ngpu_window = "100GiB"\n' + worker(
        "a", 1000, 50
    )
    plan = make_plan(load_stack(write_stack(text)))
    cap = plan.capacity
    assert (cap.memory, cap.os_reserve, cap.gpu_window, cap.usable) == (128 * GiB, 8 * GiB, 100 * GiB, 100 * GiB)
    assert cap.budget == cap.gpu_budget == 85 * GiB
    assert plan.models["a"].gpu_quota_hard == 1100 * MiB  # explicit memory: all of it counted GPU-side


def test_capacity_cpu_has_no_gpu_ledger(write_stack) -> None:
    plan = make_plan(load_stack(write_stack(ADMISSION + worker("a", 1000, 50))))
    assert plan.capacity.gpu_window is None and plan.capacity.gpu_budget is None and plan.hot_gpu_total == 0


def test_preset_fields_are_overridable(write_stack) -> None:
    text = (
        'version = 1\nname = "o"\n[platform]\npreset = "strix-halo-128"\nmemory = "96GiB"\nos_reserve = "6GiB"\n'
        'gpu_window = "80GiB"\n' + worker("a", 1000, 50)
    )
    p = load_stack(write_stack(text)).platform
    assert (p.kind, p.memory, p.os_reserve, p.gpu_window) == ("amd-apu", 96 * GiB, 6 * GiB, 80 * GiB)


def test_does_not_fit_leads_with_the_decisive_fact_and_the_smallest_change(
    write_stack, run_cli, tmp_path: Path
) -> None:
    text = (
        'version = 1\nname = "big"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\nos_reserve = "2GiB"\n'
        '[models.chat]\nruntime = "llama-server"\narch = "llama-3-8b"\nmodel = "chat.gguf"\nquant = "Q8_0"\n'
        'context = 32768\npriority = 90\n[models.side]\nruntime = "command"\ncommand = ["true"]\nmemory = "3GiB"\n'
        "priority = 10\n"
    )
    write_stack(text)
    code, out, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    report = json.loads(out)
    assert code == 1 and report["fits"] is False
    # budget: (16 - 2) GiB x 0.85 = 11.9 GiB; side: 3 GiB x 1.1 = 3.3 GiB; chat alone is over the budget (its
    # llama-server process: 24 MiB and 96 bytes for each of 128,256 tokens), so no single change is enough: the
    # mildest combination that fits comes first (Q6_K weights 6.1 GiB and 1 GiB of KV at 8192 tokens instead of
    # 7.9 + 4 GiB; 11.9 - 8.0 - 3.3 = 0.6 GiB to spare), then what frees the most: IQ4_XS weights are 4.44e9 bytes
    # against Q8_0's 8.53e9, 3.81 GiB x 1.1 = 4.2 GiB
    assert report["advice"] == [
        "does not fit: the hot set's hard quotas total 16.6 GiB, the budget is 11.9 GiB (over by 4.7 GiB)",
        "model chat alone (13.3 GiB hard quota) exceeds the 11.9 GiB budget",
        'smallest change that fits: models.chat: quant = "Q6_K", context = 8192 (8.0 GiB hard quota, 0.6 GiB to spare)',
        "no single change fits; these free the most:",
        '  models.chat: quant = "IQ4_XS" frees 4.2 GiB',
        "  models.chat: context = 2048 frees 4.2 GiB",
        "  models.chat: context = 4096 frees 3.9 GiB",
        "  models.chat: context = 8192 frees 3.3 GiB",
        '  models.side: mode = "cold" (priority 10) frees 3.3 GiB',
    ]
    stack = "stack.toml"
    assert report["warnings"] == [
        f'{stack}:10:9: models.chat.model: file not found, estimating from arch = "llama-3-8b"',
        f"{stack}:12:11: models.chat.context: context 32768 is above the model's trained context 8192: quality "
        "degrades without RoPE scaling",
        f"{stack}:7:9: models.chat.mmap: weights memory-mapped (mmap = true) without mlock on a tight box "
        "(headroom -4.7 GiB): the OS may page them out; set mlock = true or mmap = false",
    ]
    assert err == "".join(f"warning: {w}\n" for w in report["warnings"]) + "".join(f"{a}\n" for a in report["advice"])
    code, md, _ = run_cli("check", "stack.toml", "--format", "markdown", cwd=tmp_path)
    lines = md.splitlines()
    at = lines.index("**Why it does not fit, and what would:**")  # before the tables, never collapsed
    assert at < lines.index(
        "| model | mode | prio | weights | KV | compute | overhead | estimate | hard quota | GPU | source |"
    )
    assert lines[at + 2 : at + 5] == [
        "- does not fit: the hot set's hard quotas total 16.6 GiB, the budget is 11.9 GiB (over by 4.7 GiB)",
        "- model chat alone (13.3 GiB hard quota) exceeds the 11.9 GiB budget",
        '- smallest change that fits: models.chat: quant = "Q6_K", context = 8192 (8.0 GiB hard quota, 0.6 GiB to '
        "spare)",
    ]
    assert "<details>" not in "\n".join(
        lines[
            : lines.index(
                "| model | mode | prio | weights | KV | compute | overhead | estimate | hard quota | GPU | source |"
            )
        ]
    )


def test_a_single_change_that_fits_is_named(write_stack, run_cli, tmp_path: Path) -> None:
    """qwen2.5-7b Q4_K_M on a CPU box: with mmap its repacked Q4_K matrices are held twice (file pages and
    the CPU_REPACK copy), so mmap = false (the mildest change) fits, and so does a lower quantization."""
    text = (
        'version = 1\nname = "cpu"\n[platform]\nkind = "cpu"\nmemory = "10GiB"\nos_reserve = "1GiB"\n'
        '[models.chat]\nruntime = "llama-server"\narch = "qwen2.5-7b"\nmodel = "chat.gguf"\ncontext = 2048\n'
    )
    write_stack(text)
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 1
    assert json.loads(out)["advice"] == [
        # llama-server's process for qwen2.5-7b: 24 MiB and 96 bytes for each of its 152,064 tokens
        "does not fit: the hot set's hard quotas total 8.3 GiB, the budget is 7.6 GiB (over by 0.7 GiB)",
        "model chat alone (8.3 GiB hard quota) exceeds the 7.6 GiB budget",
        "smallest changes that fit (each alone, re-estimated):",
        "  models.chat: mmap = false (no second copy of the repacked weights) frees 3.2 GiB",
        '  models.chat: quant = "Q3_K_M" frees 2.8 GiB',
    ]


ARCH_ONLY = (
    'version = 1\nname = "a"\n[platform]\npreset = "strix-halo-128"\n'
    '[models.chat]\nruntime = "llama-server"\narch = "llama-3-8b"\n'
)


def test_arch_only_model_is_refused_by_check_and_build_alike(write_stack, run_cli, tmp_path: Path) -> None:
    write_stack(ARCH_ONLY)
    message = (
        "stack.toml:5:1: models.chat: no model file: llama-server cannot start without one (the estimate used arch = "
        '"llama-3-8b"); give model = "path/to/file.gguf"'
    )
    # what build refuses, check refuses (a CI dry run must not say FITS for a stack that cannot be built)
    assert run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path) == (2, "", message + "\n")
    for flags in ((), ("--files-later",)):  # no model key: nothing could come later
        assert run_cli("build", "stack.toml", "-o", "out", *flags, cwd=tmp_path) == (2, "", message + "\n")
        assert not (tmp_path / "out").exists()


def test_a_missing_file_builds_only_with_files_later(write_stack, run_cli, tmp_path: Path) -> None:
    write_stack(ARCH_ONLY + 'model = "models/chat.gguf"\n')
    assert run_cli("build", "stack.toml", "-o", "out", cwd=tmp_path) == (
        2,
        "",
        "stack.toml:8:9: models.chat.model: models/chat.gguf does not exist yet: `umemc build` needs --files-later, "
        "`umemc up` needs the file\n",
    )
    assert not (tmp_path / "out").exists()
    code, out, _ = run_cli("build", "stack.toml", "-o", "out", "--files-later", cwd=tmp_path)
    assert code == 0 and f"-m {tmp_path}/models/chat.gguf" in (tmp_path / "out/supervisord.conf").read_text()


def test_advice_is_a_stage_above_the_budget_run_only_when_it_does_not_fit(write_stack, monkeypatch) -> None:
    """The budget never re-estimates; advice does, and only for a stack that does not fit."""
    import umemc.budget.advice as advice_stage
    from umemc.budget.advice import advise

    calls: list[str] = []
    real = advice_stage.estimate_model
    monkeypatch.setattr(advice_stage, "estimate_model", lambda loaded, m: calls.append(m.name) or real(loaded, m))
    big = load_stack(
        write_stack(
            'version = 1\nname = "big"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\nos_reserve = "2GiB"\n'
            '[models.chat]\nruntime = "llama-server"\narch = "llama-3-8b"\nquant = "Q8_0"\ncontext = 32768\n'
            + worker("side", 3072, 10)
        )
    )
    plan = make_plan(big)
    assert (plan.fits, plan.advice, calls) == (False, (), [])
    advised = advise(big, plan)
    assert advised.advice[0] == (  # the same stack as above: 16.6 GiB against 11.9 GiB
        "does not fit: the hot set's hard quotas total 16.6 GiB, the budget is 11.9 GiB (over by 4.7 GiB)"
    )
    assert set(calls) == {"chat"}  # its context, KV type and quantization were tried; side's memory is fixed
    calls.clear()
    small = load_stack(
        write_stack('version = 1\nname = "small"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n' + worker("a", 800, 50))
    )
    fitting = make_plan(small)
    assert advise(small, fitting) is fitting and calls == []


@pytest.mark.parametrize(
    "example", sorted((Path(__file__).parent.parent / "examples").glob("*.toml")), ids=lambda p: p.stem
)
@pytest.mark.parametrize("f", [0.05, 0.1, 0.25, 0.5])
def test_a_scaled_rehearsal_decides_as_the_full_size(example: Path, f: float) -> None:
    """`up --simulate --scale F`: every capacity and quota times F; what fits and what a cold start evicts are
    the full size's (the one policy asked again on the scaled figures)."""
    from umemc.budget.plan import make_plan, scaled
    from umemc.stack.resolve import load_stack

    plan = make_plan(load_stack(example))
    if plan.nodes:
        pytest.skip("a stack of several nodes is rehearsed one node at a time (up --node)")
    small = scaled(plan, f)
    assert (small.fits, small.cold_admission) == (plan.fits, plan.cold_admission)
    exact = Fraction(repr(f))
    assert small.capacity.budget == plan.capacity.budget * exact.numerator // exact.denominator
    assert all(small.models[n].quota_hard >= plan.models[n].quota_hard * exact for n in plan.models)
    assert small.scale == f


FLOORS = """
version = 1
name = "floors"
[platform]
preset = "strix-halo-128"
[models.embed]
runtime = "llama-server"
arch = "bge-m3"
model = "e.gguf"
quant = "F16"
[models.vl]
runtime = "llama-server"
arch = "qwen2.5-vl-7b"
model = "vl.gguf"
quant = "Q8_0"
[models.small]
runtime = "llama-server"
arch = "llama-3-8b"
model = "s.gguf"
quant = "Q8_0"
[models.mid]
runtime = "llama-server"
arch = "qwen3-32b"
model = "m.gguf"
quant = "Q8_0"
[models.large]
runtime = "llama-server"
arch = "qwen3-235b-a22b"
model = "l.gguf"
quant = "Q4_K_M"
[models.oss]
runtime = "llama-server"
arch = "gpt-oss-120b"
model = "o.gguf"
[models.pinned]
runtime = "llama-server"
arch = "llama-3-8b"
model = "p.gguf"
quant = "Q8_0"
min_quant = "q4_k_s"
"""


def test_the_quantizations_advice_tries_stop_at_what_the_model_tolerates(write_stack) -> None:
    """Embeddings stay at 8 bits, vision at 5; a language model goes lower the larger it is (8B: Q3_K_M, 32B:
    IQ3_XXS, 235B: IQ2_XXS), never below its min_quant (Q4_K_S, 4.67 bits: Q4_K_M's 4.89 is the last above it);
    gpt-oss's experts are MXFP4 as trained, so no k-quant is offered."""
    from umemc.budget.advice import lower_quants

    plan = make_plan(load_stack(write_stack(FLOORS)))
    assert {name: lower_quants(m) for name, m in plan.models.items()} == {
        "embed": ("Q8_0",),
        "vl": ("Q6_K", "Q5_K_M"),
        "small": ("Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M"),
        "mid": ("Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "IQ3_M", "Q2_K", "IQ3_XXS"),
        "large": ("IQ4_XS", "Q3_K_M", "IQ3_M", "Q2_K", "IQ3_XXS", "IQ2_M", "IQ2_XS", "IQ2_XXS"),
        "oss": (),
        "pinned": ("Q6_K", "Q5_K_M", "Q4_K_M"),
    }


BIG_MOE = (
    'version = 1\nname = "big"\n[platform]\npreset = "strix-halo-128"\n[models.chat]\nruntime = "llama-server"\n'
    'arch = "qwen3-235b-a22b"\nmodel = "chat.gguf"\nquant = "{quant}"\ncontext = 16384\n{extra}'
)


def test_a_235b_mixture_of_experts_is_advised_down_to_three_bits(write_stack, run_cli, tmp_path: Path) -> None:
    def hard(quant: str, extra: str = "") -> tuple[int, dict]:
        write_stack(BIG_MOE.format(quant=quant, extra=extra))
        code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
        report = json.loads(out)
        return code, report

    code, report = hard("Q4_K_M")
    assert code == 1
    q4 = report["models"]["chat"]["quota_hard_bytes"]
    code_iq3, fixed = hard("IQ3_XXS")
    iq3 = fixed["models"]["chat"]["quota_hard_bytes"]
    assert code_iq3 == 0  # what advice says fits, check says fits
    assert report["advice"][3:] == [
        "smallest changes that fit (each alone, re-estimated):",
        f'  models.chat: quant = "IQ3_XXS" frees {(q4 - iq3) / GiB:.1f} GiB',
    ]
    # min_quant holds it at Q3_K_M, which is not enough: said, with the floor
    code, report = hard("Q4_K_M", 'min_quant = "Q3_K_M"\n')
    assert code == 1 and report["advice"][3] == (
        "models.chat: no quantization down to Q3_K_M (its min_quant), KV type or context umemc can try makes the "
        "stack fit: a smaller model, fewer hot models or a bigger machine"
    )


def test_a_lower_quantization_comes_after_going_cold(write_stack, run_cli, tmp_path: Path) -> None:
    """Cold keeps the model's answers as they are; a lower quantization does not: it is offered last."""
    text = (
        'version = 1\nname = "cold"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\nos_reserve = "2GiB"\n'
        '[models.chat]\nruntime = "llama-server"\narch = "llama-3-8b"\nmodel = "chat.gguf"\nquant = "Q8_0"\n'
        "context = 8192\nmmap = false\npriority = 90\n"
        '[models.side]\nruntime = "command"\ncommand = ["true"]\nmemory = "3GiB"\npriority = 10\n'
    )
    write_stack(text)
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    lines = json.loads(out)["advice"]
    assert code == 1 and [line.split(" frees ")[0] for line in lines[1:]] == [
        "smallest changes that fit (each alone, re-estimated):",
        '  models.side: mode = "cold" (priority 10)',
        '  models.chat: mode = "cold" (priority 90)',
        '  models.chat: quant = "Q6_K"',
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('min_quant = "Q3_KM"', "stack.toml:11:13: models.chat.min_quant: unknown GGUF file type \"Q3_KM\"\n"
         "  hint: did you mean 'Q3_K_M'?\n"),
        ('min_quant = "IQ5"', "stack.toml:11:13: models.chat.min_quant: unknown GGUF file type \"IQ5\"\n"
         "  hint: one of F32, F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q5_0, Q5_1, Q4_K_M, Q4_K_S, Q4_0, Q4_1, "
         "IQ4_XS, IQ4_NL, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K, Q2_K_S, IQ3_M, IQ3_S, IQ3_XS, IQ3_XXS, IQ2_M, IQ2_S, IQ2_XS, "
         "IQ2_XXS, IQ1_M, IQ1_S, MXFP4_MOE\n"),
    ],
)  # fmt: skip
def test_an_unknown_min_quant_is_refused_at_its_key(write_stack, run_cli, tmp_path: Path, line, message) -> None:
    write_stack(BIG_MOE.format(quant="Q4_K_M", extra=line + "\n"))
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out, err) == (2, "", message)


def test_min_quant_is_refused_where_no_gguf_is_quantized(write_stack, run_cli, tmp_path: Path) -> None:
    write_stack(ADMISSION + worker("a", 1000, 50) + 'min_quant = "Q4_K_M"\n')
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out) == (2, "") and err == (
        'stack.toml:21:13: models.a.min_quant: a GGUF file type: not used for runtime = "command"\n  hint: remove it\n'
    )


def test_an_embedding_context_past_its_ubatch_is_warned_with_the_fix(write_stack, run_cli, tmp_path: Path) -> None:
    """bge-m3 takes one input per ubatch: at context 8192 with the default ubatch of 512 longer inputs are
    refused by llama-server. The warning names both fixes; the first one taken, it is gone and the compute
    buffers it costs are counted."""
    text = (
        'version = 1\nname = "emb"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n[models.embed]\n'
        'runtime = "llama-server"\narch = "bge-m3"\nmodel = "e.gguf"\ncontext = 8192\n'
    )
    write_stack(text)
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    report = json.loads(out)
    assert code == 0 and report["warnings"][1:] == [
        "stack.toml:6:9: models.embed.ubatch: embedding inputs must fit one ubatch: inputs longer than 512 tokens "
        "will be rejected (context is 8192); fix: ubatch = 8192 takes inputs up to 8192 tokens (its compute buffers "
        "grow with it, and this check counts them), or context = 512 says what it takes"
    ]
    write_stack(text + "ubatch = 8192\n")
    code, out, _ = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    fixed = json.loads(out)
    assert code == 0 and not any("ubatch" in w for w in fixed["warnings"])
    assert fixed["models"]["embed"]["compute_bytes"] > report["models"]["embed"]["compute_bytes"]
