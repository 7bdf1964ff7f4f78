"""The command line. This wrapper is the only code that catches broad exceptions: it maps them
to the exit-code contract (docs/CONTRACTS.md): 0 ok, 1 does not fit / known runtime failure, 2 invalid
input, 3 internal error (traceback to a log file), 130 interrupted."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence

from .errors import UmemcError, UsageError

# each a module of umemc.commands with register(sub); only the one asked for is imported (the others' imports
# are most of a short command's time)
COMMANDS = (
    "init", "pull", "check", "build", "explain", "calibrate", "up", "down", "ps", "status", "events", "logs", "chat",
    "apply", "doctor",
    "lease-pod", "schema",
)  # fmt: skip


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise SystemExit(_usage_exit(f"{self.prog}: error: {message}"))


def _usage_exit(message: str) -> int:
    print(message, file=sys.stderr)
    return 2


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv` naming a command first, only that command's (`umemc --help`, a typo: all)."""
    parser = _Parser(prog="umemc", description="Memory budgets for several AI models on one unified-memory machine.")
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    first = next(iter(argv), None) if argv is not None else None
    for name in (first,) if first in COMMANDS else COMMANDS:
        importlib.import_module(f"umemc.commands.{name.replace('-', '_')}").register(sub)
    return parser


class _VersionAction(argparse.Action):
    """--version, resolved only when asked (importlib.metadata costs ~30 ms on every run otherwise)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"umemc {umemc_version()}")
        parser.exit()


def umemc_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("umemc")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parse(argv) if argv is not None else _parse_as_process(sys.argv[1:])
        if getattr(args, "stack_name", None) is not None:
            from .runtime.registry import find

            if args.run_dir is not None:
                raise UsageError(f"umemc {args.command}: name a stack or give --run-dir, not both")
            args.run_dir = str(find(args.stack_name))
        if getattr(args, "find_run_dir", None) and args.run_dir is None:
            from .commands.up import find_run_dir

            args.run_dir = find_run_dir(running=args.find_run_dir == "running")
        return int(args.func(args))
    except UmemcError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("umemc: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    except BrokenPipeError:
        return 0
    except Exception:  # noqa: BLE001 - the contract: an unexpected error is exit 3 with the traceback in a file
        return _crash(sys.argv if argv is None else ["umemc", *argv])


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser(argv).parse_args(argv)


def _parse_as_process(argv: Sequence[str]) -> argparse.Namespace:
    """_parse where this process is the command (the `umemc` script, `python -m umemc`). Most of a short
    command's time is importing and building classes, tens of thousands of objects that live as long as the
    process: the cyclic collector, left on, walks them again at every threshold it crosses (a sixth of `umemc
    check`). So it is off while the command is imported, those objects are then set aside for good (gc.freeze:
    never walked again), and it is on for the command's own work (a long `up`, a 5000-model stack). Not where main
    is called in a longer-lived process (tests, a library user): there freezing would keep that process's garbage.

    Pydantic looks for plugins (observability hooks, found through every installed package's entry points) when
    it builds its first model; umemc's stack models want none, and the scan is a few ms of every command. It is
    skipped while the command is imported, where the person has not said otherwise; the variable is taken back
    after, so nothing umemc starts inherits it."""
    gc.disable()
    plugins_unset = "PYDANTIC_DISABLE_PLUGINS" not in os.environ
    if plugins_unset:
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    try:
        return _parse(argv)
    finally:
        if plugins_unset:
            os.environ.pop("PYDANTIC_DISABLE_PLUGINS", None)
        gc.freeze()
        gc.enable()


def _crash(argv: Sequence[str]) -> int:
    """The traceback into a file a user can attach to a bug report as it is: umemc's version, Python's, the platform
    and the command line above it (pre-commit's error handler does the same). No environment: it may hold secrets."""
    import platform
    import shlex
    import tempfile  # here: a crash is rare, and every command's start would pay for these imports
    import traceback

    from .chars import shown

    with tempfile.NamedTemporaryFile("w", prefix="umemc-crash-", suffix=".log", delete=False) as f:
        f.write(
            "### umemc crashed: please attach this file to a bug report\n"
            f"umemc:   {umemc_version()}\n"
            f"python:  {shown(sys.version.splitlines()[0])} ({sys.executable})\n"
            f"platform: {platform.platform()} ({platform.machine()})\n"
            f"command: {shown(shlex.join(argv))}\n\n"
        )
        traceback.print_exc(file=f)
        path = f.name
    print(f"umemc: internal error (a bug in umemc); traceback written to {path}", file=sys.stderr)
    return 3
