"""The gateway: one OpenAI-compatible endpoint for the whole stack (a program in the same
supervisord as the workers). See app.py (HTTP), scheduler.py (admission: cold starts, leases, pressure),
slots.py (requests), sync.py (the stack's view, gateway.json), metrics.py (/metrics).

    python -m umemc.runtime.gateway --bundle BUNDLE_DIR
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .scheduler import Scheduler

SHUTDOWN_S = 25.0  # in-flight requests get this long on SIGTERM (supervisord waits stopwaitsecs=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="umemc-gateway")
    p.add_argument("--bundle", required=True)
    args = p.parse_args(argv)
    bundle = Path(args.bundle).resolve()
    from .scheduler import Scheduler

    sched = Scheduler.of_bundle(bundle)
    gw = sched.gw
    token = None
    if gw.token_env:
        token = read_token(bundle, gw.token_env)
        if not token:
            print(
                f"umemc-gateway: gateway.token_env names {gw.token_env}, which is not set (or empty) in "
                "the environment `umemc up` ran in: set it, then `umemc up` again",
                file=sys.stderr,
            )
            return 2
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds (not Windows)
        asyncio.run(serve(sched, token))
    else:
        uvloop.run(serve(sched, token))
    return 0


def read_token(bundle: Path, name: str) -> str:
    """The token `umemc up` wrote to RUN/state/secrets (0600); the variable itself only when supervisord
    was started by hand with it in its environment."""
    from ...records import read_text
    from ..rundir import RunDir

    try:
        return read_text(RunDir.of_bundle(bundle).token_file)
    except OSError:
        return os.environ.get(name, "")


async def serve(sched: Scheduler, token: str | None) -> None:
    from aiohttp import web

    from .app import make_app

    app = make_app(sched, token)
    if sys.platform.startswith("linux"):  # supervisord's table asked where its children changed (sync.table)
        from ..probes.proc import LinuxProcesses

        sched.sync.children = LinuxProcesses().children  # its own: the standby thread reads /proc beside it
    # keepalive_timeout also bounds how long a connection may take to send a request's headers
    # (aiohttp closes a connection whose next request is incomplete then): no slow-header hold-outs
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=SHUTDOWN_S,
        keepalive_timeout=sched.gw.header_timeout_s,
    )
    await runner.setup()
    site = web.TCPSite(runner, sched.gw.host, sched.gw.port, reuse_address=True, backlog=1024)
    await site.start()
    print(
        f"umemc-gateway: serving {len(sched.models)} model(s) on http://{sched.gw.host}:{sched.gw.port}",
        flush=True,
    )
    from ..enforcer import Standby

    # the stack's standby enforcer, once this gateway serves (its imports are most of the enforcer's)
    standby = Standby(sched.run.bundle).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def new_plan() -> None:
        standby.on_hup()
        take_new_plan(sched, stop)

    loop.add_signal_handler(signal.SIGHUP, new_plan)
    await stop.wait()
    sched.refuse_queued()  # queued requests get 503 + Retry-After now, not a reset later
    await runner.cleanup()  # stops accepting, lets requests in flight finish (up to SHUTDOWN_S)


def take_new_plan(sched: Scheduler, stop: asyncio.Event) -> None:
    """SIGHUP (`umemc up` on a running stack whose plan changed): the bundle's plan taken on in place where only its
    models changed; otherwise this gateway stops, and supervisord starts it again on the new plan."""
    from ...contract import ContractError, read_plan
    from ...names import PLAN_FILE

    try:
        plan, digest = read_plan(sched.run.bundle / PLAN_FILE)
    except ContractError as exc:
        print(f"umemc-gateway: the new plan cannot be read, serving the one it has: {exc}", file=sys.stderr, flush=True)
        return
    if digest == sched.sync.plan_digest:
        return
    if not sched.adopt(plan, digest):
        print("umemc-gateway: the new plan changes more than its models: restarting on it", file=sys.stderr, flush=True)
        stop.set()
