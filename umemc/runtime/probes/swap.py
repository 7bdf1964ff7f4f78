"""The machine's swap as every Box reports it: one figure the interface (host.py) and each platform's probes share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Swap:
    total: int
    used: int
