"""umemc's main runtime end to end: real llama-server processes (built from the llama.cpp that llama-cpp-python
vendors: `python3 dev.py setup-llama-server`) under `umemc up`, with the argv the launcher pins, llama.cpp's
buffer lines against the estimate, and the KV slots of an evicted chat model saved before its stop and
restored after its next start, through the gateway."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.conftest import free_port, live_sysctl_table
from tests.runtime.test_gateway import Gateway
from umemc.lockfile import totals
from umemc.runtime.llamalog import parse_buffers
from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]
BINARY = os.environ.get("UMEMC_LLAMA_SERVER") or str(REPO / ".venv" / "llama-server" / "bin" / "llama-server")
pytestmark = [
    pytest.mark.llama_server,
    pytest.mark.skipif(
        not (Path(BINARY).is_file() or shutil.which(BINARY)),
        reason=f"no llama-server at {BINARY}: python3 dev.py setup-llama-server (or set UMEMC_LLAMA_SERVER)",
    ),
]
MiB = 2**20
SPEC = TinySpec(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_vocab=1000)


def stack_text(tmp_path: Path, budget_mib: int) -> str:
    model = write_tiny_gguf(tmp_path / "tiny.gguf", SPEC)
    models = "".join(
        f'\n[models.{name}]\nruntime = "llama-server"\nbin = "{BINARY}"\nmodel = "{model}"\ncontext = 1024\n'
        f'mode = "cold"\npriority = 50\nport = {free_port()}\n'
        for name in ("chat", "other")
    )
    return (
        f'version = 1\nname = "lls"\n[platform]\nkind = "cpu"\nmemory = "{budget_mib + 256}MiB"\n'
        'os_reserve = "256MiB"\n[policy]\nsafety_margin = 0.0\nload_below = 0.98\nevict_above = 0.99\n'
        f"{live_sysctl_table()}[gateway]\nport = {free_port()}\n{models}"
    )


def test_llama_server_end_to_end_with_kv_slots_kept_across_an_eviction(stack: Any, tmp_path: Path) -> None:
    from umemc.budget.plan import make_plan
    from umemc.stack.resolve import load_stack

    (tmp_path / "probe.toml").write_text(stack_text(tmp_path, 100_000))
    hard = make_plan(load_stack(tmp_path / "probe.toml")).models["chat"].quota_hard
    budget = hard // MiB + hard // MiB // 2  # room for one of the two
    gw = Gateway(stack(stack_text(tmp_path, budget)))
    prompt = "the quick brown fox jumps over the lazy dog " * 8
    status, _, body = gw.call("POST", "/v1/completions", {"model": "chat", "prompt": prompt, "max_tokens": 4})
    assert status == 200, body
    # the access log says the tokens llama-server said, and its own speed
    access = gw.run.run_dir / "state" / "logs" / "access.log"  # on disk within 0.1 s of the answer
    gw.run.wait_for(lambda: access.exists() and access.read_text().endswith("\n"), what="the access log's line")
    [entry] = [json.loads(x) for x in access.read_text().splitlines()]
    assert (entry["tokens_in"], entry["tokens_out"], entry["tokens_from"]) == (
        body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"], "usage"
    )  # fmt: skip
    assert entry["tokens_per_s"] == round(body["timings"]["predicted_per_second"], 2)

    # the argv the launcher pinned, as the process runs it (the slot path filled in by the exec wrapper)
    plan = json.loads((gw.run.run_dir / "bundle" / "plan.json").read_text())
    pid = gw.run.status()["chat"]["pid"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    slots = str((gw.run.run_dir / "state" / "slots" / "chat").resolve())
    assert [a.decode() for a in argv] == [
        slots if a.startswith("@UMEMC_STATE@") else a for a in plan["models"]["chat"]["argv"]
    ]
    # llama.cpp's own buffer lines: weights and KV exactly as estimated
    log = (gw.run.run_dir / "state" / "logs" / "chat.err.log").read_text()
    got = totals(parse_buffers(log))
    parts = plan["models"]["chat"]["estimate_parts"]
    assert abs(got["model"] - parts["weights_bytes"]) <= 0.01 * MiB
    assert abs(got["kv"] - parts["kv_bytes"]) <= 0.01 * MiB

    # a request for the other model evicts chat: its slot is saved first
    assert gw.call("POST", "/v1/completions", {"model": "other", "prompt": "hi", "max_tokens": 2})[0] == 200
    [save] = gw.run.events("slot_save")
    assert save["model"] == "chat" and save["detail"]["slot"] == 0
    assert save["detail"]["tokens"] > 50 and save["detail"]["bytes"] > 0
    assert (Path(slots) / "chat-slot0.bin").stat().st_size == save["detail"]["bytes"]
    assert [e["model"] for e in gw.run.events("evict")] == ["chat"]

    # chat comes back: the slot is restored after its start, with what was saved
    assert gw.call("POST", "/v1/completions", {"model": "chat", "prompt": prompt, "max_tokens": 2})[0] == 200
    [restore] = gw.run.events("slot_restore")
    assert restore["model"] == "chat"
    # what reading the restored tokens would have taken at the prompt speed llama-server said for chat's first
    # answer, less the restore's own time
    first_speed = body["timings"]["prompt_per_second"]
    saved = restore["detail"]["tokens"] / first_speed - restore["detail"]["ms"] / 1000
    assert restore["detail"]["saved_s"] == pytest.approx(max(0.0, saved), abs=0.002)
    assert (restore["detail"]["tokens"], restore["detail"]["bytes"]) == (
        save["detail"]["tokens"],
        save["detail"]["bytes"],
    )


# Older llama-server builds to run for real when they are here (each a path; os.pathsep between): e.g. the servers
# of the llama.cpp trees llama-cpp-python 0.3.16 and 0.3.2 vendor (`cmake --build B --target llama-server`), whose
# --help texts tests/test_llama_server_spelling.py checks the spelling against.
OLDER = [p for p in os.environ.get("UMEMC_LLAMA_SERVER_OLDER", "").split(os.pathsep) if p]


@pytest.mark.skipif(not OLDER, reason="UMEMC_LLAMA_SERVER_OLDER names no older llama-server build")
@pytest.mark.parametrize("binary", OLDER)
def test_an_older_llama_server_runs_with_its_own_spelling(binary: str, stack: Any, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf", SPEC)
    text = (
        f'version = 1\nname = "old"\n[platform]\nkind = "cpu"\nmemory = "2GiB"\nos_reserve = "256MiB"\n'
        f"{live_sysctl_table()}[gateway]\nport = {free_port()}\n"
        f'[models.chat]\nruntime = "llama-server"\nbin = "{binary}"\nmodel = "{model}"\ncontext = 1024\n'
        f"mmap = false\nport = {free_port()}\n"
    )
    gw = Gateway(stack(text))
    status, _, body = gw.call("POST", "/v1/completions", {"model": "chat", "prompt": "hello", "max_tokens": 2})
    assert status == 200, body
    argv = json.loads((gw.run.run_dir / "bundle" / "plan.json").read_text())["models"]["chat"]["argv"]
    assert "--no-mmap" in argv and "--load-mode" not in argv and "--fit" not in argv
    assert argv[argv.index("-fa") + 1] == "-ctk"  # the switch of a build before `-fa on|off|auto`
    log = (gw.run.run_dir / "state" / "logs" / "chat.err.log").read_text()
    parts = json.loads((gw.run.run_dir / "bundle" / "plan.json").read_text())["models"]["chat"]["estimate_parts"]
    assert abs(totals(parse_buffers(log))["kv"] - parts["kv_bytes"]) <= 0.01 * MiB


# An interpreter with an older llama-cpp-python[server] (e.g. 0.2.55, 2024-03: no --flash_attn, --type_k,
# --n_ubatch), to run for real where it is here.
OLDER_LCP = os.environ.get("UMEMC_LLAMA_CPP_PYTHON_OLDER")


@pytest.mark.skipif(not OLDER_LCP, reason="UMEMC_LLAMA_CPP_PYTHON_OLDER names no interpreter with an older server")
def test_an_older_llama_cpp_python_server_runs_with_the_settings_it_has(stack: Any, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf", SPEC)
    text = (
        f'version = 1\nname = "oldlcp"\n[platform]\nkind = "cpu"\nmemory = "2GiB"\nos_reserve = "256MiB"\n'
        f"[policy]\nquota_headroom = 0.5\n{live_sysctl_table()}[gateway]\nport = {free_port()}\n"
        f'[models.chat]\nruntime = "llama-cpp-python"\nbin = "{OLDER_LCP}"\nmodel = "{model}"\ncontext = 512\n'
        f"flash_attn = false\nport = {free_port()}\n"
    )
    gw = Gateway(stack(text))
    status, _, body = gw.call("POST", "/v1/completions", {"model": "chat", "prompt": "hello", "max_tokens": 2})
    assert status == 200, body
    argv = json.loads((gw.run.run_dir / "bundle" / "plan.json").read_text())["models"]["chat"]["argv"]
    assert "--flash_attn" not in argv and "--type_k" not in argv and "--n_ubatch" not in argv
