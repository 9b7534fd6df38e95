"""Sweep axes: a `SweepSpec` declares them, `expand` turns them into ordered points, presets name common ones.

Points are grouped by workload (batch, context, cache dtype, heads, head_dim), then
next_n, backend and strategy, so each workload's inputs are built once on the device
and reused. Every value is checked when the spec is made; a bad one raises a ValueError
that lists the allowed values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsa_lab.bench.timing import TimingConfig
from dsa_lab.errors import as_int, check_choice, check_range
from dsa_lab.kernels import backend_names
from dsa_lab.metadata import STRATEGIES
from dsa_lab.store import AXES  # a point is keyed, stored and compared by these
from dsa_lab.workload import CACHE_DTYPES, MAX_NEXT_N, SUPPORTED_HEAD_DIMS, SUPPORTED_HEADS, mixed_length_batch

PRESETS = ("ci", "smoke", "h200-full")
MAX_BATCH = 4096


@dataclass(frozen=True)
class ContextSpec:
    """Cached length(s) per request: one length, or 'mixed:MIN-MAX' (log-uniform, seeded)."""

    low: int
    high: int

    @property
    def mixed(self) -> bool:
        return self.low != self.high

    @property
    def label(self) -> str:
        return f"mixed:{self.low}-{self.high}" if self.mixed else str(self.low)

    @classmethod
    def parse(cls, value: str | int) -> ContextSpec:
        text = str(value).strip().lower()
        try:
            if text.startswith("mixed:"):
                low, high = (_tokens(part) for part in text[len("mixed:") :].split("-"))
                if not 1 <= low < high:
                    raise ValueError
                return cls(low, high)
            length = _tokens(text)
            if length < 1:
                raise ValueError
            return cls(length, length)
        except ValueError:
            raise ValueError(
                f"context={value!r}: allowed values are a length (e.g. 8192 or 8K) "
                "or 'mixed:MIN-MAX' with 1 <= MIN < MAX (e.g. mixed:1K-64K)"
            ) from None

    def seq_lens(self, batch: int, seed: int) -> tuple[int, ...]:
        if not self.mixed:
            return (self.low,) * batch
        return mixed_length_batch(batch, self.low, self.high, 1, seed).seq_lens


def _tokens(text: str) -> int:
    text = text.strip().lower()
    scale = 1024 if text.endswith("k") else 1
    return int(text[:-1] if scale > 1 else text) * scale


def _unique(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class SweepSpec:
    """The axes of a sweep (each a tuple of values) and how each point is checked and timed."""

    backend: tuple[str, ...] = ("reference",)
    strategy: tuple[str, ...] = STRATEGIES
    batch: tuple[int, ...] = (2,)
    context: tuple[str, ...] = ("256",)
    next_n: tuple[int, ...] = (1, 2)
    cache_dtype: tuple[str, ...] = ("fp8",)
    heads: tuple[int, ...] = (64,)
    head_dim: tuple[int, ...] = (128,)
    seed: int = 0
    timing: TimingConfig = field(default_factory=TimingConfig)
    check_tolerance: float = 1e-3  # ||out - ref|| / ||ref|| on valid positions
    check_requests: int = 2  # requests checked when the full check would be too costly
    full_check_limit: int = 1 << 22  # sum over query rows of their context, below which all are checked

    def __post_init__(self) -> None:
        allowed = {
            "backend": backend_names(),
            "strategy": STRATEGIES,
            "cache_dtype": CACHE_DTYPES,
            "heads": SUPPORTED_HEADS,
            "head_dim": SUPPORTED_HEAD_DIMS,
        }
        for axis in AXES:
            values = getattr(self, axis)
            values = (values,) if isinstance(values, (str, int)) else tuple(values)
            if not values:
                raise ValueError(f"{axis}: needs at least one value")
            if axis == "context":
                values = tuple(ContextSpec.parse(v).label for v in values)
            if axis in ("batch", "next_n", "heads", "head_dim"):
                if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
                    raise ValueError(f"{axis}={values!r}: values must be ints")
            for value in values:
                if axis in allowed:
                    check_choice(axis, value, allowed[axis])
                elif axis == "batch":
                    check_range("batch", value, 1, MAX_BATCH)
                elif axis == "next_n":
                    check_range("next_n", value, 1, MAX_NEXT_N)
            object.__setattr__(self, axis, _unique(values))
        shortest = min(ContextSpec.parse(c).low for c in self.context)
        if shortest < max(self.next_n):
            raise ValueError(f"context: shortest length {shortest} is below the largest next_n={max(self.next_n)}")
        if isinstance(self.check_tolerance, bool) or not isinstance(self.check_tolerance, (int, float)) or not 0 < self.check_tolerance < 1:
            raise ValueError(f"check_tolerance={self.check_tolerance!r}: must lie in (0, 1)")
        object.__setattr__(self, "seed", as_int("seed", self.seed))
        check_range("check_requests", self.check_requests, 1, 1 << 16)
        check_range("full_check_limit", self.full_check_limit, 0, 1 << 62)
        if not isinstance(self.timing, TimingConfig):
            raise ValueError(f"timing: expected a TimingConfig, got {type(self.timing).__name__}")

    def with_axes(self, **axes: Any) -> SweepSpec:
        """A copy with some axes (or settings) replaced; unknown names are rejected."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(axes) - known)
        if unknown:
            raise ValueError(f"unknown sweep axes {unknown}: allowed are {sorted(known)}")
        return dataclasses.replace(self, **axes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SweepPoint:
    backend: str
    strategy: str
    batch: int
    context: str
    next_n: int
    cache_dtype: str
    heads: int
    head_dim: int

    @property
    def key(self) -> str:
        return "|".join(f"{axis}={getattr(self, axis)}" for axis in AXES)

    @property
    def workload_key(self) -> tuple[int, str, str, int, int]:
        return (self.batch, self.context, self.cache_dtype, self.heads, self.head_dim)


def expand(spec: SweepSpec) -> list[SweepPoint]:
    """All points, grouped by workload, then next_n, backend and strategy (inputs built once per group)."""
    return [
        SweepPoint(backend, strategy, batch, context, n, dtype, heads, dim)
        for batch in spec.batch
        for context in spec.context
        for dtype in spec.cache_dtype
        for heads in spec.heads
        for dim in spec.head_dim
        for n in spec.next_n
        for backend in spec.backend
        for strategy in spec.strategy
    ]


def _registered(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(name for name in names if name in backend_names())


def preset(name: str) -> SweepSpec:
    """'ci' (CPU, reference, tiny), 'smoke' (GPU, small) or 'h200-full' (the study's sweep)."""
    check_choice("preset", name, PRESETS)
    if name == "ci":
        return SweepSpec(
            backend=("reference",), batch=(2,), context=("192", "mixed:64-256"), next_n=(1, 2, 3),
            heads=(32,), head_dim=(64,),
            timing=TimingConfig(warmup=1, min_samples=3, max_samples=5, max_seconds=0.05, window=3),
        )  # fmt: skip
    gpu_backends = _registered(("deepgemm", "triton"))
    if name == "smoke":
        return SweepSpec(
            backend=gpu_backends, batch=(1, 8), context=("4096", "mixed:1024-8192"), next_n=(1, 2, 3, 4),
            timing=TimingConfig(warmup=3, min_samples=10, max_samples=50, max_seconds=0.2),
        )  # fmt: skip
    return SweepSpec(
        backend=gpu_backends, batch=(1, 16, 64, 128), context=("8192", "32768", "65536", "131072", "mixed:1024-65536"),
        next_n=(1, 2, 3, 4, 5, 6, 8),
        timing=TimingConfig(warmup=3, min_samples=10, max_samples=100, max_seconds=0.25),
    )  # fmt: skip
