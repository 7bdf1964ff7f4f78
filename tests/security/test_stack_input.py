"""Hostile stack files: every string that reaches a generated file is carried exactly (proved with
supervisor's own parser) or refused by `check` AND `build` alike, with file:line:col, the key path
and exit 2, writing nothing. Expected outcomes are written out by hand, never derived from umemc."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from tests.bundle.conftest import build_stack

REPO = Path(__file__).resolve().parents[2]

HEAD = """version = 1
name = "inj"
[platform]
kind = "cpu"
memory = "4GiB"
"""
# line 6 onwards: one model whose command is given; line 10 is the hostile line of most cases
WORKER = (
    HEAD
    + """[models.w]
runtime = "command"
command = ["python3", "-c", "pass"]
memory = "64MiB"
"""
)
CTRL_HINT = (
    "  hint: generated files (supervisord.conf, sysctl.d, env files) are line-based: newlines, tabs and "
    "other control characters cannot be carried"
)
PWN = "\\n[program:pwn]\\ncommand=/bin/sh -c id"  # as written in TOML: newlines escaped

# (stack text, expected stderr without the file prefix)
INJECTIONS = {
    "cwd newline": (
        WORKER + f'cwd = "x{PWN}"\n',
        "10:7: models.w.cwd: contains a control character (U+000A, a newline)",
    ),
    "cwd carriage return": (
        WORKER + 'cwd = "x\\r[program:pwn]"\n',
        "10:7: models.w.cwd: contains a control character (U+000D, a carriage return)",
    ),
    "health newline": (
        WORKER + f'health = "/h{PWN}"\n',
        "10:10: models.w.health: contains a control character (U+000A, a newline)",
    ),
    "bin newline": (
        WORKER + f'bin = "/bin/x{PWN}"\n',
        "10:7: models.w.bin: contains a control character (U+000A, a newline)",
    ),
    "model newline": (
        HEAD + f'[models.w]\nruntime = "llama-server"\narch = "llama-3-8b"\nmodel = "m{PWN}.gguf"\n',
        "9:9: models.w.model: contains a control character (U+000A, a newline)",
    ),
    "module newline": (
        HEAD + f'[models.w]\nruntime = "torch"\nmemory = "1GiB"\nmodule = "w{PWN}"\n',
        "9:10: models.w.module: contains a control character (U+000A, a newline)",
    ),
    "args newline": (
        HEAD + f'[models.w]\nruntime = "llama-server"\narch = "llama-3-8b"\nargs = ["--x", "y{PWN}"]\n',
        "9:16: models.w.args[1]: contains a control character (U+000A, a newline)",
    ),
    "command NUL": (
        HEAD + '[models.w]\nruntime = "command"\ncommand = ["a\\u0000b"]\nmemory = "1MiB"\n',
        "8:12: models.w.command[0]: contains a control character (U+0000, NUL)",
    ),
    "model key with a trailing newline": (
        HEAD + '[models."w1\\n"]\nruntime = "command"\ncommand = ["x"]\nmemory = "1MiB"\n',
        '6:9: models."w1\\n": key contains a control character (U+000A, a newline)',
    ),
    "env value tab": (
        WORKER + '[models.w.env]\nA = "x\\t#y"\n',
        "11:5: models.w.env.A: contains a control character (U+0009, a tab)",
    ),
    "env key newline": (
        WORKER + '[models.w.env]\n"A\\nB" = "x"\n',
        '11:1: models.w.env."A\\nB": key contains a control character (U+000A, a newline)',
    ),
    "token_env newline": (
        WORKER + '[gateway]\ntoken_env = "TOK\\n"\n',
        "11:13: gateway.token_env: contains a control character (U+000A, a newline)",
    ),
    "sysctl key newline": (
        WORKER + '[sysctl]\n"vm.x\\n" = 1\n',
        '11:1: sysctl."vm.x\\n": key contains a control character (U+000A, a newline)',
    ),
    "sysctl value line separator": (
        WORKER + '[sysctl]\n"vm.swappiness" = "1\\u2028vm.x = 2"\n',
        '11:19: sysctl."vm.swappiness": contains a control character (U+2028, line separator)',
    ),
    "gateway host escape": (
        WORKER + '[gateway]\nhost = "127.0.0.1\\u001b"\n',
        "11:8: gateway.host: contains a control character (U+001B, escape)",
    ),
    "alias DEL": (
        WORKER + 'aliases = ["a\\u007f"]\n',
        "10:12: models.w.aliases[0]: contains a control character (U+007F, DEL)",
    ),
}


@pytest.mark.parametrize("command", ["check", "build"])
@pytest.mark.parametrize("text,expected", INJECTIONS.values(), ids=INJECTIONS.keys())
def test_control_characters_refused(tmp_path: Path, run_cli, command: str, text: str, expected: str) -> None:
    (tmp_path / "stack.toml").write_text(text)
    args = ["-o", str(tmp_path / "out")] if command == "build" else []
    code, out, err = run_cli(command, "stack.toml", *args, cwd=tmp_path)
    assert (code, out, err) == (2, "", f"stack.toml:{expected}\n{CTRL_HINT}\n")
    assert not (tmp_path / "out").exists()


COMMENT = "whitespace followed by '#' or ';' starts an inline comment in supervisord's config"
# Values supervisord's INI layer cannot carry without control characters either: refused alike.
UNCARRIABLE = {
    "cwd with ' ;'": (
        WORKER + 'cwd = "/a dir ;comment"\n',
        f'10:7: models.w.cwd: "/a dir ;comment" cannot be written into supervisord\'s directory=: '
        f"{COMMENT}\n  hint: use a directory whose path has no ' #'/' ;' and no surrounding spaces",
    ),
    "cwd with a trailing space": (
        WORKER + 'cwd = "/tmp/x "\n',
        '10:7: models.w.cwd: "/tmp/x " cannot be written into supervisord\'s directory=: '
        "supervisord strips leading and trailing whitespace from a value\n"
        "  hint: use a directory whose path has no ' #'/' ;' and no surrounding spaces",
    ),
    "argument with ' #'": (
        HEAD + '[models.w]\nruntime = "command"\ncommand = ["python3", "-c", "pass", "x #y"]\nmemory = "1MiB"\n',
        f'8:37: models.w.command[3]: "x #y" cannot be written into supervisord\'s command=: '
        f"{COMMENT}\n  hint: write the value without a space before '#' or ';'",
    ),
    "llama args with ' ;'": (
        HEAD + '[models.w]\nruntime = "llama-server"\narch = "llama-3-8b"\nargs = ["--alias", "a ;b"]\n',
        f'9:20: models.w.args[1]: "a ;b" cannot be written into supervisord\'s command=: '
        f"{COMMENT}\n  hint: write the value without a space before '#' or ';'",
    ),
    "bin with ' #'": (
        HEAD + '[models.w]\nruntime = "llama-server"\narch = "llama-3-8b"\nbin = "/opt/x #1/llama"\n',
        f'9:7: models.w.bin: "/opt/x #1/llama" cannot be written into supervisord\'s command=: '
        f"{COMMENT}\n  hint: rename the file or directory",
    ),
    "env value with both quotes": (
        WORKER + '[models.w.env]\nA = "say \\"hi\\" it\'s"\n',
        "11:5: models.w.env.A: supervisord's environment= cannot carry this value: it "
        "contains both quote kinds\n  hint: remove the quote characters or the ' #'/' ;' "
        "sequence",
    ),
    "env value quoted": (
        WORKER + "[models.w.env]\nA = \"'quoted'\"\n",
        "11:5: models.w.env.A: supervisord's environment= cannot carry this value: it begins or "
        "ends with a quote character (supervisord strips those)\n  hint: remove the quote "
        "characters or the ' #'/' ;' sequence",
    ),
    "env value with ' ;'": (
        WORKER + '[models.w.env]\nA = "x ;y"\n',
        f"11:5: models.w.env.A: supervisord's environment= cannot carry this value: {COMMENT}\n"
        "  hint: remove the quote characters or the ' #'/' ;' sequence",
    ),
    "gateway host with ' ;'": (
        WORKER + '[gateway]\nhost = "127.0.0.1 ;[program:x]"\n',
        '11:8: gateway.host: not an IP address or host name: "127.0.0.1 ;[program:x]"\n'
        '  hint: e.g. "127.0.0.1" (default), "0.0.0.0" or "::"',
    ),
    "worker env naming the gateway token": (
        WORKER + '[models.w.env]\nTOK = "x"\n[gateway]\ntoken_env = "TOK"\n',
        "11:1: models.w.env.TOK: is the gateway's token variable "
        "(gateway.token_env): workers never receive the gateway's token\n"
        "  hint: give the worker its own variable",
    ),
}


@pytest.mark.parametrize("command", ["check", "build"])
@pytest.mark.parametrize("text,expected", UNCARRIABLE.values(), ids=UNCARRIABLE.keys())
def test_uncarriable_values_refused_by_check_and_build(
    tmp_path: Path, run_cli, command: str, text: str, expected: str
) -> None:
    (tmp_path / "stack.toml").write_text(text)
    args = ["-o", str(tmp_path / "out")] if command == "build" else []
    code, out, err = run_cli(command, "stack.toml", *args, cwd=tmp_path)
    assert (code, out, err) == (2, "", f"stack.toml:{expected}\n")
    assert not (tmp_path / "out").exists()


# Values supervisord can carry once escaped: they must arrive exactly (supervisor's own parser says).
CARRIED = [
    "100%",
    "%(ENV_HOME)s",
    "%%",
    "a,b",
    "x=y,z=w",
    'dq"inner',
    "it's",
    "$HOME",
    "${HOME}",
    "ünïcødé ✓ 模型",
    "",
    " leading",
    "trailing ",
    "a'b",
    "semi;colon",
    "hash#tag",
    "back\\slash",
    "--flag=1",
    "a=b",
    "x;#y",
]
# command= is shlex-quoted, so these reach argv exactly too, though environment= refuses them
CARRIED_IN_ARGV = CARRIED + ['say "hi" it\'s', "'quoted'", '"quoted"']


def toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@pytest.mark.parametrize("value", CARRIED, ids=[repr(v) for v in CARRIED])
def test_environment_values_carried_exactly(tmp_path: Path, programs, value: str) -> None:
    stack = tmp_path / "stack.toml"
    stack.write_text(WORKER + f"[models.w.env]\nHOSTILE = {toml_str(value)}\n")
    env = programs(build_stack(stack, tmp_path / "bundle"))["w"].environment
    # the model's own variables reach the wrapper renamed (it gives them their names just before exec)
    assert (env["UMEMC_ENV_HOSTILE"], env["UMEMC_MODEL"], "HOSTILE" in env) == (value, "w", False)


@pytest.mark.parametrize("arg", CARRIED_IN_ARGV, ids=[repr(v) for v in CARRIED_IN_ARGV])
def test_command_arguments_carried_exactly(tmp_path: Path, programs, arg: str) -> None:
    stack = tmp_path / "stack.toml"
    stack.write_text(WORKER.replace('"pass"]', f'"pass", {toml_str(arg)}]'))
    command = shlex.split(programs(build_stack(stack, tmp_path / "bundle"))["w"].command)
    assert command[command.index("--") + 1 :] == ["python3", "-c", "pass", arg]
    assert command[command.index("--state") + 1] == str(tmp_path / "bundle" / "../state")


def test_percent_and_spaces_in_cwd_carried(tmp_path: Path, programs) -> None:
    (tmp_path / "dir 100%;x").mkdir()
    stack = tmp_path / "stack.toml"
    stack.write_text(WORKER + 'cwd = "dir 100%;x"\n')
    pc = programs(build_stack(stack, tmp_path / "bundle"))["w"]
    assert pc.directory == str(tmp_path / "dir 100%;x")
    assert shlex.split(pc.command)[:4] == [sys.executable, "-I", "-S", str(REPO / "umemc/runtime/wrap_entry.py")]


def test_no_program_but_the_stacks_own(tmp_path: Path, programs) -> None:
    """The generated config defines exactly umemc's programs and the stack's models, nothing else."""
    stack = tmp_path / "stack.toml"
    stack.write_text(WORKER + 'args = []\n[models.w.env]\nA = "]\\\\n[program:pwn]"\n')
    assert sorted(programs(build_stack(stack, tmp_path / "bundle"))) == ["umemc-enforcer", "umemc-gateway", "w"]
    # a stack without a gateway runs its standby enforcer as a program of its own
    stack.write_text(stack.read_text() + "[gateway]\nenabled = false\n")
    assert sorted(programs(build_stack(stack, tmp_path / "bundle2"))) == [
        "umemc-enforcer",
        "umemc-enforcer-standby",
        "w",
    ]


BIG = "9" * 400
BOUNDS = {
    "400-digit size string": (
        WORKER.replace('"64MiB"', f'"{BIG}GiB"'),
        f'9:10: models.w.memory: too large (got "{BIG[:60]}…"; at most 1152921504606846976 bytes)',
    ),
    "400-digit size integer": (
        WORKER.replace('"64MiB"', BIG),
        f"9:10: models.w.memory: too large (got {BIG}; at most 1152921504606846976 bytes)",
    ),
    "endless sample_interval": (
        WORKER + f'[policy]\nsample_interval = "{BIG}s"\n',
        f'11:19: policy.sample_interval: too long (got "{BIG[:60]}…"; at most 365 days)',
    ),
    "port past 65535": (WORKER + "port = 65536\n", "10:8: models.w.port: must be <= 65535 (got 65536)"),
    "gateway port past 65535": (
        WORKER + "[gateway]\nport = 70000\n",
        "11:8: gateway.port: must be <= 65535 (got 70000)",
    ),
    "umemc's own variable in env": (
        WORKER + '[models.w.env]\nUMEMC_QUOTA_HARD_BYTES = "1"\n',
        "11:1: models.w.env.UMEMC_QUOTA_HARD_BYTES: is umemc's own: every worker gets UMEMC_MODEL, UMEMC_HOST, "
        "UMEMC_PORT, UMEMC_STATE and UMEMC_QUOTA_*_BYTES from the plan (and UMEMC_ENV_* carries the model's env "
        "to it)\n"
        "  hint: give the variable another name",
    ),
    "an empty command": (
        WORKER.replace('["python3", "-c", "pass"]', '[""]'),
        "8:12: models.w.command[0]: must name a program (got an empty string)\n"
        '  hint: command = ["python", "-m", "my_worker", "--port", "{port}"]',
    ),
    "deep arrays": (
        "version = 1\na = " + "[" * 40 + "]" * 40 + "\n",
        "2:21: a[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]: nested more than 16 levels deep\n"
        "  hint: a stack file needs at most a few levels",
    ),
    "very deep arrays": (
        "version = 1\na = " + "[" * 5000 + "]" * 5000 + "\n",
        "1:1: arrays or inline tables nested too deeply\n  hint: a stack file needs at most a few levels",
    ),
}


@pytest.mark.parametrize("text,expected", BOUNDS.values(), ids=BOUNDS.keys())
def test_bounds_are_located_errors(tmp_path: Path, run_cli, text: str, expected: str) -> None:
    (tmp_path / "stack.toml").write_text(text)
    code, out, err = run_cli("check", "stack.toml", cwd=tmp_path)
    assert (code, out, err) == (2, "", f"stack.toml:{expected}\n")


def test_device_file_refused(run_cli) -> None:
    assert run_cli("check", "/dev/zero") == (
        2,
        "",
        "/dev/zero: not a regular file\n  hint: give the path of a .toml stack file\n",
    )


def test_fifo_refused_without_blocking(tmp_path: Path, run_cli) -> None:
    os.mkfifo(tmp_path / "stack.toml")  # nobody writes to it: a plain open() would block forever
    assert run_cli("check", "stack.toml", cwd=tmp_path) == (
        2,
        "",
        "stack.toml: not a regular file\n  hint: give the path of a .toml stack file\n",
    )


@pytest.mark.parametrize("key", ["model", "mmproj"])
@pytest.mark.parametrize("command", ["check", "build"])
def test_a_fifo_named_as_a_model_file_is_refused_without_blocking(
    tmp_path: Path, run_cli, key: str, command: str
) -> None:
    from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

    write_tiny_gguf(tmp_path / "real.gguf", TinySpec())
    os.mkfifo(tmp_path / "pipe.gguf")  # nobody writes to it: opening it would wait forever
    files = {"model": "real.gguf", "mmproj": None} | {key: "pipe.gguf"}
    extra = "".join(f'{k} = "{v}"\n' for k, v in files.items() if v)
    (tmp_path / "stack.toml").write_text(
        'version = 1\nname = "f"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n[models.m]\nruntime = "llama-server"\n'
        + extra
    )
    col = 9 if key == "model" else 10
    line = 8 if key == "model" else 9
    assert run_cli(command, "stack.toml", cwd=tmp_path) == (
        2,
        "",
        f"stack.toml:{line}:{col}: models.m.{key}: not a regular file: {tmp_path / 'pipe.gguf'} is a FIFO\n"
        "  hint: name the model's file itself\n",
    )


def test_directory_refused(tmp_path: Path, run_cli) -> None:
    assert run_cli("check", str(tmp_path)) == (
        2,
        "",
        f"{tmp_path}: is a directory\n  hint: give the path of a .toml stack file\n",
    )


def test_output_through_a_symlink_refused(tmp_path: Path, run_cli) -> None:
    (tmp_path / "stack.toml").write_text(WORKER)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    code, out, err = run_cli("build", "stack.toml", "-o", "out", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err == (
        f"refusing to write a bundle through the symbolic link {tmp_path}/out (it points to "
        f"{tmp_path}/elsewhere); give the real directory\n"
    )
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_output_path_with_a_quote_refused(tmp_path: Path, run_cli) -> None:
    (tmp_path / "stack.toml").write_text(WORKER)
    code, out, err = run_cli("build", "stack.toml", "-o", 'a"b', cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err == (
        f"cannot write a bundle to '{tmp_path}/a\"b': supervisord.conf cannot name a directory whose "
        "path holds a double quote, a backslash or a control character; choose another -o\n"
    )


def test_bundle_is_private(tmp_path: Path, run_cli) -> None:
    """Worker environments (API keys) are in env/*.env, supervisord.conf and plan.json: 0700/0600."""
    (tmp_path / "stack.toml").write_text(WORKER + '[models.w.env]\nAPI_KEY = "sk-secret"\n')
    old = os.umask(0o022)
    try:
        assert run_cli("build", "stack.toml", "-o", "out", cwd=tmp_path)[0] == 0
    finally:
        os.umask(old)
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in sorted(tmp_path.glob("out/**/*"))}
    modes["out"] = (tmp_path / "out").stat().st_mode & 0o777
    assert modes["out"] == 0o700 and modes["out/env"] == 0o700
    assert modes["out/env/w.env"] == modes["out/plan.json"] == modes["out/supervisord.conf"] == 0o600
    assert all(mode in (0o600, 0o700) for mode in modes.values()), modes
