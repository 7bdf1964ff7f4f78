"""What each worker is started with: argv per runtime (every memory-relevant flag pinned),
environment by platform and policy, VM tunables with overrides."""

from __future__ import annotations

import sys
from pathlib import Path

from umemc.budget.plan import make_plan
from umemc.compile.bundle import compile_bundle
from umemc.stack.resolve import load_stack

HEAD = """version = 1
name = "c"
[platform]
{platform}
"""


def bundle(write_stack, platform: str, models: str, extra: str = ""):  # type: ignore[no-untyped-def]
    return compile_bundle(make_plan(load_stack(write_stack(HEAD.format(platform=platform) + extra + models))))


def test_llama_server_argv(write_stack, tmp_path: Path) -> None:
    b = bundle(
        write_stack,
        'preset = "strix-halo-128"',
        """
[models.chat]
runtime = "llama-server"
model = "m.gguf"
arch = "llama-3-8b"
context = 4096
parallel = 3
ubatch = 256
kv_cache = "q8_0"
mlock = true
args = ["--jinja"]
port = 9100
""",
    )
    assert b.programs["chat"].argv == (
        "llama-server",
        "-m",
        str(tmp_path / "m.gguf"),
        "-c",
        "12288",
        "-np",
        "3",
        "-ub",
        "256",
        "-b",
        "2048",
        "-fa",
        "on",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-ngl",
        "999",
        "--load-mode",
        "mlock",
        "--fit",
        "off",
        "--log-verbosity",
        "4",
        "--alias",
        "chat",
        "--cache-ram",  # llama-server's prompt cache in host memory: off unless prompt_cache gives it room
        "0",
        "--slot-save-path",
        "@UMEMC_STATE@/slots/chat",
        "--host",
        "127.0.0.1",
        "--port",
        "9100",
        "-t",  # its share of the preset's 16 cores: the only llama.cpp worker, all of them
        "16",
        "--jinja",
    )
    assert b.programs["chat"].health == "/health"


def test_a_model_that_uses_no_gpu_keeps_every_layer_on_the_cpu(write_stack) -> None:
    """gpu = false on a GPU box: -ngl 0 (llama-server) and --n_gpu_layers 0 (llama-cpp-python), nothing in the GPU
    window, and llama.cpp's CPU repack counted as on a CPU machine (mmap'd: the copy beside the file's pages)."""
    models = """
[models.a]
runtime = "llama-server"
model = "a.gguf"
arch = "qwen2.5-7b"
gpu = false
mmap = true
[models.b]
runtime = "llama-cpp-python"
model = "b.gguf"
arch = "qwen2.5-7b"
gpu = false
"""
    b = bundle(write_stack, 'preset = "strix-halo-128"', models)
    argv_a, argv_b = b.programs["a"].argv, b.programs["b"].argv
    assert argv_a[argv_a.index("-ngl") + 1] == "0"
    assert argv_b[argv_b.index("--n_gpu_layers") + 1] == "0"
    plan = b.plan
    assert plan.models["a"].gpu_quota_hard == 0 and plan.models["b"].gpu_quota_hard == 0
    assert any(p.name == "repacked copy" for p in plan.models["a"].estimate.weights.parts)


def test_llama_cpp_python_argv_on_cpu(write_stack, tmp_path: Path) -> None:
    b = bundle(
        write_stack,
        'kind = "cpu"\nmemory = "8GiB"',
        """
[models.emb]
runtime = "llama-cpp-python"
arch = "bge-m3"
context = 1024
ubatch = 1024
flash_attn = false
""",
    )
    assert b.programs["emb"].argv == (
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--n_ctx",
        "1024",
        "--n_ubatch",
        "1024",
        "--n_batch",
        "1024",
        "--flash_attn",
        "false",
        "--type_k",
        "1",
        "--type_v",
        "1",
        "--use_mmap",
        "true",
        "--use_mlock",
        "false",
        "--n_gpu_layers",
        "0",
        "--logits_all",
        "false",
        "--embedding",
        "true",
        "--model_alias",
        "emb",
        "--host",
        "127.0.0.1",
        "--port",
        "10001",
    )
    assert b.programs["emb"].health == "/v1/models"


def test_other_runtimes_argv(write_stack, tmp_path: Path) -> None:
    b = bundle(
        write_stack,
        'preset = "apple-silicon-128"',
        """
[models.speech]
runtime = "whisper-server"
arch = "whisper-large-v3"
bin = "/opt/whisper/bin/whisper-server"
[models.img]
runtime = "comfyui"
arch = "sdxl"
cwd = "ComfyUI"
[models.emb]
runtime = "torch"
arch = "bge-m3"
module = "my.worker"
args = ["--fast"]
[models.tool]
runtime = "command"
command = ["tool", "--listen", "127.0.0.1:{port}"]
memory = "1GiB"
[models.batch]
runtime = "command"
command = ["batch-job"]
memory = "1GiB"
""",
    )
    p = b.programs
    assert p["speech"].argv == (
        "/opt/whisper/bin/whisper-server",
        "--best-of",
        "1",
        "--beam-size",
        "1",
        "--flash-attn",
        "--host",
        "127.0.0.1",
        "--port",
        "10001",
    )
    # --reserve-vram: the 107.5 GiB wired limit (115427246080 bytes) less the SDXL worker's hard quota of
    # 11139022848 bytes (its budget row), in GiB: 97.126 -> "97.13"
    assert b.plan.models["img"].quota_hard == 11139022848
    assert p["img"].argv == (
        "python3",
        "main.py",
        "--listen",
        "127.0.0.1",
        "--port",
        "10002",
        "--reserve-vram",
        "97.13",
    )
    assert p["img"].cwd == str(tmp_path / "ComfyUI")
    assert p["emb"].argv == (sys.executable, "-m", "my.worker", "--fast")
    assert p["tool"].argv == ("tool", "--listen", "127.0.0.1:10004") and p["tool"].health is None
    assert p["batch"].port is None and "UMEMC_PORT" not in dict(p["batch"].env)


def test_environment_by_platform_and_policy(write_stack) -> None:
    models = """
[models.chat]
runtime = "llama-server"
arch = "llama-3-8b"
[models.chat.env]
OMP_NUM_THREADS = "2"
[models.img]
runtime = "comfyui"
arch = "sdxl"
"""
    amd = bundle(write_stack, 'preset = "strix-halo-128"', models, "[policy]\nhsa_enable_sdma = true\n")
    env = dict(amd.programs["chat"].env)
    assert env == {
        "UMEMC_MODEL": "chat",
        # llama-3-8b's estimate (the budget row): its weights, KV and compute, and llama-server's process of 24 MiB
        # and 96 bytes for each of its 128,256 tokens (37,478,400 bytes; the figure was a flat 150 MiB, which made
        # it 6212596736); its compute is the buffer llama-server reserves for Llama-3-8B at 8K (124.01 MiB as it
        # prints it, tests/recorded/reserve-buffers.json: 12,320 bytes above the formula it replaced, which made
        # 6092788736); hard = 6092801056 x 1.1 = 6702081161.6, up to a MiB: 6392 MiB
        "UMEMC_QUOTA_SOFT_BYTES": "6092801056",
        "UMEMC_QUOTA_HARD_BYTES": "6702497792",
        "UMEMC_PORT": "10001",
        "UMEMC_HOST": "127.0.0.1",  # the address to bind under supervisord
        "UMEMC_GATEWAY_URL": "http://127.0.0.1:10000",  # where a worker asks for leases
        "HSA_ENABLE_SDMA": "1",
        "HIP_VISIBLE_DEVICES": "0",
        "ROCR_VISIBLE_DEVICES": "0",
        "OMP_NUM_THREADS": "2",
    }  # env wins
    assert (
        dict(amd.programs["img"].env)["PYTORCH_HIP_ALLOC_CONF"]
        == "expandable_segments:True,garbage_collection_threshold:0.8"
    )
    assert dict(amd.programs["img"].env)["OMP_NUM_THREADS"] == "8"  # 16 cores / 2 hot workers
    apple = bundle(write_stack, 'preset = "apple-silicon-128"', models)
    # the watermarks are fractions of the wired limit (115427246080 bytes): 11139022848 / it = 0.09650 (hard),
    # 10126016512 / it = 0.08773 (soft)
    assert dict(apple.programs["img"].env)["PYTORCH_MPS_HIGH_WATERMARK_RATIO"] == "0.0965"
    assert dict(apple.programs["img"].env)["PYTORCH_MPS_LOW_WATERMARK_RATIO"] == "0.0877"
    assert "HSA_ENABLE_SDMA" not in dict(apple.programs["chat"].env)
    spark = bundle(write_stack, 'preset = "dgx-spark-128"', models)
    # not set on GB10: managed memory may be missing from the per-process figure the quota reads (docs/PLATFORMS.md)
    assert "GGML_CUDA_ENABLE_UNIFIED_MEMORY" not in dict(spark.programs["chat"].env)
    assert dict(spark.programs["img"].env)["PYTORCH_CUDA_ALLOC_CONF"].startswith("expandable_segments:True")


def test_sysctl_overrides_and_additions(write_stack) -> None:
    b = bundle(
        write_stack,
        'kind = "cpu"\nmemory = "64GiB"',
        '[models.a]\nruntime = "llama-server"\narch = "phi-4"\n',
        '[sysctl]\n"vm.swappiness" = 1\n"kernel.numa_balancing" = 0\n',
    )
    assert [(t.key, t.value) for t in b.sysctl] == [
        ("vm.swappiness", 1),
        ("vm.overcommit_memory", 0),
        ("vm.vfs_cache_pressure", 50),
        ("vm.min_free_kbytes", 262144),
        ("vm.watermark_scale_factor", 125),
        ("vm.max_map_count", 262144),
        ("kernel.numa_balancing", 0),
    ]
    assert b.sysctl[0].why == "overridden (umemc's default: 10)"
    assert b.ttm_pages is None and b.wired_limit_mb is None and not b.memlock


def test_a_prompt_cache_is_given_its_room_and_counted(write_stack, run_cli, tmp_path: Path) -> None:
    """prompt_cache = "512MiB": llama-server gets --cache-ram 512 and the model's overhead grows by 512 MiB (the
    process part stays 24 MiB and 96 bytes for each of llama-3-8b's 128,256 tokens); --cache-ram in args is
    refused (its memory would go uncounted)."""
    models = (
        '\n[models.chat]\nruntime = "llama-server"\nmodel = "m.gguf"\narch = "llama-3-8b"\nprompt_cache = "512MiB"\n'
    )
    b = bundle(write_stack, 'preset = "strix-halo-128"', models)
    argv = b.programs["chat"].argv
    assert argv[argv.index("--cache-ram") + 1] == "512"
    overhead = b.plan.models["chat"].estimate.overhead
    assert [(p.name, p.bytes) for p in overhead.parts] == [
        ("process", 24 * 2**20 + 128256 * 96),
        ("prompt cache", 512 * 2**20),
        ("gpu context", 457 * 2**20),
    ]
    write_stack(HEAD.format(platform='preset = "strix-halo-128"') + models + 'args = ["--cache-ram", "4096"]\n')
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err == (
        "stack.toml:11:8: models.chat.args: --cache-ram in args: its memory would not be counted\n"
        '  hint: give prompt_cache = "…" instead\n'
    )


def test_llama_cpp_workers_share_the_cores_by_priority(write_stack) -> None:
    """The preset's 16 cores among the llama.cpp workers that run at once: hot ones by priority (90 and 60: 9.6 and
    6.4, rounded to 10 and 6); a cold one as it joins them (80 of 230: 5.6, so 6); a torch worker is no llama.cpp
    worker and takes none of the share. A stack that names no cores gets llama.cpp's own default (no -t)."""
    models = (
        "".join(
            f'\n[models.{n}]\nruntime = "llama-server"\narch = "llama-3-8b"\npriority = {p}\nmode = "{mode}"\n'
            for n, p, mode in (("a", 90, "hot"), ("b", 60, "hot"), ("c", 80, "cold"))
        )
        + '\n[models.t]\nruntime = "torch"\nmodule = "w"\narch = "sdxl"\npriority = 99\n'
    )
    b = bundle(write_stack, 'preset = "strix-halo-128"', models)
    got = {n: b.programs[n].argv[b.programs[n].argv.index("-t") + 1] for n in ("a", "b", "c")}
    assert got == {"a": "10", "b": "6", "c": "6"}
    b = bundle(write_stack, 'kind = "cpu"\nmemory = "64GiB"', models)
    assert all("-t" not in b.programs[n].argv for n in ("a", "b", "c"))
