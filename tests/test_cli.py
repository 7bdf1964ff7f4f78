"""The CLI contract: JSON report shape, markdown, explain, schema in sync, examples valid, exit codes."""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from umemc.commands.schema import schema_text

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.toml"))

SMALL = """version = 1
name = "small"

[platform]
kind = "cpu"
memory = "10GiB"
os_reserve = "1GiB"

[models.chat]
runtime = "llama-server"
arch = "qwen2.5-7b"
model = "models/qwen2.5-7b-q4_k_m.gguf"
quant = "Q4_K_M"
context = 2048
priority = 70
mmap = false

[models.helper]
runtime = "command"
command = ["python3", "-m", "http.server", "{port}"]
memory = "512MiB"
mode = "cold"
priority = 20
"""


def test_json_is_exactly_the_contract(tmp_path: Path, run_cli) -> None:
    (tmp_path / "stack.toml").write_text(SMALL)
    code, out, err = run_cli("check", "stack.toml", "--format", "json", cwd=tmp_path)
    assert code == 0 and err == (
        'warning: stack.toml:12:9: models.chat.model: file not found, estimating from arch = "qwen2.5-7b"\n'
    )
    r = json.loads(out)
    assert list(r) == [
        "stack",
        "fits",
        "capacity",
        "models",
        "hot_total_bytes",
        "hot_gpu_total_bytes",
        "headroom_bytes",
        "cold_admission",
        "warnings",
        "advice",
        "enforcement",
    ]
    assert r["enforcement"] == (
        "the kernel (a memory cgroup per worker, where the machine allows) and umemc's enforcer"
    )
    assert r["capacity"] == {
        "memory_bytes": 10 << 30,
        "os_reserve_bytes": 1 << 30,
        "gpu_window_bytes": None,
        "usable_bytes": 9 << 30,
        "budget_bytes": 8214124953,
        "gpu_budget_bytes": None,
    }
    chat = r["models"]["chat"]
    assert list(chat) == [
        "mode",
        "priority",
        "weights_bytes",
        "kv_bytes",
        "compute_bytes",
        "overhead_bytes",
        "estimate_bytes",
        "gpu_bytes",
        "quota_soft_bytes",
        "quota_hard_bytes",
        "source",
    ]
    assert chat["estimate_bytes"] == sum(
        chat[k] for k in ("weights_bytes", "kv_bytes", "compute_bytes", "overhead_bytes")
    )
    assert chat["kv_bytes"] == 28 * 2 * 4 * 128 * 2 * 2048  # layers x K,V x kv heads x dim x f16 x cells
    assert (chat["source"], chat["gpu_bytes"], chat["quota_soft_bytes"]) == ("arch", 0, chat["estimate_bytes"])
    helper = r["models"]["helper"]
    assert (helper["estimate_bytes"], helper["quota_hard_bytes"], helper["source"]) == (
        512 << 20,
        564 << 20,
        "explicit",
    )
    assert r["hot_total_bytes"] == chat["quota_hard_bytes"]
    assert r["headroom_bytes"] == r["capacity"]["budget_bytes"] - r["hot_total_bytes"]
    assert r["cold_admission"] == {"helper": {"fits_alongside_hot": True, "admissible": True, "evicts": []}}
    assert (r["stack"], r["fits"], r["hot_gpu_total_bytes"], r["advice"]) == ("small", True, 0, [])
    assert r["warnings"] == ['stack.toml:12:9: models.chat.model: file not found, estimating from arch = "qwen2.5-7b"']


def test_markdown_for_pull_requests(tmp_path: Path, run_cli) -> None:
    (tmp_path / "stack.toml").write_text(SMALL)
    code, out, _ = run_cli("check", "stack.toml", "--format", "markdown", cwd=tmp_path)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "### umemc: `small` ✅ fits"
    assert "| all memory | 5.1 GiB | 7.6 GiB | 9.0 GiB | ✅ |" in lines
    assert "| helper | cold | 20 | 0.0 | 0.0 | 0.0 | 0.0 | 0.5 | 0.6 | 0.0 | explicit |" in lines
    assert "- `helper`: fits alongside the hot set" in lines


def test_table_marks_fit_and_both_ledgers(run_cli) -> None:
    code, out, _ = run_cli("check", str(REPO / "examples/strix-halo-5.toml"))
    assert code == 0
    assert out.splitlines()[0] == "umemc strix-halo-5   FITS   headroom 33.2 GiB"
    assert any(line.startswith("all memory ") for line in out.splitlines())
    assert any(line.startswith("GPU window ") for line in out.splitlines())
    assert "  code: starts by evicting image, vision" in out


def test_explain_shows_formulas_and_inputs(run_cli) -> None:
    code, out, _ = run_cli("explain", str(REPO / "examples/strix-halo-5.toml"), "chat")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "models.chat: runtime llama-server, hot, priority 90, source arch"
    assert (
        "    = sum over tensors of row_bytes(type, ne0) x rows, types from llama.cpp's Q4_K_M mix "
        "(llama-quant.cpp) incl. block-size fallbacks" in lines
    )
    assert "      cells: parallel 2 x pad256(context 8192) = 16384" in lines
    assert (
        "  quota hard = estimate x (1 + quota_headroom 0.1), rounded up to a MiB = 50730106880 bytes "
        "(47.25 GiB)" in lines
    )  # estimate 46117337120 = weights 42512531456 + KV 2852126720 + overhead 516677632 + compute 236001312: the
    # overhead llama-server's process (24 MiB and 96 bytes for each of 128256 tokens: 37478400) and the GPU
    # context (457 MiB); the compute the buffer llama-server reserves for Llama-3-70B with -c 16384 -np 2 and a
    # q8_0 cache (224.09 MiB as it prints it: tests/recorded/reserve-buffers.json; 234975264 bytes), + the output
    # buffer 128256 x 2 x 4; x 1.1 -> 48381 MiB
    assert "    compute buffer = 224.09 MiB (234975264 bytes)" in lines


def test_explain_unknown_model(run_cli) -> None:
    assert run_cli("explain", str(REPO / "examples/strix-halo-5.toml"), "chta") == (
        2,
        "",
        f"umemc explain: no model 'chta' in {REPO / 'examples/strix-halo-5.toml'} (did you mean 'chat'?)\n",
    )


def test_schema_file_is_the_command_output(run_cli) -> None:
    code, out, _ = run_cli("schema")
    assert code == 0 and out == schema_text()
    assert (REPO / "schema/stack.schema.json").read_text() == out, "regenerate: umemc schema > schema/stack.schema.json"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_validate_and_fit(example: Path, run_cli) -> None:
    import tomllib

    import jsonschema

    text = example.read_text()
    assert text.startswith("#:schema ../schema/stack.schema.json\n")
    jsonschema.validate(tomllib.loads(text), json.loads((REPO / "schema/stack.schema.json").read_text()))
    code, out, _ = run_cli("check", str(example), "--format", "json")
    assert code == 0 and json.loads(out)["fits"] is True


def test_internal_error_exit_3_with_log(tmp_path: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stack.toml").write_text(SMALL)

    def boom(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("umemc.commands.common.make_plan", boom)
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out) == (3, "")
    prefix = "umemc: internal error (a bug in umemc); traceback written to "
    assert err.startswith(prefix)
    log = Path(err[len(prefix) :].strip())
    text = log.read_text()
    log.unlink()
    import platform

    from umemc.cli import umemc_version

    lines = text.splitlines()
    assert lines[:5] == [
        "### umemc crashed: please attach this file to a bug report",
        f"umemc:   {umemc_version()}",
        f"python:  {sys.version.splitlines()[0]} ({sys.executable})",
        f"platform: {platform.platform()} ({platform.machine()})",
        "command: umemc check stack.toml",
    ]
    assert lines[6] == "Traceback (most recent call last):" and lines[-1] == "RuntimeError: boom"


def test_interrupt_exit_130(tmp_path: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stack.toml").write_text(SMALL)

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("umemc.commands.common.make_plan", interrupted)
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (130, "", "umemc: interrupted\n")


def test_several_stacks_worst_exit_code(tmp_path: Path, run_cli) -> None:
    (tmp_path / "ok.toml").write_text(SMALL)
    (tmp_path / "over.toml").write_text(SMALL.replace('memory = "512MiB"\nmode = "cold"', 'memory = "9GiB"'))
    code, out, _ = run_cli("check", "ok.toml", "over.toml", "--format", "json", cwd=tmp_path)
    reports = json.loads(out)
    assert code == 1 and list(reports) == ["ok.toml", "over.toml"]
    assert (reports["ok.toml"]["fits"], reports["over.toml"]["fits"]) == (True, False)


def test_an_invalid_stack_does_not_hide_the_others(tmp_path: Path, run_cli) -> None:
    (tmp_path / "ok.toml").write_text(SMALL)
    (tmp_path / "bad.toml").write_text(SMALL.replace("version = 1", "version = 7"))
    (tmp_path / "over.toml").write_text(SMALL.replace('memory = "512MiB"\nmode = "cold"', 'memory = "9GiB"'))
    code, out, err = run_cli("check", "ok.toml", "bad.toml", "over.toml", "--format", "json", cwd=tmp_path)
    assert code == 2  # the worst: an invalid stack
    assert list(json.loads(out)) == ["ok.toml", "over.toml"]
    assert err.startswith("bad.toml:1:11: version: unsupported version 7\n  hint: this umemc reads version = 1\n")


def test_run_dir_is_found_from_a_subdirectory(tmp_path: Path, run_cli) -> None:
    """Like git: the nearest .umemc/run holding a run, from the current directory up."""
    project = tmp_path / "project"
    (project / ".umemc" / "run" / "state").mkdir(parents=True)
    (project / "src" / "deep").mkdir(parents=True)
    found = project / ".umemc" / "run"
    assert run_cli("events", cwd=project / "src" / "deep") == (
        2,
        "",
        f"no event log in {found} (nothing has run there)\n",
    )
    assert run_cli("events", cwd=project) == (2, "", "no event log in .umemc/run (nothing has run there)\n")
    assert run_cli("events", cwd=tmp_path) == (2, "", "no event log in .umemc/run (nothing has run there)\n")


def test_explain_speaks_each_runtimes_terms(run_cli) -> None:
    code, out, _ = run_cli("explain", str(REPO / "examples/strix-halo-5.toml"), "image")
    assert code == 0
    assert "ngl" not in out and "llama" not in out
    assert (
        "  gpu = weights + kv + compute: the diffusion model, text encoders and VAE in GPU memory (ComfyUI keeps "
        "them there within --reserve-vram) = 8.34 GiB (8960000000 bytes)" in out.splitlines()
    )
    code, out, _ = run_cli("explain", str(REPO / "examples/strix-halo-5.toml"), "chat")
    assert "every layer offloaded (-ngl 999)" in out


def test_decimal_memory_is_said_once_and_apple_window_defaults_from_memory(tmp_path: Path, run_cli) -> None:
    (tmp_path / "mac.toml").write_text(
        'version = 1\nname = "mac"\n[platform]\nkind = "apple"\nmemory = "64GB"\n'
        '[models.w]\nruntime = "command"\ncommand = ["true"]\nmemory = "1GiB"\n'
    )
    code, out, err = run_cli("check", "mac.toml", "--format", "json", cwd=tmp_path)
    report = json.loads(out)
    assert code == 0
    # 64 GB = 64e9 bytes = 59.6 GiB; no gpu_window: macOS's stock limit, 3/4 of RAM above 32 GiB
    assert report["capacity"]["memory_bytes"] == 64_000_000_000
    assert report["capacity"]["gpu_window_bytes"] == 64_000_000_000 * 3 // 4
    assert err == (
        'warning: mac.toml:5:10: platform.memory: "64GB" is 64000000000 bytes = 59.6 GiB (GB/TB are powers of 10); '
        'RAM comes in powers of two: a machine sold as 64GB has "64GiB"\n'
    )
    code, out, _ = run_cli("check", "mac.toml", cwd=tmp_path)  # captured: not a terminal
    assert (
        'warning: mac.toml:5:10: platform.memory: "64GB" is 64000000000 bytes = 59.6 GiB (GB/TB are powers of 10); '
        'RAM comes in powers of two: a machine sold as 64GB has "64GiB"'
    ) in out.splitlines()  # one line: nothing wrapped or cut at 80 columns off a terminal


def test_a_command_imports_only_itself(tmp_path: Path) -> None:
    """`umemc check` builds the parser of check alone: the other commands' modules (and what they pull in: the
    runtime's supervisor client, the Hub) are most of a short command's time, and none is imported (check shares
    build's refusal of missing files and the asking of llama.cpp); `umemc --help` lists them all."""
    import subprocess
    import sys

    stack = tmp_path / "s.toml"
    stack.write_text('version = 1\nname = "s"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n[models.a]\nruntime = '
                     '"command"\ncommand = ["true"]\nmemory = "1GiB"\n')  # fmt: skip
    probe = (
        "import sys; from umemc.cli import main; code = main(['check', sys.argv[1]]); "
        "print(sorted(m for m in sys.modules if m.startswith('umemc.commands.')), code, "
        "'umemc.contract' in sys.modules, 'rich' in sys.modules, 'umemc.lockfile.entries' in sys.modules, "
        "'umemc.document' in sys.modules, "
        "[m for m in ('umemc.budget.placement', 'difflib', 'subprocess') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(stack)], capture_output=True, text=True, timeout=120)
    # nor the runtime's documents (umemc.contract), nor, where the stack has no calibration file, the lock file's
    # documents (umemc.lockfile.entries) or their base (umemc.document, msgspec); nor rich, off a
    # terminal (umemc.targets.table.plain_text); nor, for one node without mistakes whose runtimes' help is known,
    # the placement on several nodes, the did-you-mean matcher, or subprocess
    imported = (
        "['umemc.commands.args', 'umemc.commands.asking', 'umemc.commands.build', 'umemc.commands.check', "
        "'umemc.commands.common'] 0 False False False False []"
    )
    assert done.stdout.splitlines()[-1] == imported, done.stderr
    done = subprocess.run([sys.executable, "-m", "umemc", "--help"], capture_output=True, text=True, timeout=120)
    listed = [
        x.split()[0] for x in done.stdout.split("COMMAND\n", 1)[1].splitlines() if x.startswith("    ") and x[4] != " "
    ]
    assert listed == ["init", "pull", "check", "build", "explain", "calibrate", "up", "down", "ps", "status", "top",
                      "events", "logs", "chat", "apply", "doctor", "lease-pod", "schema"]  # fmt: skip


def test_the_collector_is_off_while_a_command_imports_and_on_for_its_work(tmp_path: Path, run_cli) -> None:
    """As its own process (the `umemc` script), the command is imported with the cyclic collector off and the
    imported objects frozen; the command's own work runs with it on. Pydantic's plugin scan is off while it imports
    (PYDANTIC_DISABLE_PLUGINS), and the variable is gone again for the command's work (what it starts inherits the
    person's environment), unless the person set it. Called in a longer-lived process (here, the test's), main
    leaves the collector alone."""
    stack = tmp_path / "stack.toml"
    stack.write_text(SMALL)
    script = (
        "import gc, os, sys\nfrom umemc import cli\nseen = []\nreal = cli.build_parser\n"
        "def spy(argv):\n    seen.append((gc.isenabled(), os.environ.get('PYDANTIC_DISABLE_PLUGINS')))\n"
        "    return real(argv)\n"
        "def work(args):\n    seen.append((gc.isenabled(), os.environ.get('PYDANTIC_DISABLE_PLUGINS')))\n    return 0\n"
        "cli.build_parser = spy\n"
        "real_parse = cli._parse\n"
        "def parse(argv):\n    args = real_parse(argv)\n    args.func = work\n    return args\n"
        f"cli._parse = parse\nsys.argv = ['umemc', 'check', {str(stack)!r}]\n"
        "code = cli.main()\nprint(seen, gc.isenabled(), gc.get_freeze_count() > 1000, code)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path, env=env
    )
    assert done.stdout == "[(False, '__all__'), (True, None)] True True 0\n"
    env["PYDANTIC_DISABLE_PLUGINS"] = "logfire"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path, env=env
    )
    assert done.stdout == "[(False, 'logfire'), (True, 'logfire')] True True 0\n"
    frozen = gc.get_freeze_count()
    assert run_cli("check", str(stack), "--format", "json")[0] == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen


# what the command line itself fills in besides a command's own arguments (cli.main reads them first)
CLI_OWN = {"func", "command", "stack_name", "find_run_dir"}


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    from umemc.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices.items())


def _expected_type(action: argparse.Action) -> set[str]:
    """The annotations a field may have for what argparse puts at this action's destination."""
    if isinstance(action, argparse._StoreTrueAction):
        return {"bool"}
    item = {float: "float", int: "int"}.get(action.type, "str")  # type: ignore[call-overload]
    if action.type is not None and item == "str":
        item = "float"  # up --scale: a checked float
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+")
    base = f"list[{item}]" if many else item
    optional = action.default is None and not action.required and action.nargs not in ("*", "+")
    return {f"{base} | None"} if optional else {base}


def test_each_command_reads_its_arguments_typed() -> None:
    """Every command reads argparse's Namespace once, into its own frozen dataclass (mypy --strict then sees each
    argument's type): its fields are every argument its parser takes (and may name a default it sets, such as
    the hint that says how to name a stack), typed as argparse gives them."""
    import dataclasses

    from umemc.commands.args import Args

    seen = []
    for name, parser in _commands():
        func = parser.get_default("func")
        module = sys.modules[func.__module__]
        wanted = "".join(part.title() for part in name.split("-")) + "Args"
        if name == "schema":
            assert not [a for a in parser._actions if a.dest != "help"]  # no argument: no dataclass
            continue
        cls = getattr(module, wanted)
        assert issubclass(cls, Args) and cls.__dataclass_params__.frozen, name
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        actions = {a.dest: a for a in parser._actions if a.dest != "help"}
        defaults = set(parser._defaults) - CLI_OWN
        assert set(actions) - CLI_OWN <= set(fields) <= (set(actions) | defaults) - CLI_OWN, name
        for dest, action in actions.items():
            if dest in fields:
                # run_dir: None on the parser, always a path once cli.main found the run (apply's has no finder)
                found = parser.get_default("find_run_dir") is not None and dest == "run_dir"
                assert fields[dest] in ({"str"} if found else _expected_type(action)), (name, dest, fields[dest])
        seen.append(name)
    assert len(seen) == 17  # every command (status's top too) but schema, which takes none
