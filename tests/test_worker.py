"""umemc.worker, the in-process quota hook: reservations against the hard quota, returned with the
owner object, reported to the run's state; device initialisation serialised."""

from __future__ import annotations

import gc
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import pytest

from umemc import worker

MiB = 2**20
has_torch = importlib.util.find_spec("torch") is not None


def ledger(tmp_path: Path, hard: int = 100 * MiB) -> worker.Ledger:
    return worker.Ledger(
        worker.Quota.from_env(
            {
                "UMEMC_MODEL": "emb",
                "UMEMC_QUOTA_SOFT_BYTES": str(hard // 2),
                "UMEMC_QUOTA_HARD_BYTES": str(hard),
                "UMEMC_PORT": "9000",
                "UMEMC_STATE": str(tmp_path),
            }
        )
    )


class Model:
    pass


def test_quota_exceeded_before_the_allocation(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    first = led.reserve(60 * MiB, what="weights")
    with pytest.raises(worker.QuotaExceeded) as exc:
        led.reserve(50 * MiB, what="adapter")
    assert str(exc.value) == (
        "reserving 0.05 GiB for adapter would take worker 'emb' past its hard quota of "
        "0.10 GiB (0.06 GiB already reserved)"
    )
    assert led.reserved == 60 * MiB
    first.release()
    first.release()  # idempotent
    assert led.reserved == 0


def test_reservation_returns_with_its_owner(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    model = Model()
    led.reserve(70 * MiB, owner=model)
    report = json.loads((tmp_path / "workers" / "emb.json").read_text())
    assert report["reserved_bytes"] == 70 * MiB and report["reservations"] == [{"what": "Model", "bytes": 70 * MiB}]
    with pytest.raises(worker.QuotaExceeded):
        led.reserve(40 * MiB)
    del model
    gc.collect()
    assert led.reserved == 0
    assert json.loads((tmp_path / "workers" / "emb.json").read_text())["reserved_bytes"] == 0
    with led.reserve(40 * MiB):  # context manager form
        assert led.reserved == 40 * MiB
    assert led.reserved == 0


def test_not_started_by_umemc() -> None:
    with pytest.raises(RuntimeError, match="^not started by umemc: UMEMC_QUOTA_SOFT_BYTES is not set$"):
        worker.Quota.from_env({})


def test_device_initialisation_is_serialised() -> None:
    inside, overlaps = [], []

    def init() -> None:
        with worker.device_init():
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(1)
            time.sleep(0.02)
            inside.pop()

    threads = [threading.Thread(target=init) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []


@pytest.mark.torch
@pytest.mark.skipif(not has_torch, reason="torch not installed: python3 dev.py setup-torch")
def test_with_real_torch_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("UMEMC_MODEL", "emb")
    monkeypatch.setenv("UMEMC_QUOTA_SOFT_BYTES", str(8 * MiB))
    monkeypatch.setenv("UMEMC_QUOTA_HARD_BYTES", str(10 * MiB))
    monkeypatch.setenv("UMEMC_STATE", str(tmp_path))
    monkeypatch.setattr(worker, "_ledger", None)
    assert worker.configure() == {"device": "cpu", "fraction": None, "total_bytes": None}
    small = torch.nn.Linear(1024, 1024)  # 4 MiB of fp32 weights + bias
    assert worker.nbytes_of(small) == (1024 * 1024 + 1024) * 4
    worker.reserve(worker.nbytes_of(small), owner=small)
    big_state = torch.nn.Linear(2048, 1024).state_dict()  # 8 MiB: would pass the 10 MiB quota
    with pytest.raises(worker.QuotaExceeded):
        worker.reserve(worker.nbytes_of(big_state), what="load_state_dict")
    del small
    gc.collect()
    assert worker.ledger().reserved == 0
    worker.reserve(worker.nbytes_of(big_state), what="load_state_dict").release()


def test_the_address_to_bind_is_umemcs_loopback_or_a_pods_every_address(tmp_path: Path) -> None:
    env = {"UMEMC_QUOTA_SOFT_BYTES": "1", "UMEMC_QUOTA_HARD_BYTES": "2", "UMEMC_PORT": "9000"}
    assert worker.Quota.from_env(env).host == "127.0.0.1"  # started by an older umemc, or by hand
    assert worker.Quota.from_env(env | {"UMEMC_HOST": "0.0.0.0"}).host == "0.0.0.0"  # a pod (build --target kubernetes)


class FakeCuda:
    """torch.cuda as a CUDA (or ROCm) build on a GPU answers, its memory_stats in the format of torch.cuda.
    memory_stats() (flat keys `<stat>.<pool>.<current|peak|allocated|freed>`, bytes): 3 GiB reserved from the device,
    2 GiB in tensors, 256 MiB in free pieces of split blocks. empty_cache gives the unused blocks back, leaving the
    ones split blocks pin (PyTorch cannot release a block any part of which is in use)."""

    def __init__(self) -> None:
        self.stats = {
            "reserved_bytes.all.current": 3 << 30,
            "reserved_bytes.all.peak": 4 << 30,
            "allocated_bytes.all.current": 2 << 30,
            "allocated_bytes.all.peak": 3 << 30,
            "inactive_split_bytes.all.current": 256 * MiB,
            "num_alloc_retries": 0,
        }
        self.emptied = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def memory_stats(self) -> dict[str, int]:
        return dict(self.stats)

    def empty_cache(self) -> None:
        self.emptied += 1
        self.stats["reserved_bytes.all.current"] = (2 << 30) + 256 * MiB


def test_the_allocators_own_figures_are_reported_and_tidied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU worker (fake: no GPU here) reports what its caching allocator holds beyond its tensors, and gives the
    cache back at an idle moment; the enforcer reads that as the worker's unused allocator bytes."""
    import types

    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda, backends=types.SimpleNamespace()))
    for key, value in {"UMEMC_MODEL": "emb", "UMEMC_QUOTA_SOFT_BYTES": str(4 << 30),
                       "UMEMC_QUOTA_HARD_BYTES": str(5 << 30), "UMEMC_STATE": str(tmp_path)}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(worker, "_ledger", None)
    worker.reserve(2 << 30, what="weights")
    report = json.loads((tmp_path / "workers" / "emb.json").read_text())
    assert report["allocator"] == {
        "device": "cuda",
        "reserved_bytes": 3 << 30,
        "allocated_bytes": 2 << 30,
        "inactive_split_bytes": 256 * MiB,
    }
    assert worker.tidy() == (1 << 30) - 256 * MiB  # the unsplit cache went back; the split blocks stay
    assert cuda.emptied == 1
    report = json.loads((tmp_path / "workers" / "emb.json").read_text())
    assert report["allocator"]["reserved_bytes"] == (2 << 30) + 256 * MiB  # reported after the release


def test_no_allocator_figures_without_a_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is imported for them (a worker that has not imported torch reports none), and the CPU's allocator
    keeps no cache to report or release."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert worker.allocator() is None and worker.tidy() == 0
    assert "torch" not in sys.modules


@pytest.mark.torch
@pytest.mark.skipif(not has_torch, reason="torch not installed: python3 dev.py setup-torch")
def test_the_cpu_torch_has_no_allocator_cache() -> None:
    import torch

    assert not torch.cuda.is_available()
    assert worker.allocator() is None and worker.tidy() == 0
