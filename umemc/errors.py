"""Errors a person can act on. The CLI wrapper (umemc.cli) maps them to exit codes."""

from __future__ import annotations

from typing import NamedTuple


class UmemcError(Exception):
    """A known failure with a message for the user. Exit code 2 unless a subclass says otherwise."""

    exit_code = 2


class UsageError(UmemcError):
    """Bad command-line arguments (exit 2)."""


class RuntimeFailure(UmemcError):
    """A known runtime failure: preflight refused, a worker never healthy (exit 1)."""

    exit_code = 1


class ContractError(UmemcError):
    """A state, plan or calibration file that this umemc cannot read (exit 2): corrupt, or another version."""


class Location(NamedTuple):
    file: str
    line: int
    col: int


class StackError(UmemcError):
    """An invalid stack: one message, `FILE:LINE:COL: key.path: what is wrong` + an optional hint."""

    def __init__(self, where: Location | None, path: str, message: str, hint: str | None = None):
        self.where = where
        self.path = path
        self.message = message
        self.hint = hint
        self.others: list[StackError] = []  # independent errors found with this one, each located
        self.unsaid = 0  # more beyond those said
        super().__init__(self.render())

    def with_others(self, others: list[StackError], unsaid: int = 0) -> StackError:
        """This error, then the others found with it (in the file's order), and how many more were not said."""
        self.others, self.unsaid = others, unsaid
        self.args = (self.render(),)
        return self

    def render(self) -> str:
        prefix = f"{self.where.file}:{self.where.line}:{self.where.col}: " if self.where else ""
        text = f"{prefix}{self.path}: {self.message}" if self.path else f"{prefix}{self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        for other in getattr(self, "others", []):
            text += "\n" + other.render()
        if getattr(self, "unsaid", 0):
            text += f"\n… and {self.unsaid} more"
        return text
