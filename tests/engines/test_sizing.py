"""vLLM and MLX sized from a Hugging Face model directory: weights from the safetensors headers (written here by
the safetensors library itself; the expected bytes are numpy's own nbytes), the KV cache from config.json by each
engine's allocation rule (hand-computed below), and the stack's checks of such a directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from umemc.catalog.hfdir import NotAModel, read

GiB, MiB = 2**30, 2**20
# a llama-shaped model: 2 layers, hidden 64, 4 heads of 16, 2 KV heads, vocabulary 128, MLP 160
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


def tensors(dtype: type = np.float16) -> dict[str, np.ndarray]:
    out = {"model.embed_tokens.weight": np.zeros((128, 64), dtype), "model.norm.weight": np.ones(64, dtype)}
    for i in range(2):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": np.zeros((64, 64), dtype),
            p + "self_attn.k_proj.weight": np.zeros((32, 64), dtype),
            p + "self_attn.v_proj.weight": np.zeros((32, 64), dtype),
            p + "self_attn.o_proj.weight": np.zeros((64, 64), dtype),
            p + "mlp.gate_proj.weight": np.zeros((160, 64), dtype),
            p + "mlp.up_proj.weight": np.zeros((160, 64), dtype),
            p + "mlp.down_proj.weight": np.zeros((64, 160), dtype),
            p + "input_layernorm.weight": np.ones(64, dtype),
        }
    return out


def model_dir(path: Path, config: dict[str, object] | None = None, shards: int = 1) -> tuple[Path, int]:
    """The directory and its tensors' bytes (numpy's nbytes: the independent figure)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or CONFIG))
    ts = tensors()
    names = sorted(ts)
    if shards == 1:
        save_file(ts, str(path / "model.safetensors"))
    else:
        weight_map = {}
        for k in range(shards):
            part = {n: ts[n] for n in names[k::shards]}
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            save_file(part, str(path / file))
            weight_map |= {n: file for n in part}
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return path, sum(t.nbytes for t in ts.values())


def test_the_weights_are_the_tensors_bytes_the_files_store(tmp_path: Path) -> None:
    path, nbytes = model_dir(tmp_path / "m")
    model = read(path)
    # 128x64 + 64 + 2 x (64x64 + 2x32x64 + 64x64 + 3x160x64 + 64) elements, 2 bytes each
    assert nbytes == 2 * (128 * 64 + 64 + 2 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 160 * 64 + 64))
    assert (model.tensor_bytes, model.n_tensors, model.by_dtype) == (nbytes, 18, {"F16": nbytes})
    # config.json says bfloat16, the files hold float16: the engine is pinned to what the files hold
    assert (model.dtype, model.vocab) == ("float16", 128)
    a = model.attention
    assert (a.n_layer, a.n_kv_head, a.head_dim, a.sliding_window, a.max_position) == (2, 2, 16, None, 2048)


def test_a_sharded_model_is_read_through_its_index(tmp_path: Path) -> None:
    path, nbytes = model_dir(tmp_path / "m", shards=3)
    (path / "stray.safetensors").write_bytes(b"not one of the model's")  # not in the index: not read
    model = read(path)
    assert (model.tensor_bytes, len(model.files), model.n_tensors) == (nbytes, 3, 18)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no-config", "no config.json in {path}: not a Hugging Face model directory"),
        ("no-weights", "no *.safetensors file in {path}"),
        ("short", "{path}/model.safetensors is not a safetensors file (shorter than its header length)"),
        ("huge-header", "{path}/model.safetensors is not a safetensors file (a header of 18446744073709551615 bytes)"),
        ("offsets", "{path}/model.safetensors: tensor 'w' is not described as safetensors describes one"),
        ("missing-shard", "{path}/model.safetensors.index.json names b.safetensors, not in {path} (a download not "
                          "finished?)"),
        ("geometry", "config.json gives no num_hidden_layers and num_attention_heads: not a language model umemc can "
                     "size"),
    ],
)  # fmt: skip
def test_a_directory_that_is_not_a_model_says_why(tmp_path: Path, damage: str, message: str) -> None:
    path, _ = model_dir(tmp_path / "m")
    weights = path / "model.safetensors"
    if damage == "no-config":
        (path / "config.json").unlink()
    elif damage == "no-weights":
        weights.unlink()
    elif damage == "short":
        weights.write_bytes(b"\x01\x00")
    elif damage == "huge-header":
        weights.write_bytes(b"\xff" * 8 + b"{}")
    elif damage == "offsets":
        header = json.dumps({"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 16]}}).encode()
        weights.write_bytes(len(header).to_bytes(8, "little") + header + bytes(32))
    elif damage == "missing-shard":
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "b.safetensors"}}))
    else:
        (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(NotAModel) as exc:
        read(path)
    assert str(exc.value) == message.format(path=path)


def stack(tmp_path: Path, runtime: str, extra: str = "", kind: str = "cpu") -> Path:
    model_dir(tmp_path / "smol")
    path = tmp_path / "stack.toml"
    path.write_text(
        f'version = 1\nname = "eng"\n[platform]\nkind = "{kind}"\nmemory = "16GiB"\nos_reserve = "1GiB"\n'
        f'[models.chat]\nruntime = "{runtime}"\nmodel = "smol"\ncontext = 1000\nparallel = 3\n{extra}'
    )
    return path


def test_vllm_on_the_cpu_is_given_its_kv_cache_in_128_token_blocks(tmp_path: Path, run_cli) -> None:
    code, out, err = run_cli("check", str(stack(tmp_path, "vllm")), "--format", "json")
    chat = json.loads(out)["models"]["chat"]
    # 1000 tokens in 128-token blocks (the CPU backend's): 8 blocks a sequence x 3 sequences + vLLM's null block = 25
    # blocks = 3200 tokens a layer, x 2 layers; each layer-token 2 (k, v) x 2 heads x 16 x 2 bytes = 128 bytes
    assert (code, err) == (0, "")
    assert (chat["source"], chat["weights_bytes"], chat["kv_bytes"]) == ("safetensors", 94400 * 2, 819_200)
    # one prefill step's scores 4 heads x 512 x 1000 x 4 + MLP 3 x 512 x 160 x 2 + logits 3 x 128 x 4
    assert chat["compute_bytes"] == 4 * 512 * 1000 * 4 + 3 * 512 * 160 * 2 + 3 * 128 * 4


def test_vllm_on_a_gpu_is_given_its_kv_cache_in_bytes_and_its_quota_as_its_fraction(tmp_path: Path, run_cli) -> None:
    """In 16-token blocks on a GPU: 63 blocks x 3 sequences + the null block = 190 blocks = 3040 tokens, x 2 layers
    x 128 bytes. Its start-up
    check of free memory is asked for the worker's GPU quota, not vLLM's default 0.9 of the shared pool."""
    path = stack(tmp_path, "vllm", kind="nvidia-unified")
    code, out, _ = run_cli("check", str(path), "--format", "json")
    chat = json.loads(out)["models"]["chat"]
    assert (code, chat["kv_bytes"]) == (0, 778_240)
    assert run_cli("build", str(path), "-o", str(tmp_path / "b"))[0] == 0
    conf = (tmp_path / "b" / "supervisord.conf").read_text()
    assert "--kv-cache-memory-bytes 778240 --block-size 16 --gpu-memory-utilization " in conf
    fraction = float(conf.split("--gpu-memory-utilization ")[1].split()[0])
    hard = chat["gpu_bytes"] * 1.1  # the GPU share with the default 10% quota headroom
    assert hard <= fraction * 16 * GiB <= hard + 16 * GiB / 10_000


def test_mlx_grows_its_cache_in_steps_of_256_tokens(tmp_path: Path, run_cli) -> None:
    code, out, _ = run_cli("check", str(stack(tmp_path, "mlx")), "--format", "json")
    chat = json.loads(out)["models"]["chat"]
    # 1000 tokens -> 4 steps of 256 = 1024; x 2 layers x 3 sequences x 128 bytes = 786,432
    assert (code, chat["kv_bytes"]) == (0, 786_432)
    # its 3 prompts prefilled at once, 512 tokens of each: scores 4 heads x 1536 x 1000 x 4, MLP 3 x 1536 x 160 x 2
    assert chat["compute_bytes"] == 4 * 1536 * 1000 * 4 + 3 * 1536 * 160 * 2


def test_mlx_sliding_layers_keep_their_window(tmp_path: Path, run_cli) -> None:
    path = stack(tmp_path, "mlx")
    cfg = dict(CONFIG, sliding_window=300, layer_types=["sliding_attention", "full_attention"])
    (tmp_path / "smol" / "config.json").write_text(json.dumps(cfg))
    code, out, _ = run_cli("check", str(path), "--format", "json")
    # the full layer 1024 tokens, the sliding one 300; x 3 sequences x 128 bytes
    assert (code, json.loads(out)["models"]["chat"]["kv_bytes"]) == (0, (1024 + 300) * 3 * 128)


def test_the_bundle_pins_what_sizes_each_engine(tmp_path: Path, run_cli) -> None:
    path = stack(tmp_path, "vllm", 'bin = "/opt/vllm/bin/python"\n')
    assert run_cli("build", str(path), "-o", str(tmp_path / "b"))[0] == 0
    conf = (tmp_path / "b" / "supervisord.conf").read_text()
    assert (
        f"/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --model {tmp_path / 'smol'} --served-model-name "
        "chat --host 127.0.0.1 --port 10001 --max-model-len 1000 --max-num-seqs 3 --max-num-batched-tokens 512 "
        "--dtype float16 --kv-cache-dtype auto --kv-cache-memory-bytes 819200 --block-size 128 --enforce-eager"
    ) in conf
    env = dict(
        line.split("=", 1) for line in (tmp_path / "b" / "env" / "chat.env").read_text().splitlines() if "=" in line
    )
    assert (env["HF_HUB_OFFLINE"], env["VLLM_NO_USAGE_STATS"]) == ('"1"', '"1"')
    assert "VLLM_CPU_KVCACHE_SPACE" not in env  # the legacy setting would override the bytes given
    path = stack(tmp_path, "mlx", 'prompt_cache = "64MiB"\nkv_cache = "q8_0"\n')
    assert run_cli("build", str(path), "-o", str(tmp_path / "c"))[0] == 0
    conf = (tmp_path / "c" / "supervisord.conf").read_text()
    assert (
        f"python3 -m mlx_lm.server --model {tmp_path / 'smol'} --host 127.0.0.1 --port 10001 --decode-concurrency 3 "
        "--prompt-concurrency 3 --prefill-step-size 512 --prompt-cache-size 10 --prompt-cache-bytes 67108864 "
        "--kv-bits 8"
    ) in conf


@pytest.mark.parametrize(
    ("runtime", "extra", "message"),
    [
        ("vllm", 'kv_cache = "q4_0"\n', '12:12: models.chat.kv_cache: runtime = "vllm" has no q4_0 cache\n'
         '  hint: use kv_cache = "f16" or "bf16" or "q8_0"'),
        ("vllm", "", None),
    ],
)  # fmt: skip
def test_what_an_engine_cannot_run_is_refused_at_its_key(
    tmp_path: Path, run_cli, runtime: str, extra: str, message: str | None
) -> None:
    path = stack(tmp_path, runtime, extra)
    if message is None:  # a context past what the model was made for
        path.write_text(path.read_text().replace("context = 1000", "context = 4096"))
        message = (
            "10:11: models.chat.context: 4096 tokens is past the 2048 the model was made for "
            "(max_position_embeddings): vLLM refuses to start\n  hint: context = 2048"
        )
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    assert err == f"{path}:{message}\n"


def test_a_file_where_the_directory_goes_is_refused(tmp_path: Path, run_cli) -> None:
    path = stack(tmp_path, "mlx")
    (tmp_path / "one.safetensors").write_bytes(b"")
    path.write_text(path.read_text().replace('model = "smol"', 'model = "one.safetensors"'))
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"{path}:9:9: models.chat.model: not a directory: {tmp_path / 'one.safetensors'}\n"
        '  hint: runtime = "mlx" loads a Hugging Face model directory (config.json and *.safetensors)\n'
    )


def test_init_finds_a_model_directory_for_this_machines_engine(tmp_path: Path, run_cli) -> None:
    """Linux: vLLM (a Mac's init writes mlx); a directory linked into models/ is found too."""
    _, nbytes = model_dir(tmp_path / "elsewhere" / "Tiny-Llama-hf")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "Tiny-Llama-hf").symlink_to(tmp_path / "elsewhere" / "Tiny-Llama-hf")
    code, _, err = run_cli("init", "--models", str(tmp_path / "models"), "-o", str(tmp_path / "stack.toml"))
    assert code == 0, err
    text = (tmp_path / "stack.toml").read_text()
    assert (
        '[models.tiny-llama-hf]\nruntime = "vllm"\nmodel = "models/Tiny-Llama-hf"  # 184.38 KiB of weights: llama, '
        'float16, 2 layers\ncontext = 2048\npriority = 80\nmode = "hot"\n'
    ) in text
    assert nbytes == 188_800  # 184.38 KiB
    code, out, _ = run_cli("check", str(tmp_path / "stack.toml"), "--format", "json")
    assert (code, json.loads(out)["models"]["tiny-llama-hf"]["weights_bytes"]) == (0, nbytes)


def test_kubernetes_runs_vllm_in_its_official_image_and_refuses_mlx(tmp_path: Path, run_cli) -> None:
    import yaml

    path = stack(tmp_path, "vllm", kind="nvidia-discrete")
    path.write_text(path.read_text().replace('os_reserve = "1GiB"', 'os_reserve = "1GiB"\ngpu_window = "8GiB"'))
    code, _, err = run_cli("build", str(path), "--target", "kubernetes", "-o", str(tmp_path / "k"), "--files-later")
    assert code == 0, err
    docs = list(yaml.safe_load_all((tmp_path / "k" / "kubernetes" / "models" / "chat.yaml").read_text()))
    pod = next(d for d in docs if d and d["kind"] == "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert (container["image"], container["command"]) == ("vllm/vllm-openai:v0.32.0", ["python3"])
    assert container["args"][:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path / "smol")]
    path = stack(tmp_path, "mlx", kind="nvidia-discrete")
    path.write_text(path.read_text().replace('os_reserve = "1GiB"', 'os_reserve = "1GiB"\ngpu_window = "8GiB"'))
    code, out, err = run_cli("build", str(path), "--target", "kubernetes", "-o", str(tmp_path / "m"))
    assert (code, out) == (2, "")
    assert err == (
        f'{path}:9:11: models.chat.runtime: runtime = "mlx" cannot run in a container: MLX serves from Apple '
        "silicon's GPU (Metal), which no container reaches\n"
        '  hint: run it with `umemc up` on the Mac, or use runtime = "vllm" or "llama-server" on this cluster\n'
    )
    assert not (tmp_path / "m").exists()
