"""Which processes are a run's, and stopping them whatever is left of it: found by the run's cgroups (by name, no
record needed), by its records (pid and start time) and by its mark (UMEMC_RUN, inherited by everything the exec
wrapper starts), so `umemc down`, the next `umemc up` and the reaper stop every process of a run whose supervisord,
pid file or plan.json is gone, and kill nothing that is not the run's."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ..contract import CgroupRecord, PidRecord
from ..names import RUN_MARK
from ..records import read_text
from .cgroups import Cgroup, run_backends
from .probes.host import alive, marked_processes, processes, start_time
from .rundir import RunDir, run_mark
from .supervisor import RPC_ERRORS, Supervisor


@dataclass(frozen=True)
class RunMembers:
    run: RunDir
    name: str  # the stack's name (its cgroups are named for it)

    def leftovers(self) -> dict[str, list[int]]:
        """Processes of this run still alive, by name: members of the run's cgroups (found by name, so
        no record is needed), recorded pids whose start time still matches and that carry the run's mark,
        and any other process carrying the mark (a double-forked daemon where no cgroup holds it). With
        supervisord running these are its programs; without it, orphans."""
        out: dict[str, set[int]] = {}
        for group in self._groups():
            pids = [p for p in group.pids() if alive(p)]
            if pids:
                out.setdefault(group.path.name, set()).update(pids)
        for record in self.run.records():
            if same_process(record) and self.belongs(record.pid):
                out.setdefault(record.name, set()).add(record.pid)
        seen = {p for pids in out.values() for p in pids}
        for pid, model in self._marked():
            if pid not in seen:
                out.setdefault(model or "unrecorded", set()).add(pid)
        return {name: sorted(pids) for name, pids in sorted(out.items())}

    def belongs(self, pid: int) -> bool:
        """Whether a process is of this run: it carries the run's mark (UMEMC_RUN, set by the exec wrapper and
        inherited) or sits in one of the run's own cgroups. A record copied from another run names a real
        process, with the right start time, that is not ours: it is never killed."""
        if _mark_of(pid) == self.mark:
            return True
        return any(pid in g.pids() for g in self._own_groups())

    @property
    def mark(self) -> str:
        return run_mark(self.run.state)

    def foreign_records(self) -> list[str]:
        """Records naming a live process that is not of this run (forged, or copied from another run)."""
        return [
            f"{r.name}: pid {r.pid} is not a process of this run"
            for r in self.run.records()
            if same_process(r) and not self.belongs(r.pid)
        ]

    def _marked(self) -> list[tuple[int, str | None]]:
        """Every process carrying this run's mark, with the model it was started for (UMEMC_MODEL)."""
        return marked_processes(self.mark)

    def _own_groups(self) -> list[Cgroup]:
        return [g for b in run_backends(self.run.state) for g in b.groups()]

    def _groups(self) -> list[Cgroup]:
        """The run's cgroups: by name below umemc's own cgroup, plus any recorded elsewhere that is named
        for this run (a record pointing at another run's group is ignored)."""
        from .cgroups import group_name

        groups = {g.path: g for g in self._own_groups()}
        folder = self.run.cgroups
        ours = group_name(self.name, self.run.state)
        with contextlib.suppress(OSError):
            for record in folder.iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    rec = CgroupRecord.parse(read_text(record))
                    if rec.path.is_dir() and ours in rec.path.parts:
                        groups.setdefault(rec.path, Cgroup(rec.version, rec.path))
        return list(groups.values())

    def sweep(self) -> tuple[list[int], dict[str, list[int]]]:
        """Kill every process of the run that is still alive, whatever supervisord's fate: all members
        of its cgroups (double-forked `setsid` children too), recorded pids of this run with their process
        groups, and every process carrying the run's mark. Then remove the cgroups, and forget only the
        records of what is gone. Returns (pids killed, what survived by name: records of those are kept)."""
        before = self.leftovers()
        deadline = time.monotonic() + 5
        # kill, look again, kill what is new (a process forked a daemon between the scan and its own death)
        while True:
            self._kill_pass()
            if not (left := self.leftovers()) or time.monotonic() >= deadline:
                break
            before = {n: sorted(set(before.get(n, [])) | set(p)) for n, p in (before | left).items()}
            time.sleep(0.05)
        for backend in run_backends(self.run.state):
            backend.remove_all()
        for group in self._groups():
            group.remove()
        left = self.leftovers()
        for record in self.run.records():
            if record.name not in left:
                self.run.forget(record.name)
        for folder in (self.run.cgroups, self.run.pids):  # a wrapper killed mid-write leaves `.NAME.tmp` there
            with contextlib.suppress(OSError):
                for path in folder.iterdir():
                    if path.name not in left and (folder == self.run.cgroups or path.name.endswith(".tmp")):
                        path.unlink()
        killed = sorted({p for pids in before.values() for p in pids})
        return killed, left

    def _kill_pass(self) -> None:
        """SIGKILL to every member of the run's cgroups, every recorded process of this run (with its process
        group) and every process carrying the run's mark."""
        for group in self._groups():
            group.kill_all()
        for record in self.run.records():
            if same_process(record):
                if self.belongs(record.pid):
                    _kill_group(record.pid)
            elif not _exists(record.pid):
                _kill_group(record.pid)  # the leader is gone, its group may not be: a free pid is never a pgid
        for pid, _ in self._marked():
            _kill_group(pid)

    def groups_left(self) -> list[Path]:
        return [g.path for g in self._groups()]

    def stop_all(self, supervisor: Supervisor, timeout: float = 120.0) -> tuple[list[int], list[int]]:
        """Stop every program, shut supervisord down, then make sure by PID that nothing of the stack
        survives. Returns (pids that were running, pids that had to be killed)."""
        sup, tree = supervisor, processes()
        pids: set[int] = set()
        with contextlib.suppress(*RPC_ERRORS):
            for info in sup.processes().values():
                if info["pid"]:
                    pids.update(tree.descendants(info["pid"]))
        sv_pid = self.run.supervisord_pid()
        with contextlib.suppress(*RPC_ERRORS):  # the pid file may have been deleted: ask supervisord
            sv_pid = int(sup.call("supervisor.getPID"))
        with contextlib.suppress(*RPC_ERRORS):
            sup.call("supervisor.stopAllProcesses", True)
        with contextlib.suppress(*RPC_ERRORS):
            sup.call("supervisor.shutdown")
        deadline = time.monotonic() + timeout
        while sv_pid is not None and alive(sv_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed = [p for p in sorted(pids) if alive(p)]
        for p in killed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        return sorted(pids), killed


def same_process(record: PidRecord) -> bool:
    """The recorded pid still names the recorded process (not a later one that reused the pid)."""
    return alive(record.pid) and start_time(record.pid) == record.start


def _mark_of(pid: int) -> str | None:
    return processes().run_environ(pid).get(RUN_MARK)


def _exists(pid: int) -> bool:
    """Any process (a zombie too) holds the pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)
