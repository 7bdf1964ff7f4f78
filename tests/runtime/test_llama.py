"""Real llama.cpp (llama-cpp-python's server) under `umemc up`, and `umemc calibrate` against it.
Marked `llama`: llama-cpp-python compiles llama.cpp (~5 min on 2 cores); CI installs it
(`python3 dev.py setup-llama`), and these tests say why they skip where it is absent."""

from __future__ import annotations

import http.client
import importlib.util
import json
from pathlib import Path

import pytest

from tests.runtime.conftest import free_port, live_sysctl_table
from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

_missing = [
    m
    for m in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
    if importlib.util.find_spec(m) is None
]
pytestmark = [
    pytest.mark.llama,
    pytest.mark.skipif(
        bool(_missing),
        reason=f"llama-cpp-python[server] not installed (missing {', '.join(_missing)}): python3 dev.py setup-llama",
    ),
]

MiB = 2**20
CHAT = TinySpec(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_vocab=2000)
CODE = TinySpec(arch="qwen2", n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=1, n_vocab=1000, ftype="Q8_0")


def stack_text(ports: tuple[int, int], context: int = 512) -> str:
    return (
        'version = 1\nname = "llama"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        "[policy]\nquota_headroom = 0.5\n"
        + live_sysctl_table()
        + f'[models.chat]\nruntime = "llama-cpp-python"\nmodel = "chat.gguf"\ncontext = {context}\n'
        f"port = {ports[0]}\n"
        + f'[models.code]\nruntime = "llama-cpp-python"\nmodel = "code.gguf"\ncontext = 1024\nport = {ports[1]}\n'
    )


def complete(port: int, prompt: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request(
        "POST",
        "/v1/completions",
        body=json.dumps({"prompt": prompt, "max_tokens": 6, "temperature": 0}),
        headers={"Content-Type": "application/json"},
    )
    response = conn.getresponse()
    assert response.status == 200
    return json.loads(response.read())


def models(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "chat.gguf", CHAT)
    write_tiny_gguf(tmp_path / "code.gguf", CODE)


def test_llama_cpp_workers_under_umemc_up(stack, tmp_path: Path) -> None:
    models(tmp_path)
    ports = (free_port(), free_port())
    r = stack(stack_text(ports))
    for port, prompt in zip(ports, ("Hello, my name is", "def main():"), strict=True):
        reply = complete(port, prompt)
        assert isinstance(reply["choices"][0]["text"], str) and reply["usage"]["completion_tokens"] >= 1
    r.wait_for(lambda: all(m["rss_bytes"] > 0 for m in r.status().values()), what="the enforcer's samples")
    status = r.status()
    assert {m["state"] for m in status.values()} == {"RUNNING"}
    for m in status.values():
        assert 0 < m["rss_bytes"] < m["quota_hard_bytes"]


def test_calibrate_round_trip(tmp_path: Path, run_cli) -> None:
    models(tmp_path)
    stack = tmp_path / "stack.toml"
    stack.write_text(stack_text((free_port(), free_port())))
    code, out, err = run_cli("calibrate", str(stack), "chat")
    assert code == 0, err
    calib = json.loads((tmp_path / "stack.calibration.json").read_text())["models"]["chat"]
    assert calib["flags"] == {
        "runtime": "llama-cpp-python",
        "context": 512,
        "parallel": 1,
        "ubatch": 512,
        "kv_cache": "f16",
        "flash_attn": True,
        "mmap": True,
        "mlock": False,
        "kind": "cpu",
    }
    buffers = calib["measured"]["buffers"]["CPU"]
    code, out, _ = run_cli("check", str(stack), "--format", "json")
    chat = json.loads(out)["models"]["chat"]
    assert chat["source"] == "measured" and chat["kv_bytes"] == buffers["kv"]
    assert chat["compute_bytes"] == buffers["compute"] + buffers["output"]
    # the estimate it replaced agrees with llama.cpp's own report
    assert abs(chat["weights_bytes"] - calib["header"]["tensor_bytes"]) <= 0.01 * MiB
    # a changed flag invalidates the measurement (and says what changed)
    stack.write_text(stack.read_text().replace("context = 512", "context = 1024"))
    code, out, err = run_cli("check", str(stack), "--format", "json")
    report = json.loads(out)
    assert report["models"]["chat"]["source"] == "gguf"
    line = stack.read_text().splitlines().index("[models.chat]") + 1
    assert f"{stack}:{line}:1: models.chat: calibration ignored: context 512 -> 1024" in report["warnings"]
    # without the weights (a CI runner), the lock still gives exact sizes
    (tmp_path / "chat.gguf").rename(tmp_path / "elsewhere.gguf")
    code, out, _ = run_cli("check", str(stack), "--format", "json")
    report = json.loads(out)
    assert report["models"]["chat"]["source"] == "lock"
    assert report["models"]["chat"]["weights_bytes"] == calib["header"]["tensor_bytes"]
    # a different file under the same name: the lock is not trusted
    write_tiny_gguf(
        tmp_path / "chat.gguf", TinySpec(n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_vocab=2000)
    )
    code, out, _ = run_cli("check", str(stack), "--format", "json")
    report = json.loads(out)
    assert report["models"]["chat"]["source"] == "gguf"
    assert any("the calibration file recorded another file (size changed)" in w for w in report["warnings"])


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed: python3 dev.py setup-torch")
def test_example_llama_and_torch_workers(stack) -> None:
    """examples/cpu-llama-torch.toml: real llama.cpp beside a real torch worker using umemc.worker."""
    from tests.runtime.conftest import REPO

    text = (REPO / "examples/cpu-llama-torch.toml").read_text()
    text = text.replace('"models/', f'"{REPO}/examples/models/').replace(
        'cwd = "workers"', f'cwd = "{REPO}/examples/workers"'
    )
    r = stack(text + live_sysctl_table())
    conn = http.client.HTTPConnection("127.0.0.1", 10002, timeout=60)
    conn.request("POST", "/v1/embeddings", body=json.dumps({"input": ["hello", "world"]}))
    reply = json.loads(conn.getresponse().read())
    assert len(reply["data"]) == 2 and len(reply["data"][0]["embedding"]) == 256
    assert complete(10001, "Hello")["choices"]
    live = r.wait_for(
        lambda: json.loads((r.run_dir / "state" / "enforcer.json").read_text())["models"]["embed"]
        if json.loads((r.run_dir / "state" / "enforcer.json").read_text())["models"]["embed"]["reserved_bytes"]
        else None,
        what="the worker's reservation in the enforcer's status",
    )
    assert live["reserved_bytes"] > 4 * MiB  # the embedder's parameters, bound to the model


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed: python3 dev.py setup-torch")
def test_calibrate_a_torch_worker(tmp_path: Path, run_cli) -> None:
    """A torch worker is calibrated by running its own warm-up; its peak then replaces the estimate."""
    from tests.runtime.conftest import REPO

    stack = tmp_path / "stack.toml"
    stack.write_text(
        f'version = 1\nname = "t"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n'
        f'[models.embed]\nruntime = "torch"\narch = "bge-m3"\nquant = "fp32"\nmodule = "embedder"\n'
        f'cwd = "{REPO}/examples/workers"\nport = {free_port()}\n'
    )
    code, out, err = run_cli("check", str(stack), "--format", "json")
    before = json.loads(out)["models"]["embed"]
    assert before["source"] == "arch"
    code, out, err = run_cli("calibrate", str(stack))
    assert code == 0, err
    peak = json.loads((tmp_path / "stack.calibration.json").read_text())["models"]["embed"]["measured"]["peak_bytes"]
    assert 50 * MiB < peak < 2048 * MiB
    code, out, _ = run_cli("check", str(stack), "--format", "json")
    after = json.loads(out)["models"]["embed"]
    assert after["source"] == "measured" and after["estimate_bytes"] == max(
        peak, before["weights_bytes"] + before["overhead_bytes"]
    )
    stack.write_text(stack.read_text().replace('quant = "fp32"', 'quant = "fp16"'))
    code, out, _ = run_cli("check", str(stack), "--format", "json")
    report = json.loads(out)
    assert report["models"]["embed"]["source"] == "arch"
    assert any("calibration ignored: quant 'fp32' -> 'fp16'" in w for w in report["warnings"])
