"""Chat templates: the names llama.cpp knows without a Jinja file, which one an architecture clearly uses, and how
llama-cpp-python's server spells the ones it shares.

A GGUF carries its chat template as `tokenizer.chat_template` (Jinja). A file without one (some community
conversions, base models) makes llama-server fall back to chatml, and a model trained on another format answers
with its turn markers as text. `chat_template` in the stack names the template instead."""

from __future__ import annotations

# llama.cpp's built-in templates (src/llama-chat.cpp, LLM_CHAT_TEMPLATES, in the tree llama-cpp-python 0.3.36
# vendors); `llama-server --help` lists them under --chat-template. A newer build may know more: where one is
# installed, its own list is what the stack is checked against.
BUILTIN = (
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
    "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch", "gemma",
    "orion", "openchat", "vicuna", "vicuna-orca", "deepseek", "deepseek2", "deepseek3", "deepseek-ocr", "command-r",
    "llama3", "chatglm3", "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe", "rwkv-world",
    "granite", "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing", "bailing-think", "bailing2",
    "llama4", "smolvlm", "hunyuan-moe", "gpt-oss", "hunyuan-dense", "hunyuan-vl", "kimi-k2", "seed_oss", "grok-2",
    "pangu-embedded", "solar-open",
)  # fmt: skip

# The template an architecture (general.architecture) is trained on, where the architecture alone says it: Gemma's
# turn markers are Gemma's in every release, Qwen's are ChatML. A "llama" file may be Llama 2, Llama 3, SmolLM
# (ChatML) or Mistral: no guess there.
BY_ARCH = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma", "qwen2": "chatml",
    "qwen2moe": "chatml", "qwen3": "chatml", "qwen3moe": "chatml", "phi3": "phi3", "command-r": "command-r",
    "cohere2": "command-r", "gpt-oss": "gpt-oss", "llama4": "llama4", "exaone4": "exaone4", "glm4": "chatglm4",
}  # fmt: skip

# llama-cpp-python's --chat_format names (llama_cpp/llama_chat_format.py, register_chat_format) for the llama.cpp
# names that mean the same format.
LLAMA_CPP_PYTHON = {
    "chatml": "chatml", "llama2": "llama-2", "llama3": "llama-3", "gemma": "gemma", "zephyr": "zephyr",
    "vicuna": "vicuna", "openchat": "openchat", "chatglm3": "chatglm3", "mistral-v1": "mistral-instruct",
}  # fmt: skip

FILE_SUFFIXES = (".jinja", ".jinja2", ".j2")


def is_file(value: str) -> bool:
    """A template given as a file (a path), not by a built-in name."""
    return "/" in value or value.endswith(FILE_SUFFIXES)


def listed(help_text: str) -> tuple[str, ...] | None:
    """The built-in names an installed llama-server lists in its --help: the comma-separated lines after "list of
    built-in templates:" (wrapped at the help's width, up to the "(env: ...)" line); None where it has no list."""
    lines = help_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "list of built-in templates:"), None)
    if start is None:
        return None
    names: list[str] = []
    for line in lines[start + 1 :]:
        text = line.strip()
        if not text or text.startswith(("(", "-")):
            break
        names += [n.strip() for n in text.split(",") if n.strip()]
    return tuple(names) or None
