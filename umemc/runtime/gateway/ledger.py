"""Every answered request's figures, kept as it ends (one tuple) and settled with the others of the moment: into the
requests' /metrics series, the page's history (history.Requests) and the access log line. The request path does one
append; the settling runs every SETTLE_S, and before anything reads those figures (a scrape, the page's history, the
figures kept for the next gateway), so no reader sees a request that ended before it asked go missing.

Why not at once: on a box whose cores the clients and the workers share, the same accounting done request by
request, between the network's work, cost the gateway several times what it costs done together (measured:
bench/gateway.py, the CPU a request against a bare relay)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .batch import Batch
from .history import Answered, Requests
from .usage import Usage

if TYPE_CHECKING:
    from .access import AccessLog


class Series(Protocol):
    """What the ledger hands to the requests' /metrics series (metrics.Metrics is one)."""

    def request(self, model: str, code: int, seconds: float, usage: Usage | None = None) -> None: ...
    def queue_wait(self, model: str, seconds: float) -> None: ...
    def generation_wait(self, model: str, seconds: float) -> None: ...


SETTLE_S = 0.1


class Entry(NamedTuple):
    """What one request went through, as the relay ends it."""

    t: float  # wall clock at its end
    model: str
    method: str
    path: str
    status: int
    latency_s: float
    queue_wait_s: float
    generation_wait_s: float
    usage: Usage
    speed: float | None  # tokens out per second of a 2xx answer that said its tokens
    stream: bool
    refusal: str | None
    granted: bool = True  # it held a slot: its waits for one and for the generation budget are figures

    def line(self) -> dict[str, Any]:
        """Its access log line (the log adds the time): never a body, a header or a query string."""
        usage = self.usage
        doc: dict[str, Any] = {
            "model": self.model,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "queue_wait_s": round(self.queue_wait_s, 4),
            "latency_s": round(self.latency_s, 4),
            "tokens_in": usage.tokens_in,
            "tokens_out": usage.tokens_out,
            "tokens_per_s": None if self.speed is None else round(self.speed, 2),
            "tokens_from": usage.source,
            "stream": self.stream,
        }
        if self.generation_wait_s:
            doc["generation_wait_s"] = round(self.generation_wait_s, 4)
        if self.refusal is not None:
            doc["error"] = self.refusal
        return doc


class Ledger:
    """The answered requests not yet settled, and where they settle: the history always, the metrics and the access
    log once the HTTP side has made them (attach)."""

    def __init__(self, answered: Requests):
        self.answered = answered
        self.metrics: Series | None = None
        self.access: AccessLog | None = None
        self.pending: Batch[Entry] = Batch(SETTLE_S, self._settle)

    def attach(self, metrics: Series, access: AccessLog) -> None:
        self.metrics, self.access = metrics, access

    def add(self, entry: Entry) -> None:
        self.pending.add(entry)

    def settle(self) -> None:
        """Every request kept so far into its figures, in order."""
        self.pending.run()

    def _settle(self, pending: list[Entry]) -> None:
        if not pending:
            return
        metrics, access = self.metrics, self.access
        for e in pending:
            usage = e.usage
            if metrics is not None:
                metrics.request(e.model, e.status, e.latency_s, usage)
                if e.granted:
                    metrics.queue_wait(e.model, e.queue_wait_s)
                    metrics.generation_wait(e.model, e.generation_wait_s)
            self.answered.add(Answered(e.t, e.model, e.status, e.latency_s, e.queue_wait_s, usage.tokens_in,
                                       usage.tokens_out, e.speed, usage.prompt_speed))  # fmt: skip
            if access is not None:
                access.write(e.line(), at=e.t)
        if access is not None:
            access.flush()
