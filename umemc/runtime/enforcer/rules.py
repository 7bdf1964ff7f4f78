"""The quota rules as pure functions of what was measured: no process, file or clock is touched here,
so each rule is tested with plain numbers."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..supervisor import ENDED, ProcState

SOFT_REARM = 0.95  # a soft-quota crossing is reported again once usage fell below 95% of it
LEAK_MIN_R2 = 0.8
DRIFT = 0.05  # more than 5% over the estimate once settled: estimate_drift


def soft_crossing(usage: int, soft: int, *, raised: bool) -> bool | None:
    """True when usage has just crossed the soft quota (report it), False when it fell back far enough
    to re-arm, None when nothing changes."""
    if not raised and usage > soft:
        return True
    if raised and usage < SOFT_REARM * soft:
        return False
    return None


SWAP_WORKER = 64 << 20  # a worker with this much in swap answers from disk: `swapping`
SWAP_BOX_MIN = 256 << 20  # the machine's swap grown this much (or 1% of usable) since the enforcer started


def swap_crossing(swapped: int | None, threshold: int, *, raised: bool) -> bool | None:
    """True when swapped bytes have just reached the threshold (report it), False once they are back under a
    quarter of it (re-armed), None when nothing changes or the figure is unknown."""
    if swapped is None:
        return None
    if not raised and swapped >= threshold:
        return True
    if raised and swapped < threshold / 4:
        return False
    return None


def box_swap_threshold(usable: int) -> int:
    return max(SWAP_BOX_MIN, usable // 100)


def over_hard(usage: int, hard: int) -> bool:
    return usage > hard


def recent_kills(kills: Iterable[float], now: float, window_s: float) -> int:
    return sum(1 for t in kills if now - t <= window_s)


def give_up_due(kills: Iterable[float], now: float, window_s: float, max_kills: int) -> int | None:
    """The number of kills within the window once it reaches max_kills (then the worker is left stopped)."""
    n = recent_kills(kills, now, window_s)
    return n if n >= max_kills else None


def trend(samples: Sequence[tuple[float, int]]) -> tuple[float, float]:
    """Least-squares slope (bytes/s) and R² of usage over time."""
    n = len(samples)
    t0 = samples[0][0]
    xs = [t - t0 for t, _ in samples]
    ys = [float(u) for _, u in samples]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    if sxx == 0 or syy == 0:
        return 0.0, 0.0
    return sxy / sxx, (sxy * sxy) / (sxx * syy)


def leak(
    samples: Sequence[tuple[float, int]], window_s: float, threshold_per_min: int, usage: int, hard: int
) -> dict[str, Any] | None:
    """The leak_suspected detail when usage climbed faster than the threshold over a full window, steadily
    (R² >= LEAK_MIN_R2); samples must span the window and no more."""
    slope, r2 = trend(samples)
    per_min = slope * 60
    if per_min <= threshold_per_min or r2 < LEAK_MIN_R2:
        return None
    left = (hard - usage) / slope if slope > 0 else None
    return {
        "bytes_per_min": int(per_min),
        "window_s": window_s,
        "usage_bytes": usage,
        "hard_bytes": hard,
        "seconds_to_hard": None if left is None else round(left, 1),
    }


def leak_rate(samples: Sequence[tuple[float, int]]) -> float | None:
    """The usage trend (bytes/s) over the last minute of 1 Hz samples, once there are 10 s of them."""
    if len(samples) < 3:
        return None
    recent = [s for s in samples if s[0] >= samples[-1][0] - 60]
    if len(recent) < 3 or recent[-1][0] - recent[0][0] < 10:
        return None
    return round(trend(recent)[0], 1)


def buffers_drift(reported: dict[str, int], planned: int) -> dict[str, Any]:
    """llama.cpp's own buffer totals against the plan's weights + KV + compute: the estimate_drift detail
    when they are more than DRIFT over, else nothing."""
    total = reported["model"] + reported["kv"] + reported["compute"] + reported["output"]
    if not total or not planned or total <= (1 + DRIFT) * planned:
        return {}
    return {
        "buffers_bytes": total,
        "buffers_planned_bytes": planned,
        "buffers_over": round(total / planned - 1, 4),
        "buffers": reported,
    }


def exit_cause(info: dict[str, Any] | None, new_pid: int | None) -> dict[str, Any]:
    """What supervisord can tell of a worker's end. Its `exitstatus` is `process.exitstatus or 0`: 0
    also when unknown, -1 for a signal, and stale once the worker was restarted; only an EXITED or
    STOPPED worker's own status is reported (null otherwise, never a made-up 0). STOPPING is a stop someone
    asked for (the gateway's eviction, `umemc down`) that the sample caught under way."""
    if info is not None and new_pid is None and ProcState.of(info) is ProcState.STOPPING:
        return {"exitstatus": None, "cause": "stopped"}
    if info is None or new_pid is not None or ProcState.of(info) not in ENDED:
        return {"exitstatus": None, "cause": "restarted before it was sampled" if new_pid else "unknown"}
    status = int(info.get("exitstatus") or 0)
    if ProcState.of(info) is ProcState.STOPPED:  # a stop someone asked for, whatever signal ended it (a worker that
        # dies of SIGTERM's default action reads -1): never a restart
        return {"exitstatus": None if status == -1 else status, "cause": "stopped"}
    if status == -1:
        return {"exitstatus": None, "cause": "killed by a signal"}
    return {"exitstatus": status, "cause": "exited"}


def logged_exit(log: str, name: str, pid: int) -> dict[str, Any] | None:
    """How supervisord's own log says process `pid` of program `name` ended ("spawned: 'NAME' with pid PID", then
    "exited: NAME (terminated by SIGKILL; not expected)" or "(exit status 1; …)", supervisor/process.py), for an
    end the samples missed (restarted in between); None where the log does not say."""
    import re

    spawned = f"spawned: '{name}' with pid {pid}"
    at = log.rfind(spawned)
    if at < 0:
        return None
    m = re.search(rf"exited: {re.escape(name)} \((?:terminated by (SIG[A-Z0-9]+)|exit status (\d+))", log[at:])
    if m is None:
        return None
    if m.group(1):
        return {"exitstatus": None, "signal": m.group(1), "cause": f"killed by {m.group(1)}, not by umemc"}
    return {"exitstatus": int(m.group(2)), "cause": "exited"}


KERNEL_KILL = {"exitstatus": None, "signal": "SIGKILL", "cause": "hard quota (kernel, cgroup OOM)"}
ENFORCER_KILL = {"exitstatus": None, "signal": "SIGKILL", "cause": "hard quota (enforcer)"}


TREND_MIN_SPAN_S = 60.0  # a box or own-process trend needs a minute of samples before it says anything


def box_trends(box: Any, own: Any, available: int | None) -> dict[str, Any]:
    """The machine's and umemc's own memory trends over the leak window (bytes/s, least squares), umemc's own
    resident total, and the seconds until MemAvailable is gone at the machine's trend (None while it does not
    grow). `box` and `own` are enforcer.series.Series."""
    out: dict[str, Any] = {"own_bytes": own.items[-1][1] if len(own) else None}
    for name, series in (("box", box), ("own", own)):
        points = series.points()
        spans = len(points) >= 3 and points[-1][0] - points[0][0] >= TREND_MIN_SPAN_S
        out[f"{name}_trend_bytes_per_s"] = round(trend(points)[0], 1) if spans else None
    slope = out["box_trend_bytes_per_s"]
    out["exhaustion_s"] = round(available / slope, 1) if slope and slope > 0 and available is not None else None
    return out
