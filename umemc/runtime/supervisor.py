"""Talking to supervisord: XML-RPC over its unix socket (getAllProcessInfo ≈ 0.3 ms), and starting
it with the interpreter umemc runs under (never from PATH)."""

from __future__ import annotations

import http.client
import os
import resource
import socket
import subprocess
import sys
import xmlrpc.client
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..contract import PlanDoc
    from .rundir import RunDir


class ProcState(StrEnum):
    """A program's state as supervisord names it (supervisor/states.py, ProcessStates); a str, so it compares
    with what XML-RPC answers. The gateway's own phases are gateway.lifecycle.Phase."""

    STOPPED = "STOPPED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    BACKOFF = "BACKOFF"  # it exited too soon; supervisord will try again (startretries)
    STOPPING = "STOPPING"
    EXITED = "EXITED"  # it exited after running (autorestart may start it again)
    FATAL = "FATAL"  # it could not be started
    UNKNOWN = "UNKNOWN"

    @classmethod
    def of(cls, info: dict[str, Any] | None) -> ProcState:
        """The state in one entry of getAllProcessInfo (UNKNOWN for none, or for a state a newer supervisord has)."""
        name = (info or {}).get("statename", "UNKNOWN")
        return cls(name) if name in cls.__members__ else cls.UNKNOWN


RPC_ERRORS = (OSError, xmlrpc.client.Error, http.client.HTTPException)  # what a call to supervisord may raise
LIVE = frozenset({ProcState.RUNNING, ProcState.STARTING, ProcState.BACKOFF, ProcState.STOPPING})  # a process exists
ANSWERING = frozenset({ProcState.RUNNING, ProcState.STARTING})  # it may answer: startsecs need not have passed
STARTED = frozenset({ProcState.STARTING, ProcState.RUNNING, ProcState.BACKOFF})  # started, or being (re)started
ENDED = frozenset({ProcState.EXITED, ProcState.STOPPED})  # its process ended (a crash, or a stop)
FAILED = frozenset({ProcState.FATAL, ProcState.EXITED, ProcState.BACKOFF})  # not running as it should
ALREADY_STARTED = 60  # supervisor.xmlrpc.Faults.ALREADY_STARTED
SPAWN_ERROR = 50  # supervisor.xmlrpc.Faults.SPAWN_ERROR
NOT_RUNNING = 70  # supervisor.xmlrpc.Faults.NOT_RUNNING
# a waited start or stop is answered once the program is up (its startsecs) or down (its stopwaitsecs, up to 30 s in
# the config umemc writes, then SIGKILL): its call waits that long, not the plain calls' timeout
WAITED_S = 60.0


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str, timeout: float):
        super().__init__()
        self.unix_path, self.timeout = path, timeout

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        return _UnixHTTPConnection(self.unix_path, self.timeout)


class Supervisor:
    """A supervisord client; each call opens a fresh connection (a failed one is never reused)."""

    def __init__(self, socket_path: Path, timeout: float = 10.0):
        self.socket_path, self.timeout = socket_path, timeout

    def _proxy(self, timeout: float) -> Any:
        transport = _UnixTransport(str(self.socket_path), timeout)
        return xmlrpc.client.ServerProxy("http://localhost/RPC2", transport=transport)

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """One XML-RPC call, answered within `timeout` seconds (default: the client's own)."""
        target = self._proxy(self.timeout if timeout is None else timeout)
        for part in method.split("."):
            target = getattr(target, part)
        return target(*args)

    def alive(self) -> bool:
        try:
            return bool(self.call("supervisor.getState")["statename"] == "RUNNING")  # its own state, not a program's
        except (OSError, xmlrpc.client.Error, http.client.HTTPException):
            return False

    def processes(self) -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in self.call("supervisor.getAllProcessInfo")}

    def start(self, name: str, *, wait: bool = False) -> None:
        self.call("supervisor.startProcess", name, wait, **self._waited(wait))

    def ensure_started(self, name: str) -> None:
        """Start a program unless supervisord is already starting it (its autorestart after a crash won the
        race with us: ALREADY_STARTED is success, not a failure to report). SPAWN_ERROR is a start too:
        supervisord reaps the child within the call, and one that already exited ("Exited too quickly", a
        race a loaded machine wins) is in BACKOFF, retried as any other; the caller watches its state to FATAL
        and says why then, as for a child that exits a moment later."""
        try:
            self.start(name, wait=False)
        except xmlrpc.client.Fault as exc:
            if exc.faultCode not in (ALREADY_STARTED, SPAWN_ERROR):
                raise

    def stop(self, name: str, *, wait: bool = True) -> None:
        self.call("supervisor.stopProcess", name, wait, **self._waited(wait))

    def _waited(self, wait: bool) -> dict[str, float]:
        """A waited call's own timeout (WAITED_S); a call that does not wait keeps the client's."""
        return {"timeout": max(self.timeout, WAITED_S)} if wait else {}

    def try_stop(self, name: str, *, wait: bool = True) -> str | None:
        """Stop a program and say what happened: None when it stopped, else why not ("not running",
        or supervisord's refusal or silence). Never hides a fault behind a claimed success."""
        try:
            self.stop(name, wait=wait)
        except xmlrpc.client.Fault as exc:
            return "not running" if exc.faultCode == NOT_RUNNING else f"supervisord refused: {exc.faultString}"
        except (OSError, http.client.HTTPException, xmlrpc.client.ProtocolError) as exc:
            return f"supervisord did not answer: {exc}"
        return None


def start_supervisord(run: RunDir, plan: PlanDoc, *, foreground: bool) -> None:
    """Start the real supervisord in the foreground mode (-n) through the exec wrapper, so it sits in
    the run's own cgroup (everything it starts is found there even if it is killed) and its pid is
    the one recorded (state/pids/umemc-supervisord). `up` leaves it running as a daemon in a session
    of its own, never its own child (its exit would leave a zombie in the cgroup); --foreground execs it instead
    (for a systemd unit). Children inherit RLIMIT_MEMLOCK from supervisord, so it is raised here when
    a model locks memory. The gateway token's variable is not passed on: the gateway reads the
    token from RUN/state/secrets, and no worker ever sees it. The config's socket is expanded from
    UMEMC_SUPERVISOR_SOCKET, set here to the run dir's (claimed before anything binds it)."""
    from ..names import SOCKET_ENV, SUPERVISORD, WRAP_ENTRY
    from .kernel import parent_death_signal
    from .supervisord import ROTATE_BYTES, rotate

    state, config = run.state, run.supervisor_config

    wrap = [
        sys.executable,
        "-I",  # isolated and without the site step, like every wrapper (umemc.compile.bundle.wrap_argv)
        "-S",
        WRAP_ENTRY,
        "--stack",
        plan.stack,
        "--model",
        SUPERVISORD,
        "--hard",
        "0",
        "--soft",
        "0",
        "--cgroup",
        plan.policy.kernel_enforcement,
        "--state",
        str(state),
        "--outlive-parent",
    ]
    if not parent_death_signal():
        wrap.append("--reaper")  # no parent-death signal here (macOS): a reaper stops the run if supervisord dies
    # umemc.runtime.supervisord: the real supervisord, which a full state directory no longer kills
    argv = [*wrap, "--", sys.executable, "-m", "umemc.runtime.supervisord", "-n", "-c", str(config)]
    if plan.memlock:
        _raise_memlock()
    env = dict(os.environ)
    env[SOCKET_ENV] = str(run.claim_socket())
    token = None if plan.gateway is None else plan.gateway.token_env
    if token:
        env.pop(token, None)
    if foreground:
        os.execve(sys.executable, argv, env)
    argv.insert(argv.index("--outlive-parent"), "--daemon")
    with open(run.supervisord_log, "ab") as log:  # what it says before its own log exists
        rotate(log, ROTATE_BYTES)  # an earlier run's: kept as .1 once it is large
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env, check=True)


def _raise_memlock() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))  # as far as an unprivileged user may
