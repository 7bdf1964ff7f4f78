"""Every value written into supervisord.conf survives supervisor's own parser unchanged, or is
refused with exit 2 naming the key (supervisord silently corrupts some values: REFERENCE.md)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from umemc.compile import env_problem, ini_problem

from tests.bundle.conftest import build_stack

HOSTILE = [
    "100%", "%(ENV_HOME)s", "%%", "a,b", "x=y,z=w", 'dq"inner', "it's", "say \"hi\" it's", "x #y", "x ;y",
    "x\t#y", "$HOME", "${HOME}", "ünïcødé ✓ 模型", "", " leading", "trailing ", "'quoted'", '"quoted"',
    "a'b", "semi;colon", "hash#tag", "back\\slash", "--flag=1", "{port}-x",
]

STACK = '''version = 1
name = "esc"
[platform]
kind = "cpu"
memory = "4GiB"
[models.w]
runtime = "command"
command = ["python3", "-c", "pass", {arg}]
memory = "64MiB"
[models.w.env]
HOSTILE = {value}
'''


def toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t") + '"'


@pytest.mark.parametrize("value", HOSTILE, ids=[repr(v) for v in HOSTILE])
def test_environment_round_trip_or_refusal(tmp_path: Path, run_cli, programs, value: str) -> None:
    stack = tmp_path / "stack.toml"
    stack.write_text(STACK.format(arg='"x"', value=toml_str(value)))
    code, out, err = run_cli("build", str(stack), "-o", str(tmp_path / "bundle"))
    problem = env_problem(value)
    if problem:
        assert (code, out) == (2, "")
        assert err == (f"{stack}:11:11: models.w.env.HOSTILE: supervisord's environment= cannot carry this value: "
                       f"{problem}\n  hint: remove the quote characters or the ' #'/' ;' sequence\n")
        assert not (tmp_path / "bundle").exists()
        return
    assert code == 0, err
    env = programs(tmp_path / "bundle")["w"].environment
    assert env["HOSTILE"] == value
    assert env["UMEMC_MODEL"] == "w"


@pytest.mark.parametrize("arg", HOSTILE, ids=[repr(v) for v in HOSTILE])
def test_command_round_trip_or_refusal(tmp_path: Path, run_cli, programs, arg: str) -> None:
    stack = tmp_path / "stack.toml"
    stack.write_text(STACK.format(arg=toml_str(arg), value='"plain"'))
    code, out, err = run_cli("build", str(stack), "-o", str(tmp_path / "bundle"))
    if ini_problem(arg):
        assert (code, out) == (2, "")
        assert err == (f"{stack}:8:11: models.w.command: argument 3 ({toml_str(arg)}) cannot be written into "
                       "supervisord's command=: whitespace followed by '#' or ';' starts an inline comment in "
                       "supervisord's config\n")
        return
    assert code == 0, err
    command = shlex.split(programs(tmp_path / "bundle")["w"].command)
    assert command[command.index("--") + 1:] == ["python3", "-c", "pass", arg.replace("{port}", "10001")]
    assert command[command.index("--state") + 1] == str(tmp_path / "bundle" / "../state")


def test_percent_everywhere(tmp_path: Path, programs) -> None:
    """%-expansion applies to every option: a cwd with % survives too."""
    (tmp_path / "dir 100%").mkdir()
    stack = tmp_path / "stack.toml"
    text = STACK.format(arg='"50%"', value='"5%"')
    stack.write_text(text.replace('memory = "64MiB"', 'memory = "64MiB"\ncwd = "dir 100%"'))
    pc = programs(build_stack(stack, tmp_path / "bundle"))["w"]
    assert pc.directory == str(tmp_path / "dir 100%")
    assert shlex.split(pc.command)[-1] == "50%" and pc.environment["HOSTILE"] == "5%"
    assert shlex.split(pc.command)[:3] == [sys.executable, "-m", "umemc.runtime.wrap"]
