"""`chat_template`: a chat model whose GGUF has no template is warned about at its key; a built-in name or a Jinja file
reaches the runtime in its own spelling; a name no llama.cpp knows, a missing file or a runtime without templates is
refused, located."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.realmodels import GEMMA3, SMOLLM2, needs_models
from umemc.testing.tinygguf import NO_TEMPLATE, TinySpec, write_tiny_gguf

HEAD = 'version = 1\nname = "t"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n'
TINY = TinySpec(n_layer=2, n_embd=64, n_ff=128, n_head=2, n_head_kv=1, n_vocab=300, chat_template=NO_TEMPLATE)


def stack(tmp_path: Path, model: str, extra: str = "", runtime: str = "llama-server") -> Path:
    (tmp_path / "stack.toml").write_text(f'{HEAD}\n[models.chat]\nruntime = "{runtime}"\nmodel = "{model}"\n{extra}')
    return tmp_path / "stack.toml"


def built_argv(tmp_path: Path, run_cli, name: str = "chat") -> list[str]:
    code, _, err = run_cli("build", "stack.toml", "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert code == 0, err
    return json.loads((tmp_path / "out" / "plan.json").read_text())["models"][name]["argv"]


def test_a_file_without_a_template_is_warned_at_its_model(tmp_path: Path, run_cli) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", TINY)  # the gguf package writes no tokenizer.chat_template
    stack(tmp_path, "tiny.gguf")
    code, _, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 0
    assert err == (
        "warning: stack.toml:7:1: models.chat: the GGUF file has no chat template (tokenizer.chat_template) and the "
        "stack sets none: llama.cpp falls back to ChatML and chat answers may be garbage; set chat_template to a "
        "llama.cpp built-in name (llama-server --help lists them) or a .jinja file\n"
    )


def test_the_hint_names_the_template_an_architecture_clearly_uses(tmp_path: Path, run_cli) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec("qwen2", 2, 64, 128, 2, 1, 300, chat_template=NO_TEMPLATE))
    stack(tmp_path, "tiny.gguf")
    _, _, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert err.endswith('; set chat_template = "chatml" (llama.cpp\'s built-in template for qwen2)\n')


@pytest.mark.parametrize(
    "extra", ['chat_template = "chatml"\n', 'kind = "embeddings"\n', 'args = ["--chat-template", "zephyr"]\n']
)
def test_no_warning_where_a_template_is_given_or_nobody_chats(tmp_path: Path, run_cli, extra: str) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", TINY)
    stack(tmp_path, "tiny.gguf", extra)
    code, _, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert (code, err) == (0, "")


def test_a_built_in_name_and_a_file_reach_llama_server(tmp_path: Path, run_cli) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", TINY)
    stack(tmp_path, "tiny.gguf", 'chat_template = "gemma"\n')
    argv = built_argv(tmp_path, run_cli)
    # llama.cpp applies a built-in name with its own formatter, which runs only with Jinja off, and a server with
    # Jinja off refuses every request with tools: Gemma's format goes as Jinja text (llama.cpp's formatter and this
    # text format a chat alike: tests/runtime/test_chat_templates.py), Jinja on
    given = argv[argv.index("--chat-template") + 1]
    assert "--no-jinja" not in argv and "--jinja" not in argv
    assert given.startswith("{%- set ns = namespace(") and "'<start_of_turn>'" in given and "\n" not in given
    # a name umemc has no Jinja for keeps llama.cpp's formatter, and check says what that costs, at its key
    stack(tmp_path, "tiny.gguf", 'chat_template = "vicuna"\n')
    argv = built_argv(tmp_path, run_cli)
    at = argv.index("--chat-template")
    assert argv[at - 1 : at + 2] == ["--no-jinja", "--chat-template", "vicuna"]
    code, _, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert (code, err) == (
        0,
        'warning: stack.toml:10:17: models.chat.chat_template: llama-server applies the built-in template "vicuna" '
        "only with Jinja off, and then refuses every request that carries tools (agents send them); umemc keeps "
        "Jinja on for chatml, gemma, llama3, phi3, zephyr: give the model's own template as a .jinja file to keep "
        "tool calling\n",
    )
    stack(tmp_path, "tiny.gguf", 'chat_template = "gemma"\n')
    argv = built_argv(tmp_path, run_cli)
    assert argv[argv.index("--alias") + 1] == "chat"  # its answers say "chat", not the file's name
    (tmp_path / "tmpl").mkdir()
    (tmp_path / "tmpl" / "mine.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    stack(tmp_path, "tiny.gguf", 'chat_template = "tmpl/mine.jinja"\n')
    argv = built_argv(tmp_path, run_cli)
    assert argv[argv.index("--chat-template-file") + 1] == str(tmp_path / "tmpl" / "mine.jinja")
    assert "--chat-template" not in argv


def test_llama_cpp_python_gets_its_own_name_for_the_format(tmp_path: Path, run_cli) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", TINY)
    stack(tmp_path, "tiny.gguf", 'chat_template = "llama3"\n', runtime="llama-cpp-python")
    argv = built_argv(tmp_path, run_cli)
    assert argv[argv.index("--chat_format") + 1] == "llama-3"
    assert argv[argv.index("--model_alias") + 1] == "chat"


CASES = {
    "a misspelt name": (
        'chat_template = "chatm"\n',
        "llama-server",
        'stack.toml:10:17: models.chat.chat_template: not a llama.cpp built-in chat template: "chatm"\n'
        '  hint: did you mean "chatml"?\n',
    ),
    "a missing file": (
        'chat_template = "gone.jinja"\n',
        "llama-server",
        "stack.toml:10:17: models.chat.chat_template: no template file at {tmp}/gone.jinja\n",
    ),
    "a directory": (
        'chat_template = "tmpl/"\n',
        "llama-server",
        "stack.toml:10:17: models.chat.chat_template: no template file at {tmp}/tmpl (a directory)\n",
    ),
    "a name llama-cpp-python lacks": (
        'chat_template = "phi4"\n',
        "llama-cpp-python",
        'stack.toml:10:17: models.chat.chat_template: llama-cpp-python\'s server has no built-in template "phi4"\n'
        "  hint: one of chatglm3, chatml, gemma, llama2, llama3, mistral-v1, openchat, vicuna, zephyr, or runtime = "
        '"llama-server"\n',
    ),
    "a file for llama-cpp-python": (
        'chat_template = "t.jinja"\n',
        "llama-cpp-python",
        "stack.toml:10:17: models.chat.chat_template: llama-cpp-python's server takes no template file, only a "
        "built-in name\n  hint: one of chatglm3, chatml, gemma, llama2, llama3, mistral-v1, openchat, vicuna, "
        'zephyr, or runtime = "llama-server"\n',
    ),
}


@pytest.mark.parametrize("extra,runtime,expected", CASES.values(), ids=CASES.keys())
def test_a_template_that_cannot_be_applied_is_refused(
    tmp_path: Path, run_cli, extra: str, runtime: str, expected: str
) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", TINY)
    (tmp_path / "tmpl").mkdir()
    stack(tmp_path, "tiny.gguf", extra, runtime)
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out, err) == (2, "", expected.format(tmp=tmp_path))


def test_a_runtime_without_templates_refuses_the_key(tmp_path: Path, run_cli) -> None:
    (tmp_path / "stack.toml").write_text(
        f'{HEAD}\n[models.w]\nruntime = "command"\ncommand = ["true"]\nmemory = "1GiB"\nchat_template = "chatml"\n'
    )
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out, err) == (
        2,
        "",
        'stack.toml:11:17: models.w.chat_template: runtime = "command" takes no chat template\n'
        "  hint: only llama.cpp runtimes apply one\n",
    )


@needs_models
def test_the_real_models_gemma3_has_no_template_smollm2_has_one(tmp_path: Path, run_cli) -> None:
    (tmp_path / "stack.toml").write_text(
        f'{HEAD}\n[models.gemma3]\nruntime = "llama-server"\nmodel = "{GEMMA3}"\n'
        f'\n[models.smollm2]\nruntime = "llama-server"\nmodel = "{SMOLLM2}"\n'
    )
    code, _, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 0
    assert err == (
        "warning: stack.toml:7:1: models.gemma3: the GGUF file has no chat template (tokenizer.chat_template) and "
        "the stack sets none: llama.cpp falls back to ChatML and chat answers may be garbage; set chat_template = "
        '"gemma" (llama.cpp\'s built-in template for gemma3)\n'
    )
