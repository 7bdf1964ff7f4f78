"""A command's arguments, typed (kept apart from common.py, whose imports a short command does without)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Self


class Args:
    """A command's arguments, typed, so that mypy --strict reaches the command (argparse's Namespace is Any to it):
    each command declares a frozen dataclass of the destinations its parser fills and reads the Namespace once,
    through `of`. tests/test_cli.py holds each one's fields to its parser's destinations."""

    @classmethod
    def of(cls, ns: argparse.Namespace) -> Self:
        given: Any = cls  # a dataclass: its subclasses are
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(given)})
