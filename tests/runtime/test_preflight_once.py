"""`umemc up` again on a running stack (a reconcile) says only what is true now and a warning once per change: the
sysctl warning the first `up` printed is one line the second time, "0 ports free" and "(0.0 GiB)" are not said."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.conftest import free_port, worker

pytestmark = pytest.mark.slow


def test_a_second_up_says_a_warning_once_and_nothing_untrue(stack, capsys, tmp_path: Path) -> None:
    # no [sysctl] table: this box's own (stock) values, against a plan whose small hot set makes them a warning
    text = 'version = 1\nname = "once"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n' + worker(
        "w", "steady.py", "{port}", 5, memory="64MiB", port=free_port()
    )
    r = stack(text)
    first = capsys.readouterr().out
    sysctl = [x for x in first.splitlines() if "sysctl:" in x]
    if not sysctl:
        pytest.skip("this machine's VM tunables already are the plan's: there is no warning to repeat")
    assert "ports free" in first and "covers the hot set's hard quotas" in first
    from tests.conftest import patience
    from umemc.cli import main

    stack_file = r.run_dir.parent / "stack.toml"
    assert main(["up", str(stack_file), "--run-dir", str(r.run_dir), "--timeout", str(patience(60))]) == 0
    second = capsys.readouterr().out
    assert not [x for x in second.splitlines() if "sysctl:" in x]
    assert "  1 warning(s) as the last `up` said them (sysctl): `umemc doctor` repeats them" in second.splitlines()
    assert "ports free" not in second and "covers the hot set's hard quotas" not in second
