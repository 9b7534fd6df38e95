"""A point of the harness and the grid that expands it, both derived from the axis table; presets.

`Point` has one field per axis of `dsa_lab.axes.AXES`, and every mode of the harness (timing,
torch.profiler, Nsight Compute), every stored row and every comparison names a point by them
(`Point.key`). A `SweepSpec` declares the values of each axis (as nvbench or
`triton.testing.Benchmark` declare theirs) plus how a point is checked and timed; `points()`
expands them in `axes.NESTING` order, which builds each workload (the axes the inputs depend
on) once and reuses it for every next_n, backend and strategy. Every value is checked when the
spec is made (`Axis.check`); a bad one raises a ValueError naming the axis and the allowed values.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dsa_lab import axes
from dsa_lab.bench.timing import TimingConfig
from dsa_lab.errors import UnsupportedShape, check_choice, check_range, check_seed
from dsa_lab.kernels import get_backend, preset_backends
from dsa_lab.plan import LaunchPlan
from dsa_lab.workload import ContextSpec, DecodeBatch

PRESETS = ("ci", "smoke", "h200-full", "sm100")
BLOCK_SIZE = 64


class _PointMethods:
    """What a `Point` (one value per axis) knows: its name, its workload, its decode step and its plan."""

    @property
    def key(self) -> str:
        """The point's name in every run file: 'backend=...|strategy=...|...' (`axes.point_key`)."""
        return axes.point_key(self.axes())

    @property
    def workload_key(self) -> tuple[Any, ...]:
        """What the inputs depend on (the KV cache and queries are shared by every other axis)."""
        return tuple(getattr(self, name) for name in axes.WORKLOAD_KEYS)

    def axes(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in axes.NAMES}

    def seq_lens(self, seed: int) -> tuple[int, ...]:
        return ContextSpec.parse(self.context).seq_lens(self.batch, seed)

    def decode_batch(self, seq_lens: Sequence[int]) -> DecodeBatch:
        """The uniform decode step of this point: every request decodes next_n rows."""
        n = self.next_n
        return DecodeBatch(
            tuple(seq_lens), (n,) * self.batch, n, self.heads, self.head_dim, BLOCK_SIZE, self.cache_dtype
        )

    def plan(self, seq_lens: Sequence[int], native_sizes: Sequence[int]) -> LaunchPlan:
        """The launch plan of this point for a backend running `native_sizes` natively."""
        shape = (self.heads, self.head_dim, self.cache_dtype)
        return LaunchPlan(tuple(seq_lens), self.next_n, self.strategy, *shape, tuple(native_sizes))


Point = dataclasses.make_dataclass(
    "Point",
    [(a.name, a.kind) if a.stored_always else (a.name, a.kind, field(default=a.old_value)) for a in axes.AXES],
    bases=(_PointMethods,),
    frozen=True,
)
Point.__doc__ = "One configuration: a value per axis (`dsa_lab.axes.AXES`), i.e. an option on one decode step shape."
Point.__module__ = __name__
SweepPoint = Point  # the name tests and callers of an earlier release import


@dataclass(frozen=True)
class _Settings:
    """How each point of a grid is checked and timed (the axes' values are the spec's other fields)."""

    seed: int = 0
    timing: TimingConfig = field(default_factory=TimingConfig)
    check_tolerance: float = 1e-3  # ||out - ref|| / ||ref|| on valid positions (bench.check)
    check_requests: int = 2  # requests checked when the full check would be too costly
    full_check_limit: int = 1 << 22  # sum over query rows of their context, below which all are checked


SETTINGS = tuple(f.name for f in dataclasses.fields(_Settings))


class _SpecMethods:
    def __post_init__(self) -> None:
        for axis in axes.AXES:
            object.__setattr__(self, axis.name, axis.check(getattr(self, axis.name)))
        for config in self.config:
            _check_config(config, self.backend)
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

    def with_axes(self, **values: Any) -> SweepSpec:
        """A copy with some axes (or settings) replaced; unknown names are rejected."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown sweep axes {unknown}: allowed are {sorted(known)}")
        return dataclasses.replace(self, **values)

    def points(self) -> list[Point]:
        """Every point, in `axes.NESTING` order: grouped by workload, then next_n, backend and strategy."""
        grids = [getattr(self, name) for name in axes.NESTING]
        return [Point(**dict(zip(axes.NESTING, values))) for values in itertools.product(*grids)]

    def to_dict(self) -> dict[str, Any]:
        """The spec as a run's provenance records it (axes at their old-run value left out: `axes.recorded`)."""
        values = dataclasses.asdict(self)
        return {**axes.recorded(values), **{name: values[name] for name in SETTINGS}}

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


def _check_config(config: str, backends: Sequence[str]) -> None:
    """A config must be one at least one backend of the grid takes (the others' points are skipped)."""
    refusals = []
    for name in backends:
        try:
            get_backend(name).configured(config)
            return
        except UnsupportedShape as err:
            refusals.append(str(err))
    raise ValueError(f"config={config!r}: no backend of the grid takes it ({'; '.join(refusals)})")


SweepSpec = dataclasses.make_dataclass(
    "SweepSpec",
    [(a.name, tuple, field(default_factory=a.defaults)) for a in axes.AXES],
    bases=(_SpecMethods, _Settings),
    frozen=True,
)
SweepSpec.__doc__ = "The values of every axis of a grid (each a tuple) and how each point is checked and timed."
SweepSpec.__module__ = __name__


def expand(spec: SweepSpec) -> list[Point]:
    return spec.points()


STUDY_GRID = {
    "batch": (1, 16, 64, 128),
    "context": ("8192", "32768", "65536", "131072", "mixed:1024-65536"),
    "next_n": (1, 2, 3, 4, 5, 6, 8),
}
STUDY_TIMING = TimingConfig(warmup=3, min_samples=10, max_samples=100, max_seconds=0.25)
# The CPU preset: one intra-op thread and at least 0.15 s of samples per point (a few ms a call), so that three
# back-to-back runs agree instead of jumping by 100x with the thread pool on a busy machine.
CPU_TIMING = TimingConfig(warmup=2, min_samples=10, max_samples=2000, max_seconds=0.6, min_seconds=0.15, window=8)


def preset(name: str) -> SweepSpec:
    """'ci' (CPU, tiny), 'smoke' (GPU, small), 'h200-full' (the study's grid on an H200) or 'sm100' (the same
    grid for a B200/GB200, where DeepGEMM and Triton are native for any next_n, so atom plans are one native
    piece and recorded as skipped). Each preset's backends are those that declare it (`LogitsBackend.presets`)."""
    check_choice("preset", name, PRESETS)
    backend = preset_backends(name)
    if name == "ci":
        grid = {
            "batch": (2,),
            "context": ("192", "mixed:64-256"),
            "next_n": (1, 2, 3),
            "heads": (32,),
            "head_dim": (64,),
        }
        return SweepSpec(backend=backend, timing=CPU_TIMING, **grid)
    if name == "smoke":
        timing = TimingConfig(warmup=3, min_samples=10, max_samples=50, max_seconds=0.2)
        return SweepSpec(
            backend=backend, batch=(1, 8), context=("4096", "mixed:1024-8192"), next_n=(1, 2, 3, 4), timing=timing
        )
    return SweepSpec(backend=backend, timing=STUDY_TIMING, **STUDY_GRID)
