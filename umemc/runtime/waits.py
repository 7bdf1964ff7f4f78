"""What `umemc up` waits for, each wait following progress rather than a fixed budget: supervisord answering (while
its process lives), every hot worker running and healthy (failing at once for one that cannot start), the gateway
answering (while its program is starting or running)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RuntimeFailure
from .probes.host import alive
from .rundir import GATEWAY, SUPERVISORD
from .supervisor import FAILED, STARTED, ProcState

if TYPE_CHECKING:
    from .control import Stack


def gateway(stack: Stack, timeout: float = 900.0) -> str | None:
    """Block until the gateway answers /umemc/health, for as long as its program is starting or running (on a
    busy machine starting a hundred workers that can be long), up to `timeout`; returns its URL (None: the stack
    has none). A gateway that failed (FATAL, EXITED, BACKOFF) fails at once."""
    gw = stack.plan.gateway
    if gw is None:
        return None
    deadline = time.monotonic() + timeout
    while not healthy(gw.port, "/umemc/health"):
        info = stack.supervisor.processes().get(GATEWAY, {})
        state = ProcState.of(info)
        if state in FAILED or time.monotonic() > deadline:
            why = f"is {state}" if state in FAILED else f"did not answer within {timeout:g} s"
            log = stack.run.logs / f"{GATEWAY}.log"
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            raise RuntimeFailure(
                "\n".join(
                    [
                        f"the gateway {why}",
                        *(f"  {t}" for t in tail),
                        "the workers keep running: `umemc status`, `umemc down`",
                    ]
                )
            )
        time.sleep(0.1)
    host = gw.host if ":" not in gw.host else f"[{gw.host}]"
    return f"http://{host}:{gw.port}/v1"


def started(stack: Stack, timeout: float = 30.0, since: float | None = None, unrecorded: float = 30.0) -> None:
    """Until supervisord answers on its socket, for as long as its process lives (it may spawn a hundred
    programs first), up to `timeout`; fails at once when the process recorded for it since `since` (the
    wall-clock time it was started: an older record is a crashed run's) ended, and when no record appears
    within `unrecorded` seconds (the exec wrapper writes it before supervisord runs)."""
    start = time.monotonic()
    deadline = start + timeout
    while not stack.supervisor.alive():
        record = next((r for r in stack.run.records() if r.name == SUPERVISORD), None)
        if record is not None and since is not None and stack.run.recorded_at(SUPERVISORD) < since:
            record = None  # not this start's
        if record is None and time.monotonic() - start > unrecorded:
            raise RuntimeFailure(f"supervisord did not start: no record of it in {stack.run.pids}")
        if record is not None and not alive(record.pid):
            log = stack.run.supervisord_log
            tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
            raise RuntimeFailure("\n".join(["supervisord did not start", *(f"  {t}" for t in tail)]))
        if time.monotonic() > deadline:
            raise RuntimeFailure(
                f"supervisord did not answer on {stack.run.socket()} within {timeout:g} s; "
                f"see {stack.run.supervisord_logfile}"
            )
        time.sleep(0.05)


def healthy_workers(
    stack: Stack, names: list[str], timeout: float, progress: Callable[[str, ProcState, bool], None] | None = None
) -> dict[str, float]:
    """Block until every named worker answers its health (or, without a health URL, accepts connections on its
    port) while its process runs; returns seconds each took. A worker that answers is done whether supervisord calls
    it RUNNING yet or is still STARTING (its startsecs, 5 s for a model server: a crash loop is still supervisord's
    to stop, and a worker that dies afterwards is said by `umemc status` and the events); one with no port to ask
    waits for RUNNING, the only sign it lives. `progress(name, state, healthy)` after each look at a worker."""
    start = time.monotonic()
    done: dict[str, float] = {}
    seen: set[str] = set()
    models = stack.plan.models
    while len(done) < len(names):
        infos = stack.supervisor.processes()
        for name in names:
            if name in done:
                continue
            state = ProcState.of(infos.get(name))
            if state in STARTED:
                seen.add(name)
            stopped = state is ProcState.STOPPED and name in seen  # the enforcer stopped it (`umemc events`)
            failed = state in (ProcState.FATAL, ProcState.EXITED)
            if stopped or failed or (state is ProcState.BACKOFF and infos[name].get("spawnerr")):
                raise RuntimeFailure(_failure(stack, name, state, infos[name]))
            answering = state is ProcState.RUNNING or (state is ProcState.STARTING and models[name].port is not None)
            if answering and healthy(models[name].port, models[name].health):
                done[name] = time.monotonic() - start
            if progress is not None:
                progress(name, state, name in done)
        if time.monotonic() - start > timeout:
            late = [n for n in names if n not in done]
            raise RuntimeFailure(
                "\n".join(_failure(stack, n, ProcState.of(infos.get(n)), infos.get(n, {}), timeout) for n in late)
            )
        if len(done) < len(names):
            time.sleep(0.2)
    return done


def _failure(stack: Stack, name: str, state: str, info: dict[str, Any], timeout: float | None = None) -> str:
    why = f"did not become healthy within {timeout:g} s" if timeout else f"is {state}"
    lines = [f"worker {name} {why}" + (f" ({info['spawnerr']})" if info.get("spawnerr") else "")]
    for suffix in ("err", "out"):
        log = stack.run.logs / f"{name}.{suffix}.log"
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
        if tail:
            lines.append(f"--- last lines of {log}")
            lines += [f"  {t}" for t in tail]
    lines.append("the rest of the stack keeps running: `umemc status`, `umemc down`")
    return "\n".join(lines)


def healthy(port: int | None, path: str | None) -> bool:
    """The worker answers its health URL (200), or accepts connections when it has none."""
    if port is None:
        return True
    if path is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
