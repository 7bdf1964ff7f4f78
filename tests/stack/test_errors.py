"""Every kind of invalid stack: one message per independent error `FILE:LINE:COL: key.path: what` (+ hint),
exit code 2, nothing on stdout. Whole messages are asserted, line and column included."""

from __future__ import annotations

from pathlib import Path

import pytest

BASE = """version = 1
name = "t"

[platform]
kind = "cpu"
memory = "16GiB"
"""
M = """
[models.chat]
runtime = "llama-server"
arch = "llama-3-8b"
"""

# every arch preset, as the error lists them (written out: a new preset must show up here)
ARCH_LIST = (
    "bge-m3, deepseek-v2-lite, gemma-3-12b, gemma-3-27b, glm-4.5-air, gpt-oss-120b, gpt-oss-20b, granite-4.0-h-small, "
    "llama-3-70b, llama-3-8b, llama-4-scout, mistral-small-3.2-24b, mixtral-8x7b, phi-4, qwen2-72b, qwen2.5-7b, "
    "qwen2.5-coder-32b, qwen2.5-vl-7b, qwen3-235b-a22b, qwen3-30b-a3b, qwen3-32b, sdxl, whisper-large-v3"
)
CASES: dict[str, tuple[str, str]] = {
    "toml syntax": (BASE + M + "context = \n", "stack.toml:11:11: TOML syntax error: invalid value"),
    # TOML 1.1 allows newlines in an inline table; the parser is held at 1.0 (tomllib's grammar, which the
    # position scanner follows)
    "toml 1.1 inline table": (
        BASE + M + 'env = {\n  A = "1" }\n',
        "stack.toml:11:8: TOML syntax error: invalid initial character for a key part",
    ),
    "toml unclosed header": (
        BASE + "[models.chat\n",
        "stack.toml:7:13: TOML syntax error: expected ']' at the end of a table declaration",
    ),
    "wrong type": (
        BASE + M + 'context = "8192"\n',
        'stack.toml:11:11: models.chat.context: must be an integer (got "8192")',
    ),
    "out of range": (BASE + M + "context = -1\n", "stack.toml:11:11: models.chat.context: must be > 0 (got -1)"),
    "priority above 100": (
        BASE + M + "priority = 101\n",
        "stack.toml:11:12: models.chat.priority: must be <= 100 (got 101)",
    ),
    "unknown key": (
        BASE + M + 'kv_cach = "q8_0"\n',
        "stack.toml:11:1: models.chat.kv_cach: unknown key\n  hint: did you mean 'kv_cache'?",
    ),
    "unknown table near a missing required one": (
        BASE.replace("[platform]", "[plaform]") + M,
        "stack.toml:4:2: plaform: unknown key\n  hint: did you mean 'platform'?",
    ),
    "unknown top-level key": (
        BASE.replace('name = "t"', 'name = "t"\nmodles = 1') + M,
        "stack.toml:3:1: modles: unknown key\n  hint: did you mean 'models'?",
    ),
    "missing required key": (
        BASE + '\n[models.chat]\narch = "llama-3-8b"\n',
        "stack.toml:8:1: models.chat.runtime: required key is missing\n"
        "  hint: one of llama-server, llama-cpp-python, vllm, mlx, whisper-server, comfyui, torch, command",
    ),
    "missing top-level table": (
        BASE,
        "stack.toml:1:1: models: required key is missing\n  hint: add at least one [models.<name>] table",
    ),
    "platform without kind": (
        'version = 1\nname = "t"\n\n[platform]\nmemory = "8GiB"\n' + M,
        "stack.toml:4:1: platform.kind: required key is missing (no preset given)\n"
        "  hint: set preset = one of strix-halo-128, strix-halo-64, apple-silicon-128, apple-silicon-96, "
        "apple-silicon-64, apple-silicon-48, apple-silicon-36, dgx-spark-128, jetson-orin-64, or give kind and memory",
    ),
    "no size source": (
        BASE + '\n[models.chat]\nruntime = "llama-server"\n',
        "stack.toml:8:1: models.chat: no size source: give a model file, an arch preset, or memory\n"
        '  hint: e.g. arch = "llama-3-8b" or memory = "6GiB"',
    ),
    "unknown preset": (
        'version = 1\nname = "t"\n[platform]\npreset = "strix-halo"\n' + M,
        "stack.toml:4:10: platform.preset: must be one of strix-halo-128, strix-halo-64, apple-silicon-128, "
        "apple-silicon-96, apple-silicon-64, apple-silicon-48, apple-silicon-36, dgx-spark-128, jetson-orin-64 "
        "(got \"strix-halo\")\n  hint: did you mean 'strix-halo-64'?",
    ),
    "unknown arch": (
        BASE + '\n[models.chat]\nruntime = "llama-server"\narch = "llama3-8b"\n',
        "stack.toml:10:8: models.chat.arch: must be one of bge-m3, deepseek-v2-lite, gemma-3-12b, gemma-3-27b, "
        "glm-4.5-air, gpt-oss-120b, gpt-oss-20b, granite-4.0-h-small, llama-3-70b, llama-3-8b, llama-4-scout, "
        "mistral-small-3.2-24b, mixtral-8x7b, phi-4, qwen2-72b, qwen2.5-7b, qwen2.5-coder-32b, qwen2.5-vl-7b, "
        'qwen3-235b-a22b, qwen3-30b-a3b, qwen3-32b, sdxl, whisper-large-v3 (got "llama3-8b")\n'
        "  hint: did you mean 'llama-3-8b'?",
    ),
    "arch in capitals": (
        BASE + '\n[models.chat]\nruntime = "llama-server"\narch = "Qwen3-30B-A3B"\n',
        f'stack.toml:10:8: models.chat.arch: must be one of {ARCH_LIST} (got "Qwen3-30B-A3B")\n'
        "  hint: did you mean 'qwen3-30b-a3b'?",
    ),
    "arch of another size": (
        BASE + '\n[models.chat]\nruntime = "llama-server"\narch = "mistral-7b"\n',
        f'stack.toml:10:8: models.chat.arch: must be one of {ARCH_LIST} (got "mistral-7b")\n'
        '  hint: no preset of that name and size for llama-server: give model = "path/to/file" (its header is '
        'read) or memory = "..." (an explicit size)',
    ),
    "arch of another family": (
        BASE + '\n[models.image]\nruntime = "comfyui"\narch = "llama3-8b"\n',
        f'stack.toml:10:8: models.image.arch: must be one of {ARCH_LIST} (got "llama3-8b")\n'
        '  hint: no preset of that name and size for comfyui: give model = "path/to/file" (its header is '
        'read) or memory = "..." (an explicit size)',
    ),
    "unknown quant": (
        BASE + M + 'quant = "Q4_K_X"\n',
        'stack.toml:11:9: models.chat.quant: unknown GGUF file type "Q4_K_X" for runtime = '
        "\"llama-server\"\n  hint: did you mean 'Q4_K_S'?",
    ),
    "unknown torch dtype": (
        BASE + '\n[models.img]\nruntime = "comfyui"\narch = "sdxl"\nquant = "fp8"\n',
        'stack.toml:11:9: models.img.quant: unknown torch dtype "fp8" for runtime = '
        '"comfyui"\n  hint: one of fp32, fp16, bf16, int8',
    ),
    "arch on the wrong runtime": (
        BASE + '\n[models.img]\nruntime = "llama-server"\narch = "sdxl"\n',
        "stack.toml:10:8: models.img.arch: sdxl (diffusion) cannot run on runtime = "
        '"llama-server"\n  hint: use runtime = "comfyui" or "torch"',
    ),
    "unknown runtime": (
        BASE + '\n[models.chat]\nruntime = "llama_server"\narch = "llama-3-8b"\n',
        "stack.toml:9:11: models.chat.runtime: must be one of llama-server, llama-cpp-python, "
        'vllm, mlx, whisper-server, comfyui, torch, command (got "llama_server")\n'
        "  hint: did you mean 'llama-server'?",
    ),
    "duplicate port": (
        BASE + M + 'port = 9000\n[models.code]\nruntime = "llama-server"\narch = "llama-3-8b"\nport = 9000\n',
        "stack.toml:15:8: models.code.port: port 9000 is already used by models.chat.port",
    ),
    "port used by the gateway": (
        BASE + "\n[gateway]\nport = 9000\n" + M + "port = 9000\n",
        "stack.toml:14:8: models.chat.port: port 9000 is already used by gateway.port",
    ),
    "bad model name": (
        BASE + '\n[models.Chat]\nruntime = "llama-server"\narch = "llama-3-8b"\n',
        'stack.toml:8:9: models.Chat: bad model name "Chat": must match ^[a-z][a-z0-9_-]{0,62}$\n'
        "  hint: it becomes a supervisord program name and a file name: lowercase letters, digits, "
        "'-' and '_', starting with a letter",
    ),
    "stack name escaping its directory": (
        BASE.replace('name = "t"', 'name = "../etc"') + M,
        'stack.toml:2:8: name: must match ^[a-z][a-z0-9_-]{0,62}$ (got "../etc")\n'
        "  hint: lowercase letters, digits, '-' and '_', starting with a letter; it becomes a directory and "
        "supervisord program name",
    ),
    "env key not a variable name": (
        BASE + M + '[models.chat.env]\n"1BAD" = "x"\n',
        "stack.toml:12:1: models.chat.env.1BAD: not a valid environment variable "
        "name: \"1BAD\"\n  hint: letters, digits and '_', not starting with a digit",
    ),
    "env value with a newline": (
        BASE + M + '[models.chat.env]\nGOOD = "a\\nb"\n',
        "stack.toml:12:8: models.chat.env.GOOD: contains a control character (U+000A, a "
        "newline)\n  hint: generated files (supervisord.conf, sysctl.d, env files) are "
        "line-based: newlines, tabs and other control characters cannot be carried",
    ),
    "load_below >= evict_above": (
        BASE + "\n[policy]\nload_below = 0.9\nevict_above = 0.8\n" + M,
        "stack.toml:9:14: policy.load_below: must be below evict_above (0.9 >= 0.8)\n"
        "  hint: the gap between them is the hysteresis that stops load/evict oscillation",
    ),
    "os_reserve >= memory": (
        BASE + 'os_reserve = "16GiB"\n' + M,
        "stack.toml:7:14: platform.os_reserve: must be less than memory (16.00 GiB >= 16.00 GiB)",
    ),
    "unsupported version": (
        BASE.replace("version = 1", "version = 2") + M,
        "stack.toml:1:11: version: unsupported version 2\n  hint: this umemc reads version = 1",
    ),
    "bad size": (
        BASE.replace('"16GiB"', '"16 gigs"') + M,
        'stack.toml:6:10: platform.memory: not a size (got "16 gigs")\n'
        '  hint: write bytes as an integer or a string with a unit: "512MiB", "8GiB", "1.5GB"',
    ),
    "bad bool": (
        BASE + M + 'flash_attn = "yes"\n',
        'stack.toml:11:14: models.chat.flash_attn: must be true or false (got "yes")',
    ),
    "duration without unit": (
        BASE + "\n[policy]\nsample_interval = 100\n" + M,
        "stack.toml:9:19: policy.sample_interval: not a duration (got 100)\n"
        '  hint: write a number with a unit: "100ms", "30s", "10m", "1h"',
    ),
    "command without memory": (
        BASE + '\n[models.w]\nruntime = "command"\ncommand = ["python", "-m", "w"]\n',
        'stack.toml:8:1: models.w.memory: required key is missing for runtime = "command"\n'
        '  hint: nothing else tells its size: memory = "4GiB"',
    ),
    "inline table value": (
        BASE + '\n[models]\nchat = { runtime = "llama-server", arch = "llama-3-8b", context = 0 }\n',
        "stack.toml:9:67: models.chat.context: must be > 0 (got 0)",
    ),
    "dotted key value": (
        BASE + '\n[models]\nchat.runtime = "llama-server"\nchat.arch = "llama-3-8b"\nchat.parallel = 0\n',
        "stack.toml:11:17: models.chat.parallel: must be > 0 (got 0)",
    ),
    "array item": (
        BASE + M + 'args = ["--jinja", 3]\n',
        "stack.toml:11:20: models.chat.args[1]: must be a string (got 3)",
    ),
    "gateway off loopback without a token": (
        BASE + '\n[gateway]\nhost = "0.0.0.0"\n' + M,
        "stack.toml:9:8: gateway.host: binding 0.0.0.0 needs a token\n"
        '  hint: set token_env = "NAME_OF_AN_ENV_VAR" holding the bearer token',
    ),
    "gateway host that could inject config": (
        BASE + '\n[gateway]\nhost = "127.0.0.1 ;[program:x]"\n' + M,
        "stack.toml:9:8: gateway.host: not an IP address or host name: "
        '"127.0.0.1 ;[program:x]"\n'
        '  hint: e.g. "127.0.0.1" (default), "0.0.0.0" or "::"',
    ),
    "port used by the default gateway": (
        BASE + M + "port = 10000\n",
        "stack.toml:11:8: models.chat.port: port 10000 is already used by gateway.port",
    ),
    "gateway queue_timeout": (
        BASE + '\n[gateway]\nqueue_timeout = "0s"\n' + M,
        "stack.toml:9:17: gateway.queue_timeout: must be > 0.0 (got 0.0)",
    ),
    "llama-cpp-python with parallel slots": (
        BASE + '\n[models.c]\nruntime = "llama-cpp-python"\narch = "llama-3-8b"\nparallel = 2\n',
        "stack.toml:11:12: models.c.parallel: llama-cpp-python serves one "
        'sequence (got 2)\n  hint: use runtime = "llama-server" for parallel '
        "slots",
    ),
}


@pytest.mark.parametrize("text,expected", CASES.values(), ids=CASES.keys())
def test_invalid_stack_gives_one_located_message(tmp_path: Path, run_cli, text: str, expected: str) -> None:
    (tmp_path / "stack.toml").write_text(text)
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out, err) == (2, "", expected + "\n")


def test_model_file_not_gguf(tmp_path: Path, run_cli) -> None:
    (tmp_path / "notes.txt").write_text("not weights")
    (tmp_path / "stack.toml").write_text(BASE + '\n[models.chat]\nruntime = "llama-server"\nmodel = "notes.txt"\n')
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err == (
        f"stack.toml:10:9: models.chat.model: not a GGUF file: {tmp_path / 'notes.txt'}\n"
        "  hint: llama.cpp runtimes load .gguf files\n"
    )


def test_model_file_missing_without_fallback(tmp_path: Path, run_cli) -> None:
    (tmp_path / "stack.toml").write_text(BASE + '\n[models.chat]\nruntime = "llama-server"\nmodel = "gone.gguf"\n')
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err == (
        f"stack.toml:10:9: models.chat.model: file not found: {tmp_path / 'gone.gguf'}\n"
        '  hint: give arch = "<preset>" as a fallback, or memory = "…"\n'
    )


def test_corrupt_gguf_header(tmp_path: Path, run_cli) -> None:
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 20)
    (tmp_path / "stack.toml").write_text(BASE + '\n[models.chat]\nruntime = "llama-server"\nmodel = "bad.gguf"\n')
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err.startswith("stack.toml:10:9: models.chat.model: cannot read the GGUF header: ")
    assert err.count("\n") == 1


def test_gguf_claiming_a_billion_layers_is_refused_not_sized(tmp_path: Path, run_cli) -> None:
    # a header's block count sizes every per-layer table: a lying file (a download, a Hub repository) must not make
    # umemc build a billion-entry one (it ran out of memory); it is an unreadable header, at the model's key
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(tmp_path / "huge.gguf"), "llama")
    for key, value in (("block_count", 1_000_000_000), ("embedding_length", 256), ("attention.head_count", 4)):
        w.add_uint32(f"llama.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((100, 256), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (tmp_path / "stack.toml").write_text(BASE + '\n[models.chat]\nruntime = "llama-server"\nmodel = "huge.gguf"\n')
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (
        2,
        "",
        "stack.toml:10:9: models.chat.model: cannot read the GGUF header: llama.block_count is 1000000000: not a "
        "layer count umemc can size (1 to 4096)\n",
    )


@pytest.mark.parametrize(
    ("strings", "tensor", "said"),
    [
        (  # a count read for the shape: the key is named
            {"interleave_moe_layer_step": "abc"},
            "blk.0.attn_q.weight",
            "llama4.interleave_moe_layer_step is 'abc': not a number",
        ),
        ({"embedding_length": "wide"}, "blk.0.attn_q.weight", "llama4.embedding_length is 'wide': not a number"),
        (  # read beside the shape (which layers llama.cpp skips)
            {"nextn_predict_layers": "abc"},
            "blk.0.attn_q.weight",
            "it holds a value no model file has (invalid literal for int() with base 10: 'abc')",
        ),
        ({}, "blk.x.attn_q.weight", "it holds a value no model file has (invalid literal for int() with base 10: 'x')"),
    ],
)
def test_gguf_header_values_of_the_wrong_type_are_an_unreadable_header(
    tmp_path: Path, run_cli, strings: dict[str, str], tensor: str, said: str
) -> None:
    # a header is a file's claim (a download, a Hub repository): a string where llama.cpp reads a count, or a block
    # tensor whose number is no number, is refused at the model's key like any unreadable header, not an internal
    # error
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "llama4")
    numbers = {"block_count": 4, "embedding_length": 256, "attention.head_count": 4, "expert_count": 4}
    for key, value in (numbers | {"expert_used_count": 1, "expert_feed_forward_length": 128}).items():
        if key not in strings:
            w.add_uint32(f"llama4.{key}", value)
    for key, text in strings.items():
        w.add_string(f"llama4.{key}", text)
    w.add_tensor("token_embd.weight", np.zeros((100, 256), dtype=np.float32))
    w.add_tensor(tensor, np.zeros((256, 256), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (tmp_path / "stack.toml").write_text(BASE + '\n[models.chat]\nruntime = "llama-server"\nmodel = "odd.gguf"\n')
    expected = f"stack.toml:10:9: models.chat.model: cannot read the GGUF header: {said}\n"
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (2, "", expected)


def test_missing_stack_file(tmp_path: Path, run_cli) -> None:
    assert run_cli("check", "nope.toml", cwd=tmp_path) == (2, "", "nope.toml: no such file\n")


def test_invalid_utf8(tmp_path: Path, run_cli) -> None:
    (tmp_path / "stack.toml").write_bytes(b'version = 1\nname = "\xff"\n')
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (
        2,
        "",
        "stack.toml:2:9: not valid UTF-8 (TOML files are UTF-8)\n",
    )


def test_bad_arguments_exit_2(tmp_path: Path, run_cli) -> None:
    assert run_cli("check", "x.toml", "--format", "yaml", cwd=tmp_path) == (
        2,
        "",
        "usage: umemc check [-h] [--format {table,json,markdown}] [--measure]\n                   stack [stack ...]\n"
        "umemc check: error: argument --format: invalid choice: 'yaml' (choose from 'table', 'json', 'markdown')\n",
    )


def test_every_independent_error_is_said_each_located(tmp_path: Path, run_cli) -> None:
    """Three mistakes in three models: the unknown key first (it explains the missing runtime beside it, not said
    again), then the others in the file's order."""
    text = (
        BASE
        + '[models.a]\nruntime = "command"\ncommand = ["true"]\nmemory = "1GiB"\npriority = "high"\n'
        + '[models.b]\nruntime = "command"\ncommand = ["true"]\nmemory = "1GiB"\nparallel = 0\n'
        + '[models.c]\nruntmie = "command"\ncommand = ["true"]\nmemory = "1GiB"\n'
    )
    (tmp_path / "stack.toml").write_text(text)
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (
        2,
        "",
        "stack.toml:18:1: models.c.runtmie: unknown key\n"
        "  hint: did you mean 'runtime'?\n"
        'stack.toml:11:12: models.a.priority: must be an integer (got "high")\n'
        "stack.toml:16:12: models.b.parallel: must be > 0 (got 0)\n",
    )


def test_errors_past_twenty_are_counted_not_said(tmp_path: Path, run_cli) -> None:
    text = BASE + "".join(
        f'[models.m{i}]\nruntime = "command"\ncommand = ["true"]\nmemory = "1GiB"\npriority = "x"\n' for i in range(25)
    )
    (tmp_path / "stack.toml").write_text(text)
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert len(lines) == 21 and lines[-1] == "… and 5 more"
    assert lines[0] == 'stack.toml:11:12: models.m0.priority: must be an integer (got "x")'
