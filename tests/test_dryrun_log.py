"""A llama-fit-params whose log is cut short at exit (llama.cpp's logger is not flushed then, which happens on a
busy machine): umemc asks again rather than reading a log without its buffer lines as "no KV, no compute".

The stand-in program prints recorded outputs of the real llama-fit-params (tests/recorded/README.md says how
they were made): the cut one for its first runs, then the whole one. The real program cannot be made to cut its
log on demand; tests/runtime/test_dryrun.py runs it for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from umemc.estimate.dryrun import FIT_PARAMS, FIT_PARAMS_TRIES, RuntimeFailure, Tool, bound, run
from umemc.lockfile import tool_identity

RECORDED = Path(__file__).resolve().parent / "recorded"
MiB = 2**20


def stand_in(tmp_path: Path, cut_runs: int) -> Tool:
    """A program answering `--version` like llama.cpp and any other argv with a recorded output: the cut log
    for its first `cut_runs` runs (counted in a file beside it), the whole one after."""
    count = tmp_path / "runs"
    program = tmp_path / "llama-fit-params"
    program.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "from pathlib import Path\n"
        "if sys.argv[1:] == ['--version']:\n"
        "    print('version: 1 (recorded)')\n"
        "    sys.exit(0)\n"
        f"count = Path({str(count)!r})\n"
        "n = int(count.read_text()) if count.exists() else 0\n"
        "count.write_text(str(n + 1))\n"
        f"name = 'llama-fit-params-falcon-h1.cut.log' if n < {cut_runs} else 'llama-fit-params-falcon-h1.log'\n"
        f"sys.stdout.write((Path({str(RECORDED)!r}) / name).read_text())\n"
    )
    program.chmod(0o755)
    ident = tool_identity(program)
    assert ident is not None
    return Tool(FIT_PARAMS, str(program), ident)


def test_a_cut_log_is_asked_again_and_the_whole_answer_kept(tmp_path: Path) -> None:
    answer = run(stand_in(tmp_path, cut_runs=2), ["-m", "falcon.gguf"], {})
    assert (tmp_path / "runs").read_text() == "3"
    # the whole log's lines: KV 16.00 MiB, recurrent state 4.20 MiB, compute 33.84 MiB, output 0.03 MiB
    assert answer.buffers == {
        "CPU": {"model": 0, "output": round(0.03 * MiB), "kv": 16 * MiB, "rs": round(4.20 * MiB),
                "compute": round(33.84 * MiB)},
    }  # fmt: skip
    assert answer.table == {"Host": {"model": 70 * MiB, "context": 20 * MiB, "compute": 33 * MiB}}


def test_a_log_cut_every_time_is_no_answer(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure) as exc:
        run(stand_in(tmp_path, cut_runs=FIT_PARAMS_TRIES), ["-m", "falcon.gguf"], {})
    assert str(exc.value) == (
        "llama-fit-params exited 5 times before its log was written out (llama.cpp's logger is not flushed at "
        "exit): its answer is incomplete"
    )
    assert (tmp_path / "runs").read_text() == "5"


def program(tmp_path: Path, body: str) -> Tool:
    """A llama-fit-params stand-in that answers `--version` like llama.cpp and runs `body` for any other argv."""
    path = tmp_path / "llama-fit-params"
    path.write_text(
        f"#!{sys.executable}\nimport os, signal, sys, time\n"
        "if sys.argv[1:] == ['--version']:\n    print('version: 1 (recorded)')\n    sys.exit(0)\n" + body
    )
    path.chmod(0o755)
    ident = tool_identity(path)
    assert ident is not None
    return Tool(FIT_PARAMS, str(path), ident)


def test_a_dry_run_that_hangs_is_stopped_at_its_bound_and_says_so(tmp_path: Path) -> None:
    """It says a line and then nothing, forever: stopped at its bound (here 1 s, said as bound() says it), with
    its last words; its process is gone."""
    tool = program(tmp_path, "print('llama_model_loader: loaded meta data', flush=True)\n"
                   f"open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\ntime.sleep(3600)\n")  # fmt: skip
    with pytest.raises(RuntimeFailure) as exc:
        run(tool, ["-m", "m.gguf"], {}, (1.0, "a test's bound"))
    assert str(exc.value) == (
        "llama-fit-params did not answer within 1 s (a test's bound) and was stopped: its last words: "
        "llama_model_loader: loaded meta data"
    )
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists()


def test_a_dry_run_killed_by_a_signal_says_which(tmp_path: Path) -> None:
    tool = program(tmp_path, "print('llama_model_load: error loading model', flush=True)\n"
                   "os.kill(os.getpid(), signal.SIGSEGV)\n")  # fmt: skip
    with pytest.raises(RuntimeFailure) as exc:
        run(tool, ["-m", "m.gguf"], {})
    assert str(exc.value) == (
        "llama-fit-params was killed by SIGSEGV while sizing the model: llama_model_load: error loading model"
    )


def test_the_bound_of_a_dry_run_follows_its_header() -> None:
    """30 s to start, and the header read at 8 MiB a second: a 64 MiB header (the largest umemc reads) 8 s more."""
    assert bound(64 * MiB) == (38.0, "30 s to start and 8.0 s for its 64 MiB header")
    assert bound(0) == (30.0, "30 s to start and 0.0 s for its 0 MiB header")


def absurd(tmp_path: Path, old: str, new: str) -> Tool:
    """The whole recorded log with one figure changed: what a broken or hostile llama-fit-params might print."""
    text = (RECORDED / "llama-fit-params-falcon-h1.log").read_text()
    assert text.count(old) == 1
    log = tmp_path / "absurd.log"
    log.write_text(text.replace(old, new))
    return program(tmp_path, f"sys.stdout.write(open({str(log)!r}).read())\n")


@pytest.mark.parametrize("figure", ["1.2.3", "...", "1e999", "nan", "-4"])
def test_a_figure_llama_cpp_never_prints_is_refused_with_its_line(tmp_path: Path, figure: str) -> None:
    tool = absurd(tmp_path, "CPU compute buffer size =    33.84 MiB", f"CPU compute buffer size =    {figure} MiB")
    with pytest.raises(RuntimeFailure) as exc:
        run(tool, ["-m", "falcon.gguf"], {})
    assert str(exc.value) == (
        "llama-fit-params's answer cannot be read (not a figure): "
        f"0.00.013.868 D sched_reserve:        CPU compute buffer size =    {figure} MiB"
    )


def test_a_figure_past_any_machine_is_refused_not_recorded(tmp_path: Path) -> None:
    """2^40 MiB is 1 EiB plus: more than a calibration file may hold, said as such rather than failing later."""
    tool = absurd(
        tmp_path, "CPU compute buffer size =    33.84 MiB", "CPU compute buffer size =    1099511627777.00 MiB"
    )
    with pytest.raises(RuntimeFailure) as exc:
        run(tool, ["-m", "falcon.gguf"], {})
    assert str(exc.value).startswith(
        "llama-fit-params's answer is beyond sense: 1099511627777.00 MiB for the CPU compute buffer (no machine "
        "holds 1 EiB); not used: "
    )


def test_control_characters_in_an_unreadable_line_are_shown_escaped(tmp_path: Path) -> None:
    tool = absurd(tmp_path, "CPU compute buffer size =    33.84 MiB", "CPU compute buffer size =  \x1b[2J MiB")
    with pytest.raises(RuntimeFailure) as exc:
        run(tool, ["-m", "falcon.gguf"], {})
    assert str(exc.value).endswith("CPU compute buffer size =  \\x1b[2J MiB")
