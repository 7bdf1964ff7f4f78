"""The hook into ComfyUI: before a prompt is queued, take a umemc lease sized from its models; release it once
the prompt has run. When the gateway refuses, the prompt is not run and the user sees why (umemc's can-load
reason) as a validation error of the prompt.

ComfyUI's own extension points used (comfy `server.py` and `execution.py`):
- `PromptServer.instance.add_on_prompt_handler(fn)`: every POST /prompt passes through `fn(json_data)` before
  it is validated and queued (a handler returns the JSON; ComfyUI logs and ignores a handler that raises);
- `execution.PromptExecutor.execute(self, prompt, prompt_id, extra_data, execute_outputs)`: runs one queued
  prompt; wrapped so the lease is released when it returns or raises.
A refused prompt is replaced by one `UmemcRefused` node whose validation fails with the reason, so ComfyUI's
front end shows it like any other prompt error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .client import LeaseClient, Refused
from .sizing import lease_bytes

log = logging.getLogger("umemc")
EXTRA = "umemc_lease"  # where the lease id rides along in extra_data


class LeaseHook:
    def __init__(self, client: LeaseClient, resolve: Callable[[str, str], str | None], ttl_s: float = 3600.0):
        self.client, self.resolve, self.ttl_s = client, resolve, ttl_s
        self.held: dict[str, str] = {}  # prompt id or client id -> lease id
        self.lock = threading.Lock()

    def on_prompt(self, json_data: dict[str, Any]) -> dict[str, Any]:
        """ComfyUI's on_prompt handler: lease before queueing, or turn the prompt into its refusal."""
        prompt = json_data.get("prompt")
        if not isinstance(prompt, dict):
            return json_data
        nbytes, files = lease_bytes(prompt, self.resolve)
        if not nbytes:
            return json_data  # nothing umemc can size (no model files): run as before
        try:
            lease = self.client.acquire(nbytes, holder="comfyui", ttl_s=self.ttl_s)
        except Refused as exc:
            log.warning("umemc refused %d bytes for %s: %s", nbytes, ", ".join(files), exc.reason)
            return refusal(json_data, exc.reason, nbytes)
        except OSError as exc:  # the gateway is down: ComfyUI runs as it would without umemc, and says so
            log.warning("umemc gateway unreachable (%s): running without a lease", exc)
            return json_data
        extra = json_data.setdefault("extra_data", {})
        extra[EXTRA] = lease
        log.info("umemc lease %s: %d bytes for %s", lease, nbytes, ", ".join(files))
        return json_data

    def release(self, extra_data: dict[str, Any] | None) -> None:
        lease = (extra_data or {}).get(EXTRA)
        if lease:
            try:
                self.client.release(lease)
            except OSError as exc:
                log.warning("umemc: could not release lease %s (%s); it expires by itself", lease, exc)

    def wrap_executor(self, executor_class: Any) -> None:
        """Release the lease after every prompt, however it ends."""
        run = executor_class.execute
        hook = self

        def execute(self: Any, prompt: Any, prompt_id: Any, extra_data: dict[str, Any] | None = None, *a: Any,
                    **kw: Any) -> Any:  # fmt: skip
            try:
                return run(self, prompt, prompt_id, extra_data or {}, *a, **kw)
            finally:
                hook.release(extra_data)

        executor_class.execute = execute


def refusal(json_data: dict[str, Any], reason: str, nbytes: int) -> dict[str, Any]:
    """The prompt replaced by one node whose validation says why umemc cannot give it memory now."""
    message = f"umemc cannot give this workflow {nbytes / 2**30:.1f} GiB now: {reason}"
    json_data = dict(json_data)
    json_data["prompt"] = {"umemc": {"class_type": "UmemcRefused", "inputs": {"reason": message}}}
    return json_data


class UmemcRefused:
    """The node a refused prompt becomes: its validation fails with umemc's reason (the user sees it)."""

    CATEGORY = "umemc"
    RETURN_TYPES: tuple[str, ...] = ()
    FUNCTION = "refuse"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 - ComfyUI's name
        return {"required": {"reason": ("STRING", {"default": ""})}}

    @classmethod
    def VALIDATE_INPUTS(cls, reason: str) -> str:  # noqa: N802 - ComfyUI's name
        return reason or "refused by umemc"

    def refuse(self, reason: str) -> tuple[()]:
        raise RuntimeError(reason)
