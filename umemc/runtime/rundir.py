"""The run dir: RUN/bundle (the bundle being run), RUN/state (socket, pid file, logs, events.db,
enforcer status, records). Unix socket paths are limited (107 bytes on Linux, 103 on macOS), and supervisord
binds SOCKET.PID first and links it into place, so the path must leave room for a pid: when RUN/state is too deep,
the socket goes into a short private (0700) directory and RUN/state/socket records where.

Records the exec wrapper writes, one file per process umemc starts (workers and umemc's own):
`state/pids/NAME` (`pid starttime`) and, where a cgroup could be had, `state/cgroups/NAME`
(`version path pid`). Any of these, plan.json included, may be missing or corrupt: `umemc down`
then finds the processes by the run's cgroups (named after the run, see cgroups.run_backends)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..names import CGROUPS_DIR, ENFORCERS, GATES_DIR, PIDS_DIR, PLAN_FILE, SECRETS_DIR, SUPERVISOR_CONFIG, UNSET_FILE
from ..names import ENFORCER as ENFORCER
from ..names import GATEWAY as GATEWAY
from ..names import SUPERVISORD as SUPERVISORD
from ..names import run_mark as run_mark
from ..records import read_text, write_atomic

if TYPE_CHECKING:
    from ..contract import PidRecord

# sun_path's size less its NUL, less supervisord's temporary name's ".PID" (Linux's pid_max is at most 4194304:
# seven digits; macOS's pids have five)
SOCKET_MAX = 103 - len(".99999") if sys.platform == "darwin" else 107 - len(".4194304")


class RunDir(NamedTuple):
    """Every path of a run, for every umemc process: `umemc up`/`down`/`status`, the enforcer and the gateway
    (from their --bundle), the exec wrapper (from its --state)."""

    root: Path
    state_dir: Path | None = None  # RUN/state unless a process was handed another (the wrapper's --state)

    @classmethod
    def of_bundle(cls, bundle: Path) -> RunDir:
        return cls((bundle / "..").resolve())

    @classmethod
    def of_state(cls, state: Path) -> RunDir:
        state = state.resolve()
        return cls(state.parent, state)

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    @property
    def plan(self) -> Path:
        return self.bundle / PLAN_FILE

    @property
    def supervisor_config(self) -> Path:
        return self.bundle / SUPERVISOR_CONFIG

    @property
    def state(self) -> Path:
        return self.state_dir or self.root / "state"

    @property
    def warned(self) -> Path:
        """The warnings the last `up` printed (preflight's advisories): said again only once they change."""
        return self.state / "preflight-warned.json"

    @property
    def up_lock(self) -> Path:
        """Held (flock) by the `umemc up` bringing this run up, from its first step: `down` finds it there."""
        return self.root / "up.lock"

    @property
    def pidfile(self) -> Path:
        return self.state / "supervisord.pid"

    @property
    def enforcer_lock(self) -> Path:
        """Held (flock) by the enforcer that runs; the standby waits on it."""
        return self.state / "enforcer.lock"

    @property
    def enforcer_ready(self) -> Path:
        """`pid starttime` of an enforcer process waiting on the lock, its imports done and the plan read (written
        as it begins to wait): a standby enforcing in the gateway's process hands the lock back to it."""
        return self.state / "enforcer.ready"

    @property
    def events(self) -> Path:
        return self.state / "events.db"

    @property
    def status(self) -> Path:
        return self.state / "enforcer.json"

    @property
    def gateway_figures(self) -> Path:
        """The traffic figures the gateway shows, kept across its restarts (gateway.page_figures)."""
        return self.state / "gateway-figures.json"

    @property
    def gateway_state(self) -> Path:
        return self.state / "gateway.json"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    def log(self, program: str, stream: str = "err") -> Path:
        """What supervisord captured of a worker's stdout ("out") or stderr ("err")."""
        return self.logs / f"{program}.{stream}.log"

    def log_files(self, name: str) -> list[Path]:
        """A program's logs: supervisord's own, one file for umemc's processes, stdout and stderr for a worker."""
        if name == "supervisord":
            return [self.supervisord_logfile]
        if name == ENFORCER:  # either of the two may be the one that enforces (after a takeover)
            return [self.logs / f"{n}.log" for n in ENFORCERS]
        if name in (*ENFORCERS, GATEWAY):
            return [self.logs / f"{name}.log"]
        worker = [self.log(name, "out"), self.log(name, "err")]
        if name == "access" and not any(p.exists() for p in worker):  # a model called access keeps its name
            return [self.access_log]
        return worker

    @property
    def access_log(self) -> Path:
        """The gateway's access log: a JSON line per request (umemc.runtime.gateway.access)."""
        return self.logs / "access.log"

    @property
    def supervisord_logfile(self) -> Path:
        """supervisord's own log (its logfile=)."""
        return self.state / "supervisord.log"

    @property
    def supervisord_log(self) -> Path:
        """What supervisord says before its own log exists (a config it cannot read, a socket it cannot bind)."""
        return self.state / "supervisord.stderr.log"

    @property
    def pids(self) -> Path:
        return self.state / PIDS_DIR

    @property
    def cgroups(self) -> Path:
        return self.state / CGROUPS_DIR

    @property
    def gates(self) -> Path:
        return self.state / GATES_DIR

    def gate(self, model: str) -> Path:
        """Where a cold start waits for the processes of the models it evicts to exit (umemc.runtime.wrap.pass_gate):
        `until <unix time>`, then `pid starttime name` a process. Written by the gateway before it starts the
        model, removed by it once they are stopped."""
        return self.gates / model

    @property
    def secrets(self) -> Path:
        return self.state / SECRETS_DIR

    @property
    def unset_file(self) -> Path:
        """The variables no program but the gateway may see (one name a line): the exec wrapper removes them."""
        return self.secrets / UNSET_FILE

    @property
    def slots(self) -> Path:
        """llama-server's --slot-save-path for each model lives under here (the wrapper fills it in)."""
        return self.state / "slots"

    def worker_report(self, model: str) -> Path:
        """What a `umemc.worker` worker reserved in-process."""
        return self.state / "workers" / f"{model}.json"

    @property
    def socket_record(self) -> Path:
        """Where a deep run dir's socket went (a short private directory), when it did."""
        return self.state / "socket"

    @property
    def token_file(self) -> Path:
        """The gateway's bearer token, written by `umemc up` (0600 in a 0700 directory); supervisord and
        the workers never see the variable it came from."""
        return self.secrets / "gateway-token"

    def token(self) -> str | None:
        """The gateway's bearer token as `umemc up` wrote it (None where it wrote none)."""
        from ..records import read_text

        path = self.token_file
        return read_text(path).strip() if path.exists() else None

    def default_socket(self) -> Path:
        return self.state / "supervisor.sock"

    def socket(self) -> Path:
        """The one derivation of the running stack's socket: the private directory recorded for a deep
        run dir (claim_socket), else RUN/state/supervisor.sock. umemc up gives it to supervisord."""
        with contextlib.suppress(OSError):
            recorded = read_text(self.socket_record).strip()
            if recorded:
                return Path(recorded)
        return self.default_socket()

    def symlinks(self) -> list[Path]:
        """The run dir and the directories umemc writes in it must be real directories: a symlink would
        make `up` write (and chmod 0700) wherever it points, even when its preflight then refuses."""
        paths = (self.root, self.bundle, self.state, self.logs, self.pids, self.cgroups, self.secrets)
        return [p for p in paths if p.is_symlink()]

    def prepare(self) -> None:
        linked = self.symlinks()
        if linked:  # callers check first; this is the last line of defence before anything is written
            raise OSError(f"{linked[0]} is a symlink: umemc does not write through it")
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # the bundle and the state hold environments and the gateway token
        os.chmod(self.state, 0o700)

    def claim_socket(self) -> Path:
        """Before supervisord starts: the default socket when its path fits a unix socket address, else a
        short private (0700) directory's, recorded so every later reader (socket()) finds the same one."""
        if len(str(self.default_socket().absolute())) <= SOCKET_MAX:
            return self.default_socket()
        record = self.socket_record
        if record.exists():
            path = Path(read_text(record).strip())
            if path.parent.is_dir() and path.parent.stat().st_uid == os.getuid():
                return path
        import tempfile  # here: the exec wrapper before every worker reads this module, and never this

        short = Path(tempfile.mkdtemp(prefix="umemc-"))  # mkdtemp makes it 0700
        sock = short / "supervisor.sock"
        self.state.mkdir(parents=True, exist_ok=True)
        record.write_text(f"{sock}\n")
        return sock

    def release_socket(self) -> None:
        """After the stack is down: a deep run dir's socket lived in a private directory (claim_socket): remove it
        and its record."""
        record = self.socket_record
        try:
            sock = Path(read_text(record).strip())
        except OSError:
            return
        with contextlib.suppress(OSError):
            if sock.exists() or sock.is_symlink():
                sock.unlink()
            sock.parent.rmdir()
        with contextlib.suppress(OSError):
            record.unlink()

    def supervisord_pid(self) -> int | None:
        """The pid file's pid when that process still runs (the file may be stale, or deleted: callers
        ask the socket first)."""
        try:
            pid = int(read_text(self.pidfile).strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def records(self) -> list[PidRecord]:
        """Every `state/pids/NAME` record that parses (a corrupt one is skipped: cgroups still find it)."""
        names: list[str] = []
        with contextlib.suppress(OSError):
            names = sorted(p.name for p in self.pids.iterdir() if not p.name.startswith("."))
        return [r for r in map(self.record, names) if r is not None]

    def record(self, name: str) -> PidRecord | None:
        """A program's `state/pids/NAME` record, None where it is missing or does not parse."""
        return read_record(self.pids / name, name)

    def recorded_at(self, name: str) -> float:
        """When a process's record was written (wall clock; 0 when there is none)."""
        try:
            return (self.pids / name).stat().st_mtime
        except OSError:
            return 0.0

    def forget(self, name: str) -> None:
        for folder in (self.pids, self.cgroups):
            with contextlib.suppress(OSError):
                (folder / name).unlink()

    def write_secret(self, path: Path, text: str) -> None:
        """A file only its owner may read, written atomically (never briefly world-readable)."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        write_atomic(path, text)


def read_record(path: Path, name: str = "") -> PidRecord | None:
    """A `pid starttime` record at `path` (a program's in state/pids, the waiting enforcer's enforcer.ready), None
    where it is missing or does not parse."""
    from ..contract import PidRecord

    try:
        return PidRecord.parse(name, read_text(path))
    except (OSError, ValueError, IndexError):
        return None
