"""Chat templates: the names llama.cpp knows without a Jinja file, which one an architecture clearly uses, and how
llama-cpp-python's server spells the ones it shares.

A GGUF carries its chat template as `tokenizer.chat_template` (Jinja). A file without one (some community
conversions, base models) makes llama-server fall back to chatml, and a model trained on another format answers
with its turn markers as text. `chat_template` in the stack names the template instead."""

from __future__ import annotations

from typing import NamedTuple

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


# -- umemc's own Jinja for the formats most used -------------------------------------------------------------------
# llama.cpp applies a built-in name with its own C++ formatter, which runs only with Jinja off, and a server with Jinja
# off refuses every request that carries `tools` (500, "tools param requires --jinja flag"). For these formats umemc
# gives llama-server a Jinja template of its own instead, as text on the command line (one line: no file to ship or
# mount): without tools it formats a chat exactly as the built-in name does (tests/runtime/test_chat_templates.py
# checks it against llama-server's own formatter); with tools it lists them at the top, in the system turn, and writes
# a call as <tool_call>{"name": ..., "arguments": ...}</tool_call> and a result as <tool_response> in a user turn,
# from which llama.cpp's template analysis derives its tool-call grammar and parser (Hermes' convention, which most
# small models that call tools were trained on).
class Turns(NamedTuple):
    """How a format writes one turn: Jinja expressions of `role` before and after its text."""

    start: str
    end: str
    trim: bool = False  # each turn's text trimmed (llama.cpp's formatter trims these formats' turns)
    merged_system: bool = False  # no system turn: its text opens the next user turn (Gemma)
    model_role: str = "assistant"


FORMATS = {
    "chatml": Turns(r"'<|im_start|>' + role + '\n'", r"'<|im_end|>\n'"),
    "gemma": Turns(r"'<start_of_turn>' + role + '\n'", r"'<end_of_turn>\n'", True, True, "model"),
    "llama3": Turns(r"'<|start_header_id|>' + role + '<|end_header_id|>\n\n'", r"'<|eot_id|>'", True),
    "phi3": Turns(r"'<|' + role + '|>\n'", r"'<|end|>\n'"),
    "zephyr": Turns(r"'<|' + role + '|>\n'", r"'<|endoftext|>\n'"),
}

TOOLS = (
    r"{%- set ns.system = ns.system + 'You may call one or more functions to answer. Their signatures are within "
    r"<tools></tools>:\n<tools>' -%}{%- for tool in tools -%}{%- set ns.system = ns.system + '\n' + (tool | tojson)"
    r" -%}{%- endfor -%}{%- set ns.system = ns.system + '\n</tools>\nTo call one, answer with a JSON object of its "
    r"name and arguments within <tool_call></tool_call>:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    r"<args-json-object>}\n</tool_call>' -%}"
)
CALLS = (
    r"{%- for call in message['tool_calls'] -%}{%- set f = call['function'] if call['function'] is defined else call"
    r" -%}{%- set ns.text = ns.text + '<tool_call>\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' + "
    r"(f['arguments'] if f['arguments'] is string else f['arguments'] | tojson) + '}\n</tool_call>' -%}{%- endfor -%}"
)
# with tools, a first system message opens the tools' text
FIRST_SYSTEM = (
    "{%- if messages and messages[0]['role'] == 'system' -%}{%- set ns.system = messages[0]['content'] + "
    r"'\n\n' -%}{%- set ns.skip = 1 -%}{%- endif -%}"
)
RESULT = r"{%- set ns.text = '<tool_response>\n' + message['content'] + '\n</tool_response>' -%}"


def jinja(name: str) -> str | None:
    """umemc's one-line Jinja for a built-in name (None where it has none: that name runs with Jinja off)."""
    t = FORMATS.get(name)
    if t is None:
        return None
    content = "(message['content'] | trim)" if t.trim else "message['content']"

    def turn(role: str) -> str:  # ns.text as a turn of `role`
        return f"{{%- set role = {role} -%}}{{{{- {t.start} + ns.text + {t.end} -}}}}"

    def lead(cond: str) -> str:  # a merged system text opens the next turn that is not the model's
        return (
            f"{{%- if ns.system and {cond} -%}}{{%- set ns.text = ns.system + '\\n\\n' + ns.text -%}}"
            "{%- set ns.system = '' -%}{%- endif -%}"
        )

    if t.merged_system:
        opening, system = "", f"{{%- set ns.system = ns.system + {content} -%}}"
        result = RESULT + lead("true") + turn("'user'")
        role = "'model' if message['role'] == 'assistant' else message['role']"
        said = f"{{%- set role = {role} -%}}" + lead("role != 'model'")
    else:
        opening = "{%- if ns.system -%}{%- set ns.text = ns.system -%}" + turn("'system'") + "{%- endif -%}"
        system = f"{{%- set ns.text = {content} -%}}" + turn("'system'")
        result = RESULT + turn("'user'")
        said = "{%- set role = message['role'] -%}"
    return (
        "{%- set ns = namespace(system='', text='', skip=0) -%}"
        f"{{%- if tools -%}}{FIRST_SYSTEM}{TOOLS}{{%- endif -%}}{opening}"
        "{%- for message in messages -%}{%- if loop.first and ns.skip -%}"
        f"{{%- elif message['role'] == 'system' -%}}{system}"
        f"{{%- elif message['role'] == 'tool' -%}}{result}"
        f"{{%- else -%}}{{%- set ns.text = {content} if message['content'] else '' -%}}"
        "{%- if message['role'] == 'assistant' and message['tool_calls'] -%}"
        r"{%- if ns.text -%}{%- set ns.text = ns.text + '\n' -%}{%- endif -%}" + CALLS + "{%- endif -%}"
        f"{said}{{{{- {t.start} + ns.text + {t.end} -}}}}"
        "{%- endif -%}{%- endfor -%}"
        f"{{%- if add_generation_prompt -%}}{{%- set role = '{t.model_role}' -%}}{{{{- {t.start} -}}}}{{%- endif -%}}"
    )
