"""Budget arithmetic, quota rounding and cold-admission choices, on explicit sizes (exact)."""

from __future__ import annotations

import json
from pathlib import Path

from umemc.budget import hard_quota, make_plan
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


def test_does_not_fit_exit_1_with_suggestions(write_stack, run_cli, tmp_path: Path) -> None:
    text = (
        'version = 1\nname = "big"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\nos_reserve = "2GiB"\n'
        '[models.chat]\nruntime = "llama-server"\narch = "llama-3-8b"\nquant = "Q8_0"\ncontext = 32768\n'
        'priority = 90\n[models.side]\nruntime = "command"\ncommand = ["true"]\nmemory = "3GiB"\npriority = 10\n'
    )
    write_stack(text)
    code, out, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    report = json.loads(out)
    assert code == 1 and report["fits"] is False
    over = (report["hot_total_bytes"] - report["capacity"]["budget_bytes"]) / GiB
    stack = "stack.toml"
    assert report["warnings"] == [
        f"{stack}:11:11: models.chat.context: context 32768 is above the model's trained context 8192: quality "
        "degrades without RoPE scaling",
        f"{stack}:7:9: models.chat.mmap: weights memory-mapped (mmap = true) without mlock on a tight box "
        "(headroom -5.0 GiB): the OS may page them out; set mlock = true or mmap = false",
        f"does not fit: over budget by {over:.1f} GiB",
        'models.side: mode = "cold" (priority 10) frees 3.3 GiB',
        "models.chat: context = 16384 saves 2.2 GiB",  # the KV cache halves: 4 GiB -> 2 GiB, x 1.1
        'models.chat: kv_cache = "q8_0" saves 2.1 GiB',
    ]
    assert err == "".join(f"warning: {w}\n" for w in report["warnings"])
