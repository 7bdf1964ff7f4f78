"""The one Jinja environment every target renders with, and the escaping filters it offers."""

from __future__ import annotations

import shlex
from functools import lru_cache
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

import jinja2

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"  # -> top-level templates/ (symlink)


def supervisor_command(argv: tuple[str, ...] | list[str]) -> str:
    """argv -> supervisord `command=`: POSIX-quoted (supervisord shlex-splits it), `%` doubled
    (every option is %-expanded first)."""
    return shlex.join(argv).replace("%", "%%")


def supervisor_value(value: str) -> str:
    return value.replace("%", "%%")


def supervisor_env(env: tuple[tuple[str, str], ...]) -> str:
    """env -> supervisord `environment=`. Its parser splits with a legacy shlex and strips every
    leading/trailing quote, so: double-quote each value, or single-quote one that holds a double
    quote. Values it cannot carry were refused at compile time (compile.env_problem)."""
    parts = []
    for key, value in env:
        quoted = f"'{value}'" if '"' in value else f'"{value}"'
        parts.append(f"{key}={supervisor_value(quoted)}")
    return ",".join(parts)


def systemd_env_value(value: str) -> str:
    """A value for a systemd EnvironmentFile= line: double-quoted, with \\ " $ ` escaped."""
    out = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return f'"{out}"'


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,  # a typo in a template is an error, never an empty string
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        # Autoescape off: the outputs are INI, shell, sysctl, systemd and XML, each with its own
        # escaping; every value goes through the filter for its format explicitly.
        autoescape=False,
    )
    env.filters.update(
        supervisor_command=supervisor_command,
        supervisor_value=supervisor_value,
        supervisor_env=supervisor_env,
        systemd_env=systemd_env_value,
        xml=xml_escape,
        sh=shlex.quote,
    )
    return env


def render(template: str, **values: object) -> str:
    return environment().get_template(template).render(**values)
