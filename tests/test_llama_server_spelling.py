"""llama-server's argv spelled for the build that is installed, from its own --help.

The --help and --version texts in tests/recorded/llama-server/ are those of three real builds (README there):
0c1e570 (llama-cpp-python 0.3.36's llama.cpp, 2026-10: --load-mode, -fa on|off|auto, --fit), 4227c9b (0.3.16's:
--no-mmap/--mlock, -fa a switch, no --fit) and 74d73dc (0.3.2's, 2024-11: no --mmproj in the server either). A
stand-in program prints them; tests/runtime/test_llama_server.py runs the real builds where they are here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from umemc.contract import ModelDoc
from umemc.document import validate
from umemc.runtime.preflight import check_executable

RECORDED = Path(__file__).resolve().parent / "recorded" / "llama-server"
NEWEST, OLDER, OLDEST = "0c1e570", "4227c9b", "74d73dc"


def stand_in(tmp_path: Path, build: str) -> Path:
    """A program answering --help and --version as that build does, counting its runs."""
    program = tmp_path / f"llama-server-{build}"
    program.write_text(
        f"#!{sys.executable}\n"
        "import sys\nfrom pathlib import Path\n"
        f"runs = Path({str(tmp_path / f'runs-{build}')!r})\n"
        "runs.write_text(str(int(runs.read_text()) + 1 if runs.exists() else 1))\n"
        f"name = 'version' if sys.argv[1:] == ['--version'] else 'help'\n"
        f"sys.stdout.write((Path({str(RECORDED)!r}) / f'{{name}}-{build}.txt').read_text())\n"
    )
    program.chmod(0o755)
    return program


def stack(tmp_path: Path, binary: Path, extra: str = "") -> Path:
    model = tmp_path / "m.gguf"
    path = tmp_path / "stack.toml"
    path.write_text(
        'version = 1\nname = "spell"\n[platform]\nkind = "amd-apu"\nmemory = "64GiB"\ngpu_window = "48GiB"\n'
        f'[models.chat]\nruntime = "llama-server"\nbin = "{binary}"\nmodel = "{model}"\narch = "llama-3-8b"\n'
        f"context = 4096\nparallel = 2\nmlock = true\nport = 10001\n{extra}"
    )
    return path


def built_argv(run_cli, tmp_path: Path, path: Path) -> list[str]:
    code, _, err = run_cli("build", str(path), "-o", str(tmp_path / "out"), "--files-later", "--no-measure")
    assert code == 0, err
    return json.loads((tmp_path / "out" / "plan.json").read_text())["models"]["chat"]["argv"]


def head(binary: Path, tmp_path: Path) -> list[str]:
    return [str(binary), "-m", str(tmp_path / "m.gguf"), "-c", "8192", "-np", "2", "-ub", "512", "-b", "2048"]


def test_the_newest_build_gets_load_mode_and_fit_off(tmp_path: Path, run_cli, monkeypatch) -> None:
    monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
    binary = stand_in(tmp_path, NEWEST)
    assert built_argv(run_cli, tmp_path, stack(tmp_path, binary)) == [
        *head(binary, tmp_path), "-fa", "on", "-ctk", "f16", "-ctv", "f16", "-ngl", "999", "--load-mode", "mlock",
        "--fit", "off", "--log-verbosity", "4", "--alias", "chat", "--cache-ram", "0",  # no prompt cache: not counted
        "--slot-save-path", "@UMEMC_STATE@/slots/chat", "--host", "127.0.0.1", "--port", "10001",
    ]  # fmt: skip


@pytest.mark.parametrize("build", [OLDER, OLDEST])
def test_an_older_build_gets_its_own_spelling(tmp_path: Path, run_cli, monkeypatch, build: str) -> None:
    monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
    binary = stand_in(tmp_path, build)
    path = stack(tmp_path, binary, 'flash_attn = false\nkv_cache = "f16"\n')
    assert built_argv(run_cli, tmp_path, path) == [
        *head(binary, tmp_path), "-ctk", "f16", "-ctv", "f16", "-ngl", "999", "--no-mmap", "--mlock",
        "--log-verbosity", "4", "--alias", "chat", "--slot-save-path", "@UMEMC_STATE@/slots/chat", "--host",
        "127.0.0.1", "--port", "10001",
    ]  # fmt: skip
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())["models"]["chat"]
    assert plan["pinned_flags"] == [
        "--model", "--ctx-size", "--parallel", "--ubatch-size", "--batch-size", "--cache-type-k", "--cache-type-v",
        "--n-gpu-layers", "--no-mmap", "--mlock", "--log-verbosity", "--alias", "--slot-save-path", "--host",
        "--port",
    ]  # fmt: skip
    # flash attention on: the switch, without a value
    argv = built_argv(run_cli, tmp_path, stack(tmp_path, binary))
    assert argv[argv.index("-b") + 2 : argv.index("-b") + 4] == ["-fa", "-ctk"]


def test_what_an_old_build_cannot_do_is_refused_at_its_key(tmp_path: Path, run_cli, monkeypatch) -> None:
    monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
    binary = stand_in(tmp_path, OLDEST)
    path = stack(tmp_path, binary, f'mmproj = "{tmp_path / "mmproj.gguf"}"\n')
    code, out, err = run_cli("check", str(path))
    assert (code, out) == (2, "")
    assert err.splitlines()[-2:] == [
        f"{path}:16:10: models.chat.mmproj: this llama-server ({binary}, version 1 (74d73dc)) takes no "
        "--mmproj: it cannot load a vision projector",
        "  hint: update llama.cpp (the server of a build from 2025-05 or later takes every flag umemc needs)",
    ]


def test_the_help_is_read_once_per_binary(tmp_path: Path, run_cli, monkeypatch) -> None:
    monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
    binary = stand_in(tmp_path, OLDER)
    path = stack(tmp_path, binary)
    built_argv(run_cli, tmp_path, path)
    runs = (tmp_path / f"runs-{OLDER}").read_text()
    assert runs == "2"  # --help and --version
    from umemc.helptext import _probe

    _probe.cache_clear()  # a new process: the cache on disk answers
    built_argv(run_cli, tmp_path, path)
    assert (tmp_path / f"runs-{OLDER}").read_text() == "2"
    binary.touch()  # another build in its place (a changed mtime): asked again
    built_argv(run_cli, tmp_path, path)
    assert (tmp_path / f"runs-{OLDER}").read_text() == "4"


def test_preflight_refuses_a_bundle_spelled_for_another_build(tmp_path: Path, run_cli, monkeypatch) -> None:
    """Built where no llama-server was installed (the newest spelling), run where an older one is."""
    monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
    absent = tmp_path / "not-here" / "llama-server"
    argv = built_argv(run_cli, tmp_path, stack(tmp_path, absent))
    assert "--load-mode" in argv
    doc = json.loads((tmp_path / "out" / "plan.json").read_text())["models"]["chat"]
    older = stand_in(tmp_path, OLDER)
    doc["argv"][0] = doc["help_argv"][0] = str(older)
    assert check_executable(validate(ModelDoc, doc)) == (
        f"`{older} --help` does not list --load-mode, --fit, --cache-ram: this bundle was spelled for another "
        "llama-server than the one installed (version 1 (4227c9b)); `umemc up STACK` builds it for that one"
    )


LCP = Path(__file__).resolve().parent / "recorded" / "llama-cpp-python"


def interpreter(tmp_path: Path, version: str) -> Path:
    """An interpreter standing in for one with llama-cpp-python VERSION: `-m llama_cpp.server --help` prints that
    version's recorded help, `-c` code asking for the version prints it."""
    program = tmp_path / f"python-lcp-{version}"
    program.write_text(
        f"#!{sys.executable}\n"
        "import sys\nfrom pathlib import Path\n"
        "if sys.argv[1:3] == ['-m', 'llama_cpp.server']:\n"
        f"    sys.stdout.write((Path({str(LCP)!r}) / 'help-{version}.txt').read_text())\n"
        "elif sys.argv[1] == '-c' and 'metadata' in sys.argv[2]:\n"
        f"    print({version!r})\n"
        "else:\n"
        "    print('llama_cpp', 1)\n"
    )
    program.chmod(0o755)
    return program


def lcp_stack(tmp_path: Path, python: Path, extra: str = "") -> Path:
    path = tmp_path / "stack.toml"
    path.write_text(
        'version = 1\nname = "spell"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\n[models.chat]\n'
        f'runtime = "llama-cpp-python"\nbin = "{python}"\nmodel = "{tmp_path / "m.gguf"}"\narch = "llama-3-8b"\n'
        f"context = 2048\nport = 10001\n{extra}"
    )
    return path


def test_an_old_llama_cpp_python_gets_only_the_settings_it_has(tmp_path: Path, run_cli, monkeypatch) -> None:
    monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
    python = interpreter(tmp_path, "0.2.55")
    path = lcp_stack(tmp_path, python, "flash_attn = false\nubatch = 512\n")
    assert built_argv(run_cli, tmp_path, path) == [
        str(python), "-m", "llama_cpp.server", "--model", str(tmp_path / "m.gguf"), "--n_ctx", "2048", "--n_batch",
        "512", "--use_mmap", "true", "--use_mlock", "false", "--n_gpu_layers", "0", "--logits_all", "false",
        "--model_alias", "chat", "--host", "127.0.0.1", "--port", "10001",
    ]  # fmt: skip
    code, _, err = run_cli("check", str(lcp_stack(tmp_path, python)))  # flash_attn defaults to true
    assert code == 2
    assert err.splitlines()[-2:] == [
        f"{path}:6:1: models.chat: this llama-cpp-python (version 0.2.55) has no --flash_attn: it cannot run with "
        "flash_attn = true",
        "  hint: update llama-cpp-python (pip install -U 'llama-cpp-python[server]'), or set flash_attn = false",
    ]


def test_the_current_llama_cpp_python_gets_every_setting(tmp_path: Path, run_cli, monkeypatch) -> None:
    monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
    python = interpreter(tmp_path, "0.3.36")
    assert built_argv(run_cli, tmp_path, lcp_stack(tmp_path, python, 'kv_cache = "q8_0"\n')) == [
        str(python), "-m", "llama_cpp.server", "--model", str(tmp_path / "m.gguf"), "--n_ctx", "2048", "--n_ubatch",
        "512", "--n_batch", "512", "--flash_attn", "true", "--type_k", "8", "--type_v", "8", "--use_mmap", "true",
        "--use_mlock", "false", "--n_gpu_layers", "0", "--logits_all", "false", "--model_alias", "chat", "--host",
        "127.0.0.1", "--port", "10001",
    ]  # fmt: skip


def test_an_interpreter_without_llama_cpp_python_gets_the_newest_spelling(tmp_path: Path, run_cli, monkeypatch) -> None:
    """A real interpreter that cannot import llama_cpp (-S: no site-packages) is a server not installed here, as a
    missing llama-server binary is: the bundle is spelled for the newest server, and preflight says what is
    missing where it would run."""
    monkeypatch.setenv("UMEMC_CACHE_DIR", str(tmp_path / "cache"))
    python = tmp_path / "python-bare"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    python.chmod(0o755)
    path = lcp_stack(tmp_path, python, 'kv_cache = "q8_0"\n')
    assert built_argv(run_cli, tmp_path, path) == [
        str(python), "-m", "llama_cpp.server", "--model", str(tmp_path / "m.gguf"), "--n_ctx", "2048", "--n_ubatch",
        "512", "--n_batch", "512", "--flash_attn", "true", "--type_k", "8", "--type_v", "8", "--use_mmap", "true",
        "--use_mlock", "false", "--n_gpu_layers", "0", "--logits_all", "false", "--model_alias", "chat", "--host",
        "127.0.0.1", "--port", "10001",
    ]  # fmt: skip
    doc = json.loads((tmp_path / "out" / "plan.json").read_text())["models"]["chat"]
    assert check_executable(validate(ModelDoc, doc)) == (
        f"`{python} -m llama_cpp.server --help` failed: {python} cannot import llama_cpp "
        "(pip install 'llama-cpp-python[server]' into that interpreter's environment)"
    )
