"""What a worker's answer says of its tokens, read from the bytes the gateway relays (never parsed whole: an
embeddings answer is megabytes of floats, a stream arrives in pieces).

Each client API says them its own way, and one pass reads them all:
- OpenAI's chat and completions: `usage` {prompt_tokens, completion_tokens}, in the answer or a stream's last chunk;
- OpenAI's Responses API: `usage` {input_tokens (the cached ones among them), output_tokens}, in the answer or the
  stream's response.completed event;
- Anthropic's Messages API: `usage` {input_tokens (without what the prompt cache read), cache_read_input_tokens,
  cache_creation_input_tokens, output_tokens}: in a stream, the input in message_start (its first event: a stream's
  first bytes are kept for it) and the output in message_delta, its last;
- llama-server's `timings` (prompt_n + cache_n in, predicted_n out, predicted_per_second: its own generation speed,
  without the prompt or any queueing, taken as it says it) in every answer and in the last chunk of a stream;
- for a stream with none of these (llama-cpp-python without stream_options.include_usage), the chunks that carry
  text, one token each as these servers stream.
Each figure says where it came from."""

from __future__ import annotations

import re
from collections import deque
from typing import NamedTuple

# every figure an answer may say, in one pass over its bytes: the key, then its number as sign, digits and the rest
# (a count is digits alone: a count with a sign is no count; a rate takes its sign, fraction and exponent)
FIGURES = re.compile(
    rb'"(prompt_tokens|completion_tokens|prompt_n|cache_n|predicted_n|predicted_per_second|prompt_per_second'
    rb'|input_tokens|output_tokens|cache_read_input_tokens|cache_creation_input_tokens)"'
    rb"\s*:\s*(-?)(\d+)((?:\.\d+)?(?:[eE][-+]?\d+)?)"
)
RATES = frozenset((b"predicted_per_second", b"prompt_per_second"))
# a streamed chunk with text in it: OpenAI's "delta": {"content": "x" ...} (or {"role": ..., "content": "x"}),
# Anthropic's "delta": {"type": "text_delta", "text": "x"}, the Responses API's "delta": "x"
DELTA = re.compile(rb'"delta"\s*:\s*(?:\{[^{}]*?"(?:content|text)"\s*:\s*)?"(?!")')
CACHE_READ = (b"cache_read_input_tokens", b"cache_creation_input_tokens")
HEAD = 4 * 1024  # Anthropic's stream says its input tokens in its first event
TAIL = 16 * 1024  # usage and timings are in the last object of an answer or the last chunks of a stream
WHOLE = 256 * 1024  # a body up to this is searched whole (usage may come first in some servers' JSON)


class Usage(NamedTuple):
    """What an answer said of its tokens (made for every answer: a tuple, not a frozen dataclass)."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    worker_speed: float | None = None  # the worker's own tokens/s of generation (llama-server's timings)
    source: str | None = None  # usage | timings | chunks
    prompt_speed: float | None = None  # the worker's own tokens/s reading the prompt (llama-server's timings)

    def per_second(self, upstream_s: float) -> float | None:
        """Tokens out per second: as the worker measured its generation where it said (no prompt processing, no
        queueing), else over the time the worker took to answer (its prompt processing included)."""
        if not self.tokens_out:
            return None
        if self.worker_speed is not None and self.worker_speed > 0:
            return self.worker_speed
        return self.tokens_out / upstream_s if upstream_s > 0 else None


def _figures(data: bytes) -> dict[bytes, bytes]:
    """Each figure's last value in `data` (a later answer object or chunk says the final one)."""
    last: dict[bytes, bytes] = {}
    for key, sign, digits, rest in FIGURES.findall(data):
        if key in RATES:
            last[key] = sign + digits + rest
        elif not sign:
            last[key] = digits
    return last


def read_usage(data: bytes, chunks: int = 0) -> Usage:
    """The usage an answer (or a stream's last bytes) carries; `chunks`: a stream's chunks with content."""
    found = _figures(data if len(data) <= WHOLE else data[-TAIL:])
    prompt, completion = found.get(b"prompt_tokens"), found.get(b"completion_tokens")
    predicted, rate = found.get(b"predicted_n"), found.get(b"predicted_per_second")
    speed = float(rate) if rate is not None and predicted is not None else None
    reading = found.get(b"prompt_per_second")
    prompt_speed = float(reading) if reading is not None else None
    if completion is None and prompt is None:  # the Responses and Messages APIs' names
        completion = found.get(b"output_tokens")
        prompt = found.get(b"input_tokens")
        if prompt is not None:  # Anthropic's counts what its cache read (or wrote) apart; the Responses API has none
            prompt = b"%d" % sum(int(found.get(k, b"0")) for k in (b"input_tokens", *CACHE_READ))
    if completion is not None or prompt is not None:
        out = None if completion is None else int(completion)
        if predicted is not None and out is not None and int(predicted) != out:
            speed = None  # timings of another count: not this answer's
        return Usage(None if prompt is None else int(prompt), out, speed, "usage", prompt_speed)
    if predicted is not None:
        processed, cached = found.get(b"prompt_n"), found.get(b"cache_n")
        tokens_in = None if processed is None else int(processed) + int(cached or 0)
        return Usage(tokens_in, int(predicted), speed, "timings", prompt_speed)
    if chunks:
        return Usage(None, chunks, None, "chunks")
    return NO_USAGE


NO_USAGE = Usage()


class StreamReader:
    """Fed a stream as it is relayed, in pieces of whole lines (a delta is counted in the piece it ends in, so one
    cut across two pieces would go uncounted): counts the chunks with content and keeps the first and last bytes."""

    def __init__(self) -> None:
        self.pieces: deque[bytes] = deque()
        self.size = 0
        self.chunks = 0
        self.head = b""  # the stream's first whole lines, up to HEAD bytes
        self.heading = True  # the head is still being filled
        self.dropped = False  # the stream's first bytes are no longer among the pieces kept

    def feed(self, piece: bytes) -> None:
        if b'"delta"' in piece:
            self.chunks += len(DELTA.findall(piece))
        if self.heading:
            room = HEAD - len(self.head)
            if len(piece) <= room:
                self.head += piece
            else:  # whole lines only: a number cut short would be another number
                self.head += piece[: piece.rfind(b"\n", 0, room) + 1]
                self.heading = False
        self.pieces.append(piece)
        self.size += len(piece)
        while self.size - len(self.pieces[0]) >= TAIL:  # the last TAIL bytes stay; no copy of them per piece
            self.size -= len(self.pieces.popleft())
            self.dropped = True

    def usage(self) -> Usage:
        """What the stream said: its first lines (Anthropic's input), then its last TAIL bytes."""
        kept = b"".join(self.pieces)
        if not self.dropped and len(kept) <= TAIL:
            return read_usage(kept, self.chunks)
        return read_usage(self.head + b"\n" + kept[-TAIL:], self.chunks)
