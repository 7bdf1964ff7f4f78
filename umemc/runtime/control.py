"""A run of a stack as the commands see it (`up`, `down`, `status`): its run dir, its plan, its supervisord and
whether that runs. The run's processes are RunMembers' (members.py: found by cgroup, record and mark, and stopped
whatever is left); what `up` waits for is waits.py; `up` on a running stack is reconcile.py."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..contract import ContractError, PlanDoc, read
from ..errors import RuntimeFailure
from .event_log import EventLog
from .members import RunMembers, same_process
from .probes.host import processes
from .rundir import RunDir
from .supervisor import Supervisor


class PlanUnreadable(ContractError):
    """RUN/bundle/plan.json is missing or corrupt (exit 2); `umemc down` still stops everything."""


@dataclass
class Stack:
    run: RunDir

    @property
    def plan(self) -> PlanDoc:
        try:
            return read(PlanDoc, self.run.plan)
        except ContractError as exc:
            raise PlanUnreadable(
                f"{exc}; `umemc down --run-dir {self.run.root}` still stops everything the stack started"
            ) from None

    def name(self) -> str:
        """The stack's name for messages; a corrupt plan still leaves the run dir to name it by."""
        try:
            return self.plan.stack
        except PlanUnreadable:
            return f"in {self.run.root}"

    @property
    def supervisor(self) -> Supervisor:
        return Supervisor(self.run.socket())

    @property
    def members(self) -> RunMembers:
        return RunMembers(self.run, self.name())

    def state(self) -> str:
        """running | stopped. Read-only: it never removes a file (a stale socket is `clean_stale`'s).
        The socket is asked first, so a deleted pid file does not lose a running stack."""
        if self.supervisor.alive():
            return "running"
        pid = self.run.supervisord_pid()
        if pid is not None and _is_supervisord(pid):
            raise RuntimeFailure(
                f"supervisord (pid {pid}) runs but does not answer on {self.run.socket()}; "
                f"`umemc down --run-dir {self.run.root}` stops it and everything it started"
            )
        return "stopped"

    def clean_stale(self) -> bool:
        """With supervisord gone, remove its pid file and socket, and forget the records of processes that are
        gone (a dead supervisord's record would be read as the new one's before the new one rewrites it);
        True when there was a pid file or socket."""
        stale = [p for p in (self.run.pidfile, self.run.socket()) if p.exists() or p.is_symlink()]
        for p in stale:
            with contextlib.suppress(OSError):
                p.unlink()
        for record in self.run.records():
            if not same_process(record):
                self.run.forget(record.name)
        return bool(stale)

    def events(self) -> EventLog:
        return EventLog(self.run.events)


def _is_supervisord(pid: int) -> bool:
    return any("supervisord" in arg for arg in processes().cmdline(pid))
