"""The gateway application's keys: what every handler reaches through its request's app (the scheduler, the metrics,
the pool of worker connections, the access log, the captures, the gateway's own token)."""

from __future__ import annotations

from aiohttp import web

from .access import AccessLog
from .metrics import Metrics
from .request_capture import Captures
from .scheduler import Scheduler
from .upstream import Pool

SCHED: web.AppKey[Scheduler] = web.AppKey("sched", Scheduler)
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
POOL: web.AppKey[Pool] = web.AppKey("pool", Pool)
ACCESS: web.AppKey[AccessLog] = web.AppKey("access", AccessLog)
CAPTURES: web.AppKey[Captures] = web.AppKey("captures", Captures)
TOKEN: web.AppKey[str] = web.AppKey("token", str)  # the gateway's own token (a client's is never passed on)
