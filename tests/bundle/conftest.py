"""Helpers for bundle tests: build a stack into a bundle, parse it with supervisor's own parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from umemc.budget import make_plan
from umemc.commands.build import build
from umemc.stack.resolve import load_stack


def build_stack(stack: Path, out: Path) -> Path:
    build(make_plan(load_stack(stack)), out)
    return out


def parse_supervisord(bundle: Path):  # type: ignore[no-untyped-def]
    """supervisor's ServerOptions on the generated config (it insists the log dirs exist)."""
    from supervisor.options import ServerOptions

    (bundle.parent / "state" / "logs").mkdir(parents=True, exist_ok=True)
    opts = ServerOptions()
    opts.realize(args=["-c", str(bundle / "supervisord.conf")])
    return opts


@pytest.fixture
def programs():  # type: ignore[no-untyped-def]
    def get(bundle: Path) -> dict[str, object]:
        opts = parse_supervisord(bundle)
        return {pc.name: pc for g in opts.process_group_configs for pc in g.process_configs}

    return get
