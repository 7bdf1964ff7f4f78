"""The machine's swap as every Box reports it: one figure the interface (host.py) and each platform's probes share."""

from __future__ import annotations

from typing import NamedTuple


class Swap(NamedTuple):
    total: int
    used: int
