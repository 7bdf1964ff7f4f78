"""The in-process quota hook for Python (torch) workers: a quota is bound to the model object's
lifetime ("when the object is gone, the quota returns").

    from umemc import worker

    worker.configure()                         # allocator limits from the quota umemc set (torch lazily)
    with worker.device_init():                 # one thread initialises the device at a time
        device = torch.device("cuda")
    model = build_model()
    worker.reserve(worker.nbytes_of(model), owner=model)   # QuotaExceeded instead of an OOM
    del model; gc.collect()                    # ... and the reservation is returned

Reservations are reported to the enforcer in RUN/state/workers/<model>.json so `umemc status`
shows them, with the caching allocator's own figures where torch keeps them (reserved, allocated, inactive split
blocks: what it holds beyond what tensors use is fragmentation). At an idle moment (no request in flight)

    worker.tidy()                              # the allocator's cached blocks back to the device, reported

Nothing here imports torch unless configure() or nbytes_of() needs it; the allocator is read only where the
worker imported torch itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import contract


class QuotaExceeded(MemoryError):
    """A reservation would take the worker past its hard quota."""


@dataclass(frozen=True)
class Quota:
    model: str
    soft_bytes: int
    hard_bytes: int
    port: int | None
    state_dir: Path | None
    host: str = "127.0.0.1"  # the address to bind: loopback under supervisord, every address in a pod

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> Quota:
        env = dict(os.environ if env is None else env)
        try:
            return Quota(
                env.get("UMEMC_MODEL", "worker"),
                int(env["UMEMC_QUOTA_SOFT_BYTES"]),
                int(env["UMEMC_QUOTA_HARD_BYTES"]),
                int(env["UMEMC_PORT"]) if env.get("UMEMC_PORT") else None,
                Path(env["UMEMC_STATE"]) if env.get("UMEMC_STATE") else None,
                env.get("UMEMC_HOST") or "127.0.0.1",
            )
        except KeyError as exc:
            raise RuntimeError(f"not started by umemc: {exc.args[0]} is not set") from None


class Reservation:
    def __init__(self, ledger: Ledger, nbytes: int, what: str):
        self.ledger, self.nbytes, self.what = ledger, nbytes, what
        self.released = False

    def release(self) -> None:
        self.ledger._release(self)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Ledger:
    """What this worker has reserved against its hard quota; thread-safe."""

    def __init__(self, quota: Quota):
        self.quota = quota
        self._lock = threading.Lock()
        self._live: dict[int, Reservation] = {}

    @property
    def reserved(self) -> int:
        with self._lock:
            return sum(r.nbytes for r in self._live.values())

    def reserve(self, nbytes: int, owner: object | None = None, what: str = "") -> Reservation:
        """Reserve nbytes before allocating them. With an owner, the reservation is returned when the
        owner is garbage collected (weakref.finalize); without one, release it (or use `with`)."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        with self._lock:
            used = sum(r.nbytes for r in self._live.values())
            if used + nbytes > self.quota.hard_bytes:
                raise QuotaExceeded(
                    f"reserving {_gib(nbytes)} GiB{f' for {what}' if what else ''} would take worker "
                    f"{self.quota.model!r} past its hard quota of {_gib(self.quota.hard_bytes)} GiB "
                    f"({_gib(used)} GiB already reserved)"
                )
            r = Reservation(self, nbytes, what or (type(owner).__name__ if owner is not None else "reservation"))
            self._live[id(r)] = r
        if owner is not None:
            weakref.finalize(owner, r.release)
        self._report()
        return r

    def _release(self, r: Reservation) -> None:
        with self._lock:
            if r.released:
                return
            r.released = True
            self._live.pop(id(r), None)
        self._report()

    def snapshot(self) -> contract.WorkerReport:
        with self._lock:
            items = [contract.Reservation(what=r.what, bytes=r.nbytes) for r in self._live.values()]
        held = allocator()
        return contract.WorkerReport(
            model=self.quota.model,
            pid=os.getpid(),
            reserved_bytes=sum(i.bytes for i in items),
            hard_bytes=self.quota.hard_bytes,
            reservations=items,
            allocator=held,
        )

    def _report(self) -> None:
        """A small file in the run's state, replaced atomically, for the enforcer and `umemc status`."""
        if self.quota.state_dir is None:
            return
        from .runtime.rundir import RunDir

        path = RunDir.of_state(self.quota.state_dir).worker_report(self.quota.model)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(contract.dump(self.snapshot()))
            os.replace(tmp, path)


_DEVICE_LOCK = threading.Lock()
_ledger: Ledger | None = None
_ledger_lock = threading.Lock()


def ledger() -> Ledger:
    global _ledger
    with _ledger_lock:
        if _ledger is None:
            _ledger = Ledger(Quota.from_env())
        return _ledger


def quota() -> Quota:
    return ledger().quota


def allocator() -> contract.AllocatorFigures | None:
    """The caching allocator's own figures (CUDA and ROCm: torch.cuda.memory_stats' `reserved_bytes.all.current`,
    `allocated_bytes.all.current`, `inactive_split_bytes.all.current`; MPS: the driver's allocation against the
    tensors'); None where there is none (the CPU's allocator keeps no cache) or the worker has not imported torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            stats = torch.cuda.memory_stats()
            return contract.AllocatorFigures(
                device="cuda",
                reserved_bytes=int(stats.get("reserved_bytes.all.current", 0)),
                allocated_bytes=int(stats.get("allocated_bytes.all.current", 0)),
                inactive_split_bytes=int(stats.get("inactive_split_bytes.all.current", 0)),
            )
        mps = getattr(torch, "mps", None)
        backend = getattr(torch.backends, "mps", None)
        if mps is not None and backend is not None and backend.is_available():
            return contract.AllocatorFigures(
                device="mps",
                reserved_bytes=int(mps.driver_allocated_memory()),
                allocated_bytes=int(mps.current_allocated_memory()),
                inactive_split_bytes=None,
            )
    except (RuntimeError, AttributeError):  # a device that went away, a torch without these
        return None
    return None


def tidy() -> int:
    """At an idle moment (no request in flight): give the caching allocator's unused blocks back to the device
    (torch.cuda.empty_cache / torch.mps.empty_cache), report the figures after, and return the bytes released
    (0 where there is no cache)."""
    before = allocator()
    if before is None:
        return 0
    torch = sys.modules["torch"]
    if before.device == "cuda":
        torch.cuda.empty_cache()
    else:
        torch.mps.empty_cache()
    after = allocator()
    ledger()._report()
    return max(0, before.reserved_bytes - (after.reserved_bytes if after is not None else 0))


def reserve(nbytes: int, owner: object | None = None, what: str = "") -> Reservation:
    return ledger().reserve(nbytes, owner, what)


@contextlib.contextmanager
def device_init() -> Iterator[None]:
    """Serialise device initialisation: practitioners saw races when two threads did it at once."""
    with _DEVICE_LOCK:
        yield


def nbytes_of(obj: Any) -> int:
    """Bytes of a torch module's parameters and buffers, or of a state_dict / tensor."""
    if hasattr(obj, "parameters") and hasattr(obj, "buffers"):
        return sum(t.nelement() * t.element_size() for t in [*obj.parameters(), *obj.buffers()])
    if isinstance(obj, dict):
        return sum(nbytes_of(v) for v in obj.values())
    if hasattr(obj, "nelement") and hasattr(obj, "element_size"):
        return int(obj.nelement() * obj.element_size())
    return 0


def configure(device: str | None = None) -> dict[str, Any]:
    """Set the allocator's limit from the hard quota. CUDA/ROCm: set_per_process_memory_fraction
    (hard / device total); MPS: the same against the recommended maximum; CPU: nothing to set (the
    ledger and the enforcer still account). Returns what was done."""
    import torch  # lazily: the worker decides when to pay for it

    q = quota()
    with device_init():
        if (device or "").startswith("cuda") or (device is None and torch.cuda.is_available()):
            total = torch.cuda.mem_get_info()[1]
            fraction = min(1.0, q.hard_bytes / total)
            torch.cuda.set_per_process_memory_fraction(fraction)
            return {"device": "cuda", "fraction": fraction, "total_bytes": total}
        mps = getattr(torch.backends, "mps", None)
        if (device == "mps" or device is None) and mps is not None and mps.is_available():
            total = torch.mps.recommended_max_memory()
            fraction = min(2.0, q.hard_bytes / total)
            torch.mps.set_per_process_memory_fraction(fraction)
            return {"device": "mps", "fraction": fraction, "total_bytes": total}
    return {"device": "cpu", "fraction": None, "total_bytes": None}


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"
