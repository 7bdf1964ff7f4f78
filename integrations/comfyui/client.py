"""A small client of umemc's lease API (stdlib only: it runs inside ComfyUI's interpreter).

lease = LeaseClient.from_env().acquire(9 * 2**30, holder="comfyui", ttl_s=900)   # or raises Refused
...run the workflow...
LeaseClient.from_env().release(lease)
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


class Refused(Exception):
    """The gateway could not grant the memory now; `reason` is its can-load explanation, said to the user."""

    def __init__(self, reason: str, blocked_by: list[dict[str, Any]] | None = None):
        super().__init__(reason)
        self.reason = reason
        self.blocked_by = blocked_by or []


@dataclass
class LeaseClient:
    url: str  # the gateway, e.g. http://127.0.0.1:10000
    token: str | None = None
    model: str | None = None  # the stack's name of this ComfyUI worker (named in the holder)
    timeout_s: float = 30.0

    @classmethod
    def from_env(cls) -> LeaseClient:
        """umemc gives every worker UMEMC_GATEWAY_URL and UMEMC_MODEL; a stack with a gateway token needs
        UMEMC_LEASE_TOKEN set in the comfyui model's env (workers never receive the gateway's own token)."""
        return cls(
            os.environ.get("UMEMC_GATEWAY_URL", "http://127.0.0.1:10000"),
            os.environ.get("UMEMC_LEASE_TOKEN") or None,
            os.environ.get("UMEMC_MODEL") or None,
        )

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url.rstrip("/") + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw.startswith(b"{") else {"reason": raw.decode(errors="replace")}

    def acquire(self, nbytes: int, holder: str = "comfyui", ttl_s: float = 900.0, priority: int | None = None) -> str:
        """A lease of `nbytes` (evicting lower-priority idle workers if the policy allows); its id."""
        body: dict[str, Any] = {"holder": f"{holder}:{self.model}" if self.model else holder}
        body |= {"bytes": int(nbytes), "ttl": ttl_s}
        if self.model:  # the memory this ComfyUI will hold itself: it raises its own quota, not beside it
            body["worker"] = self.model
        if priority is not None:
            body["priority"] = priority
        status, doc = self._call("POST", "/umemc/leases", body)
        if status == 201:
            return str(doc["lease"]["id"])
        error = doc.get("error", {}) if isinstance(doc.get("error"), dict) else {}
        reason = doc.get("reason") or error.get("message") or f"the gateway answered {status}"
        raise Refused(str(reason), doc.get("blocked_by"))

    def release(self, lease_id: str) -> None:
        self._call("DELETE", f"/umemc/leases/{lease_id}")

    def extend(self, lease_id: str, ttl_s: float) -> None:
        self._call("POST", f"/umemc/leases/{lease_id}/extend", {"ttl": ttl_s})
