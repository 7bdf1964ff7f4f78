"""What a model's answers said of their tokens (umemc.runtime.gateway.usage reads them from the relayed bytes):
written by the HTTP side when an answer is through, read by the status, the metrics and gateway.json."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .usage import Usage

SPEED_WINDOW = 20  # answers a model's tokens/s is taken over


@dataclass
class Traffic:
    tokens_in: int = 0  # this gateway's life
    tokens_out: int = 0
    prompt_speed: float | None = None  # prompt tokens/s of its last answer that said it (a KV restore's saving)
    speed: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=SPEED_WINDOW))

    def answered(self, usage: Usage, status: int, seconds: float) -> float | None:
        """An answer is through: its tokens counted; returns its generation speed (tokens out per second, where
        a 2xx answer said its tokens)."""
        self.tokens_in += usage.tokens_in or 0
        self.tokens_out += usage.tokens_out or 0
        self.prompt_speed = usage.prompt_speed or self.prompt_speed
        speed = usage.per_second(seconds) if 200 <= status < 300 else None
        if speed is not None and usage.tokens_out:
            self.speed.append((usage.tokens_out, usage.tokens_out / speed))
        return speed

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens out per second over its last SPEED_WINDOW answers that said their tokens (None before one)."""
        tokens, seconds = sum(t for t, _ in self.speed), sum(s for _, s in self.speed)
        return round(tokens / seconds, 1) if tokens and seconds > 0 else None
