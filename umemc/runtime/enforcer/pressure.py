"""The pressure guard: with hysteresis (above evict_above until below load_below) it relieves memory
pressure by the one eviction policy (umemc.budget.policy.pressure_victim). While a gateway runs it owns every
eviction (it alone knows who has requests in flight): the guard asks it, in a thread so that a slow
gateway never delays a hard-quota kill. Without a gateway, or one that does not answer, the guard
stops the victim itself."""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ...budget.policy import Held, pressure_victim
from ...contract import PlanDoc
from ...records import read_text
from ..rundir import RunDir
from ..supervisor import ProcState, Supervisor
from .worker_state import Worker

GATEWAY_TIMEOUT_S = 5.0
Emit = Callable[..., None]  # (worker, kind, **detail)


class PressureGuard:
    def __init__(self, plan: PlanDoc, run_dir: RunDir, supervisor: Supervisor, interval: float, emit: Emit):
        self.plan, self.run_dir, self.supervisor, self.emit = plan, run_dir, supervisor, emit
        self.settle_s = max(1.0, 5 * interval)  # after an eviction: let the memory come back first
        self.pressure = 0.0
        self.evicting = False
        self.wait_until = 0.0
        self._asker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ask-gateway")
        self._answer: Future[dict[str, Any]] | None = None
        self._gateway_error: str | None = None

    def step(self, now: float, pressure: float, workers: list[Worker], infos: dict[str, Any]) -> None:
        pol = self.plan.policy
        self.pressure = pressure
        if pressure > pol.evict_above:
            self.evicting = True
        elif pressure < pol.load_below:
            self.evicting = False
        if not self.evicting or now < self.wait_until:
            return
        if self.plan.gateway is not None and self._ask_gateway(now):
            return  # the gateway owns evictions while it answers
        # no gateway, or it does not answer: the enforcer decides alone (nothing is in flight through a
        # gateway that is down), by the same policy
        victim = self.victim(workers, infos, set())
        if victim is None:
            return
        failed = self.supervisor.try_stop(victim.name, wait=False)
        self.wait_until = now + self.settle_s
        if failed is not None and failed != "not running":
            self.emit(victim, "evict_failed", pressure=round(pressure, 4), reason=failed)
            return
        self.emit(
            victim,
            "evict",
            by="enforcer",
            reason="pressure",
            pressure=round(pressure, 4),
            usage_bytes=victim.usage,
            priority=victim.quota.priority,
            evict_above=pol.evict_above,
            load_below=pol.load_below,
        )

    def victim(self, workers: list[Worker], infos: dict[str, Any], busy: set[str]) -> Worker | None:
        """The one eviction policy's pick among the running workers (umemc.budget.policy.pressure_victim):
        lowest priority, then least recently active, then file order."""
        running = {w.name: w for w in workers if w.pid and ProcState.of(infos.get(w.name)) is ProcState.RUNNING}
        held = [
            Held(
                w.name,
                w.quota.priority,
                cold=self.plan.models[w.name].cold,
                ram=w.usage,
                gpu=0,
                busy=w.name in busy,
                drainable=True,
                last_used=w.last_active,
            )
            for w in running.values()
        ]
        chosen = pressure_victim(held)
        return None if chosen is None else running[chosen.name]

    def _ask_gateway(self, now: float) -> bool:
        """Ask the gateway to relieve the pressure (POST /umemc/pressure); its answer is read on a later
        tick. False when the gateway did not answer (the caller decides alone)."""
        asking = self._answer
        if asking is not None and not asking.done():
            return True  # still asking: wait
        if asking is None:
            self._answer = self._asker.submit(self._post, round(self.pressure, 4))
            return True
        self._answer = None
        try:
            answer = asking.result()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if str(exc) != self._gateway_error:
                print(
                    f"umemc-enforcer: the gateway did not answer ({exc}); evicting alone", file=sys.stderr, flush=True
                )
            self._gateway_error = str(exc)
            return False
        self._gateway_error = None
        if answer.get("action") in ("evicting", "failed"):
            self.wait_until = now + self.settle_s
        else:  # deferred (requests in flight) or nothing to evict: ask again shortly
            self.wait_until = now + 0.5
        return True

    def _post(self, pressure: float) -> dict[str, Any]:
        gw = self.plan.gateway
        assert gw is not None
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(gw.host, gw.host)
        headers = {"Content-Type": "application/json"}
        if gw.token_env:
            headers["Authorization"] = f"Bearer {read_text(self.run_dir.token_file)}"
        conn = http.client.HTTPConnection(host, gw.port, timeout=GATEWAY_TIMEOUT_S)
        try:
            conn.request("POST", "/umemc/pressure", body=json.dumps({"pressure": pressure}), headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {body[:200]!r}")
            answer: dict[str, Any] = json.loads(body)
            return answer
        finally:
            conn.close()
