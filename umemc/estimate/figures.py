"""A figure is a number of bytes together with the formula and inputs that produced it, so that
`umemc explain` can show where every byte of an estimate comes from."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    name: str
    bytes: int
    formula: str
    inputs: dict[str, object] = field(default_factory=dict)
    parts: tuple[Figure, ...] = ()

    @staticmethod
    def total(name: str, parts: list[Figure], formula: str | None = None) -> Figure:
        parts = [p for p in parts if p.bytes or p.formula]
        if len(parts) == 1 and parts[0].name == name:
            return parts[0]
        return Figure(
            name, sum(p.bytes for p in parts), formula or " + ".join(p.name for p in parts) or "0", parts=tuple(parts)
        )


@dataclass(frozen=True)
class Estimate:
    name: str
    source: str  # gguf | arch | explicit | measured | lock
    weights: Figure
    kv: Figure
    compute: Figure
    overhead: Figure
    gpu: Figure
    explicit: int | None = None  # `memory = …` overrides the sum
    facts: dict[str, object] = field(default_factory=dict)  # quant used, file type, context, ...
    warnings: tuple[str, ...] = ()

    @property
    def sum_bytes(self) -> int:
        return self.weights.bytes + self.kv.bytes + self.compute.bytes + self.overhead.bytes

    @property
    def estimate_bytes(self) -> int:
        return self.explicit if self.explicit is not None else self.sum_bytes
