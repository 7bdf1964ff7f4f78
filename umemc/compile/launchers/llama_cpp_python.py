"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, extra [server]), settings fields as
--snake_case options, spelled for the installed version: its `--help` (umemc.helptext) says which it takes. A
setting an older server lacks is left out where its default is what the stack asks, and refused otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...catalog.chat_templates import LLAMA_CPP_PYTHON
from ._common import llama_threads, model_flag

if TYPE_CHECKING:
    from ...budget.plan import ModelPlan
    from . import Context

NAME = "llama-cpp-python"
HEALTH = "/v1/models"  # the server has no /health
FLAGS_MATCH = "llama-cpp-python 0.3.x; older servers spelled as their --help says"
NEEDS_MODEL_FILE = True  # cannot start without a weights file
REPORTS_BUFFERS = True  # its log states llama.cpp's buffer sizes (drift check)
HELP_MODULE: str | None = "llama_cpp.server"  # `python -m MODULE --help` instead of `ARGV0 --help`
PINNED = (
    "--model",
    "--n_ctx",
    "--n_ubatch",
    "--n_batch",
    "--flash_attn",
    "--type_k",
    "--type_v",
    "--use_mmap",
    "--use_mlock",
    "--n_gpu_layers",
    "--logits_all",
    "--host",
    "--port",
)
# ggml type ids (ggml.h enum ggml_type) that --type_k/--type_v take.
GGML_TYPE_ID = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
# settings an older server may lack, with the value it then runs with (llama_cpp/server/settings.py defaults)
DEFAULTS = {"--n_ubatch": "512", "--flash_attn": "false", "--type_k": "1", "--type_v": "1"}
OPTIONAL = frozenset({"--model_alias"})  # left out where the installed server lacks it


def _bool(value: bool) -> str:
    return "true" if value else "false"


def argv(m: ModelPlan, ctx: Context) -> list[str]:
    spec, rm = m.model.spec, m.model
    kv = str(GGML_TYPE_ID[spec.kv_cache])
    settings = [
        ("--n_ctx", str(spec.context)),
        ("--n_ubatch", str(spec.ubatch)),
        ("--n_batch", str(spec.ubatch)),
        ("--flash_attn", _bool(spec.flash_attn)),
        ("--type_k", kv),
        ("--type_v", kv),
        ("--use_mmap", _bool(rm.mmap)),
        ("--use_mlock", _bool(spec.mlock)),
        ("--n_gpu_layers", "0" if ctx.plan.platform.kind == "cpu" or spec.gpu is False else "-1"),
        # the server defaults to logits_all = true: it keeps n_vocab x 4 bytes of logits for every
        # token of the context (+265 MiB per 1000 tokens at a 32k vocabulary, measured); off, the
        # process holds what llama.cpp's buffers say
        ("--logits_all", "false"),
    ]
    if m.estimate.facts.get("family") == "embedding":
        settings.append(("--embedding", "true"))
    if spec.chat_template is not None:  # a name the resolver checked it shares
        settings.append(("--chat_format", LLAMA_CPP_PYTHON[spec.chat_template]))
    # its answers name the model as the stack does, not by the file's path
    settings.append(("--model_alias", m.name))
    out = [spec.bin or ctx.python, "-m", "llama_cpp.server", *model_flag("--model", rm)]
    for flag, value in _for_installed(m, ctx, settings):
        out += [flag, value]
    threads = llama_threads(m, ctx)
    threading = ["--n_threads", str(threads), "--n_threads_batch", str(threads)] if threads else []
    return out + ["--host", ctx.host, "--port", str(rm.port), *threading, *spec.args]


def _for_installed(m: ModelPlan, ctx: Context, settings: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The settings the installed server takes: one it lacks is left out when its default is the value asked,
    and refused otherwise (located at the model)."""
    h = ctx.help_of(m.model.spec.bin or ctx.python, HELP_MODULE)
    if h is None:
        return settings
    if not h.has("--model"):
        first = next((x for x in h.text.splitlines() if x.strip()), "no output")
        raise ctx.plan.source.error(
            ("models", m.name, "bin") if m.model.spec.bin else ("models", m.name, "runtime"),
            f"`{h.program} --help` is not llama-cpp-python's server: {first.strip()}",
            "pip install 'llama-cpp-python[server]' into that interpreter's environment",
        )
    out = []
    for flag, value in settings:
        if h.has(flag):
            out.append((flag, value))
        elif DEFAULTS.get(flag) != value and flag not in OPTIONAL:
            key = STACK_KEY.get(flag, flag[2:])
            default = {"flash_attn": "false", "kv_cache": '"f16"', "ubatch": "512"}.get(key)
            raise ctx.plan.source.error(
                ("models", m.name),
                f"this llama-cpp-python (version {h.version}) has no {flag}: it cannot run with "
                f"{key} = {_shown(m, key)}",
                "update llama-cpp-python (pip install -U 'llama-cpp-python[server]')"
                + (f", or set {key} = {default}" if default else ""),
                what="table",
            )
    return out


STACK_KEY = {"--flash_attn": "flash_attn", "--type_k": "kv_cache", "--type_v": "kv_cache", "--n_ubatch": "ubatch"}


def _shown(m: ModelPlan, key: str) -> str:
    value = getattr(m.model.spec, key, None)
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


def pinned(argv: list[str], extra: int) -> list[str]:
    """The settings of a compiled argv that the installed server's --help must list."""
    own = argv[3 : len(argv) - extra] if extra else argv[3:]
    return [a for a in own if a.startswith("--")]


def dry_run_args(argv: list[str]) -> list[str]:
    """The server's own arguments (after `-m llama_cpp.server`): umemc.estimate.dryrun's helper parses them with the
    server's own settings parser, so the dry run builds the model the server would."""
    i = argv.index("llama_cpp.server") if "llama_cpp.server" in argv else 0
    return argv[i + 1 :]
