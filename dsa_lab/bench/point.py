"""A point of the harness, declared once: its axes, the grid that expands them, presets, one list syntax.

`AXES` names a point's coordinates; every mode of the harness (timing, torch.profiler,
Nsight Compute), every stored row and every comparison uses these names and no others.
A `SweepSpec` declares the values of each axis (as nvbench or `triton.testing.Benchmark`
declare theirs) plus how a point is checked and timed; `points()` expands them in an
order that builds each workload (batch, context, cache dtype, heads, head_dim) once and
reuses it for every next_n, backend and strategy. Every value is checked when the spec is
made; a bad one raises a ValueError naming the axis and the allowed values.
`parse_values` is the command line's one list syntax: comma-separated values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsa_lab.bench.timing import TimingConfig
from dsa_lab.errors import check_choice, check_range, check_seed
from dsa_lab.kernels import backend_names
from dsa_lab.metadata import STRATEGIES
from dsa_lab.plan import LaunchPlan
from dsa_lab.store import AXES  # a point is keyed, stored and compared by these
from dsa_lab.workload import (
    CACHE_DTYPES,
    MAX_NEXT_N,
    SUPPORTED_HEAD_DIMS,
    SUPPORTED_HEADS,
    ContextSpec,
    DecodeBatch,
)

INT_AXES = ("batch", "next_n", "heads", "head_dim")
PRESETS = ("ci", "smoke", "h200-full", "sm100")
MAX_BATCH = 4096
BLOCK_SIZE = 64


@dataclass(frozen=True)
class Point:
    """One configuration: a backend running one strategy on one decode step shape."""

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
        """The point's name in every run file: 'backend=...|strategy=...|...' over `AXES`."""
        return "|".join(f"{axis}={getattr(self, axis)}" for axis in AXES)

    @property
    def workload_key(self) -> tuple[int, str, str, int, int]:
        """What the inputs depend on (the KV cache and queries are shared by every other axis)."""
        return (self.batch, self.context, self.cache_dtype, self.heads, self.head_dim)

    def axes(self) -> dict[str, Any]:
        return {axis: getattr(self, axis) for axis in AXES}

    def seq_lens(self, seed: int) -> tuple[int, ...]:
        return ContextSpec.parse(self.context).seq_lens(self.batch, seed)

    def decode_batch(self, seq_lens: Sequence[int]) -> DecodeBatch:
        """The uniform decode step of this point: every request decodes next_n rows."""
        return DecodeBatch(
            tuple(seq_lens), (self.next_n,) * self.batch, self.next_n, self.heads, self.head_dim, BLOCK_SIZE,
            self.cache_dtype,
        )  # fmt: skip

    def plan(self, seq_lens: Sequence[int], native_sizes: Sequence[int]) -> LaunchPlan:
        """The launch plan of this point for a backend running `native_sizes` natively."""
        return LaunchPlan(
            tuple(seq_lens), self.next_n, self.strategy, self.heads, self.head_dim, self.cache_dtype,
            tuple(native_sizes),
        )  # fmt: skip


SweepPoint = Point  # the name tests and callers of an earlier release import


def _unique(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class SweepSpec:
    """The axes of a grid (each a tuple of values) and how each point is checked and timed."""

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
    check_tolerance: float = 1e-3  # ||out - ref|| / ||ref|| on valid positions (bench.check)
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
            if axis in INT_AXES and any(isinstance(v, bool) or not isinstance(v, int) for v in values):
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
        tolerance = self.check_tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1:
            raise ValueError(f"check_tolerance={tolerance!r}: must lie in (0, 1)")
        object.__setattr__(self, "seed", check_seed("seed", self.seed))
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

    def points(self) -> list[Point]:
        """Every point, grouped by workload, then next_n, backend and strategy (inputs built once per group)."""
        return [
            Point(backend, strategy, batch, context, n, dtype, heads, dim)
            for batch in self.batch
            for context in self.context
            for dtype in self.cache_dtype
            for heads in self.heads
            for dim in self.head_dim
            for n in self.next_n
            for backend in self.backend
            for strategy in self.strategy
        ]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepSpec:
        """The spec a run's provenance recorded (`to_dict`), checked as a new one is."""
        if not isinstance(data, dict):
            raise ValueError(f"spec: expected the JSON object of a sweep spec, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"spec: unknown fields {unknown} (a profile run from an older release?)")
        values = dict(data)
        if isinstance(values.get("timing"), dict):
            values["timing"] = TimingConfig(**values["timing"])
        return cls(**values)


def expand(spec: SweepSpec) -> list[Point]:
    return spec.points()


def parse_values(axis: str, text: str) -> tuple:
    """The command line's one list syntax: 'a,b,c' (ints for int axes; 'all' for every strategy)."""
    flag = f"--{axis.replace('_', '-')}"
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"{flag}: give at least one value (comma-separated, e.g. {flag} 1,2,4)")
    if axis == "strategy" and "all" in parts:
        return STRATEGIES
    if axis in INT_AXES:
        try:
            return tuple(int(part) for part in parts)
        except ValueError:
            raise ValueError(f"{flag}={text!r}: values must be integers, comma-separated") from None
    return tuple(parts)


def _registered(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(name for name in names if name in backend_names())


STUDY_GRID = {
    "batch": (1, 16, 64, 128),
    "context": ("8192", "32768", "65536", "131072", "mixed:1024-65536"),
    "next_n": (1, 2, 3, 4, 5, 6, 8),
}
STUDY_TIMING = TimingConfig(warmup=3, min_samples=10, max_samples=100, max_seconds=0.25)


def preset(name: str) -> SweepSpec:
    """'ci' (CPU, reference, tiny), 'smoke' (GPU, small), 'h200-full' (the study's grid on an H200) or
    'sm100' (the same grid for a B200/GB200: DeepGEMM and Triton native for any next_n, so atom
    plans are one native piece and recorded as skipped)."""
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
    return SweepSpec(backend=gpu_backends, timing=STUDY_TIMING, **STUDY_GRID)
