"""Helpers for bundle tests: build a stack into a bundle, parse it with supervisor's own parser."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.stack.resolve import load_stack


def build_stack(stack: Path, out: Path) -> Path:
    build(make_plan(load_stack(stack)), out)
    return out


def parse_supervisord(bundle: Path):  # type: ignore[no-untyped-def]
    """supervisor's ServerOptions on the generated config (it insists the log dirs exist), with the socket
    variable `umemc up` gives supervisord; the socket it then binds is the run dir's."""
    from supervisor.options import ServerOptions

    (bundle.parent / "state" / "logs").mkdir(parents=True, exist_ok=True)
    sock = bundle.parent / "state" / "supervisor.sock"
    with mock.patch.dict(os.environ, {"UMEMC_SUPERVISOR_SOCKET": str(sock)}):
        opts = ServerOptions()
        opts.realize(args=["-c", str(bundle / "supervisord.conf")])
    assert [c["file"] for c in opts.server_configs] == [str(sock.absolute())]
    return opts


@pytest.fixture
def programs():  # type: ignore[no-untyped-def]
    def get(bundle: Path) -> dict[str, object]:
        opts = parse_supervisord(bundle)
        return {pc.name: pc for g in opts.process_group_configs for pc in g.process_configs}

    return get
