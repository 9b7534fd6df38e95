"""A point of the harness and the grid that expands it, both written field by field after the axis table.

`Point` has one field per axis of `dsa_lab.axes.AXES` (in its order, with its old-run value as the default of an
axis added later; `tests/test_axes.py` holds the fields to the table), and every mode of the harness (timing,
torch.profiler, Nsight Compute), every stored row and every comparison names a point by them
(`Point.key`). A `SweepSpec` declares the values of each axis (as nvbench or
`triton.testing.Benchmark` declare theirs: a tuple field per axis) plus how a point is checked and timed; `points()`
expands them in `axes.NESTING` order, which builds each workload (the axes the inputs depend
on) once and reuses it for every next_n, backend and strategy. Every value is checked when the
spec is made (`Axis.check`); a bad one raises a ValueError naming the axis and the allowed values.

A spec may instead be a union of named grids (`grids`, e.g. the `h200-serving` preset: one run,
several sub-grids): its points are each grid's in the listed order, a point that an earlier grid
already holds left out, and its axes hold the union of the grids' values (what the run spans). Its
provenance records the grids, so a resume re-creates the same points in the same order. An axis
given on the command line replaces that axis in every grid.

A point's decode step is the serving step its axes describe: the rows each request brings come from
its acceptance (`decode_lens`, seeded; the kernels see the longest, vLLM's max_decode_len), the
logits are as wide as its logits width, and `vllm_route` says what vLLM 0.33 runs for that step.
The named grids (`ci`, `smoke`, ..., `h200-serving`, `step`) are `bench.presets`'.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dsa_lab import axes
from dsa_lab.batch.acceptance import AcceptanceSpec
from dsa_lab.batch.cache import BLOCK_SIZE
from dsa_lab.batch.plan import LaunchPlan, LogitsWidth
from dsa_lab.batch.workload import ContextSpec, DecodeBatch
from dsa_lab.bench.timing import TimingConfig
from dsa_lab.errors import UnsupportedShape, check_range, check_seed
from dsa_lab.kernels import get_backend
from dsa_lab.policy.query import Platform, PolicyQuery
from dsa_lab.policy.steps import StepRoute, step_route


def _old_value(name: str) -> Any:
    """The default of a point's axis added later: the value runs stored before it were measured at."""
    return axes.axis(name).old_value


def _grid_default(name: str) -> Any:
    """The default of a spec's axis: the values of a grid that names none (`Axis.defaults`)."""
    return field(default_factory=axes.axis(name).defaults)


_IMPLIED = tuple(a for a in axes.AXES if a.implied_when is not None)  # the axes a point's others may imply


@dataclass(frozen=True)
class Point:
    """One configuration: a value per axis (`dsa_lab.axes.AXES`), i.e. an option on one decode step shape; what it
    knows: its name, its workload, its decode step and its plan."""

    backend: str
    strategy: str
    batch: int
    context: str
    next_n: int
    cache_dtype: str
    heads: int
    head_dim: int
    acceptance: str = _old_value("acceptance")
    logits_width: str = _old_value("logits_width")
    timed: str = _old_value("timed")
    timer: str = _old_value("timer")
    topk_impl: str = _old_value("topk_impl")
    config: str = _old_value("config")

    def __post_init__(self) -> None:
        """An axis the others leave no choice (`Axis.implied`: a logits-only point's top-k) takes that value."""
        values = {name: getattr(self, name) for name in axes.NAMES}
        for axis in _IMPLIED:
            implied = axis.implied_by(values)
            if implied is not None:
                object.__setattr__(self, axis.name, implied)
            elif axis.implied_when is not None and values[axis.name] == axis.implied_value:
                raise ValueError(
                    f"{axis.name}={axis.implied_value!r}: only where the other axes imply it; allowed here: "
                    f"{list(axis.allowed() or ())}"
                )

    @cached_property
    def key(self) -> str:
        """The point's name in every run file: 'backend=...|strategy=...|...' (`axes.point_key`); a frozen point's
        name is made once (a dry run of 70k points asks it several times each)."""
        return axes.point_key(self.axes())

    @property
    def workload_key(self) -> tuple[Any, ...]:
        """What the inputs depend on (the KV cache and queries are shared by every other axis)."""
        return tuple(getattr(self, name) for name in axes.WORKLOAD_KEYS)

    def axes(self) -> dict[str, Any]:
        """A value per axis, in the table's order (a copy: the caller may change it)."""
        return dict(self._axes)

    @cached_property
    def _axes(self) -> dict[str, Any]:
        """The point's values, read once it is made (implied axes set): a dry run asks each point several times."""
        return {name: getattr(self, name) for name in axes.NAMES}

    def seq_lens(self, seed: int) -> tuple[int, ...]:
        return ContextSpec.parse(self.context).seq_lens(self.batch, seed)

    def decode_lens(self, seed: int) -> tuple[int, ...]:
        """Rows each request brings: next_n each ('none'), or drawn from the point's acceptance (seeded)."""
        return AcceptanceSpec.parse(self.acceptance).decode_lens(self.batch, self.next_n, seed)

    def decode_batch(self, seq_lens: Sequence[int], seed: int) -> DecodeBatch:
        """The decode step of this point: each request's cached length and the rows it brings (next_n as
        configured; the kernels see the longest decode)."""
        lens, shape = self.decode_lens(seed), (self.heads, self.head_dim, BLOCK_SIZE, self.cache_dtype)
        return DecodeBatch(tuple(seq_lens), lens, self.next_n, *shape)

    def plan(self, seq_lens: Sequence[int], native_sizes: Sequence[int], seed: int) -> LaunchPlan:
        """The launch plan of this point for a backend running `native_sizes` natively: rows as the
        acceptance draws them (the plan's next_n is the longest decode, the rows vLLM's kernel sees), the
        logits as wide as the point's logits width."""
        lens, shape = self.decode_lens(seed), (self.heads, self.head_dim, self.cache_dtype)
        width = LogitsWidth.parse(self.logits_width).model_len
        return LaunchPlan(tuple(seq_lens), max(lens), self.strategy, *shape, tuple(native_sizes), lens, width)

    def vllm_route(self, seed: int, platform: Platform) -> StepRoute:
        """What vLLM 0.33 runs for this step on `platform` (`policy_steps.step_route`). Rows that differ per
        request come from drafts admitted per request, which vLLM 0.33 does under adaptive verification,
        so a point with an acceptance profile asks with it on (on SM90 + DeepGEMM: always flatten)."""
        acceptance = AcceptanceSpec.parse(self.acceptance)
        query = PolicyQuery(
            platform, self.next_n, self.cache_dtype == "mxfp4", adaptive_verification=acceptance.per_request
        )
        return step_route(query, self.decode_lens(seed))


SweepPoint = Point  # the name tests and callers of an earlier release import


@dataclass(frozen=True)
class Grid:
    """One named grid of a union spec: values per axis (an axis it does not name takes its default), and
    the options (backend, strategy) it leaves out."""

    name: str
    values: tuple[tuple[str, tuple[Any, ...]], ...]
    leave_out: tuple[tuple[str, str], ...] = ()  # (backend, strategy) pairs whose points this grid does not hold

    @classmethod
    def of(cls, name: str, leave_out: Sequence[Sequence[str]] = (), **values: Any) -> Grid:
        def values_of(v: Any) -> tuple[Any, ...]:
            return tuple(v) if isinstance(v, (tuple, list)) else (v,)

        pairs = tuple((str(b), str(s)) for b, s in leave_out)
        return cls(name, tuple((axis, values_of(v)) for axis, v in values.items()), pairs)

    @classmethod
    def from_record(cls, record: Any) -> Grid:
        """A grid as a run's provenance records it ({'name': ..., axis: [values], ..., 'leave_out': [[b, s]]})."""
        if not isinstance(record, dict) or not isinstance(record.get("name"), str):
            raise ValueError(f"grids: each grid is a JSON object with a string 'name', got {record!r:.80}")
        unknown = sorted(set(record) - {"name", "leave_out", *axes.NAMES})
        if unknown:
            raise ValueError(f"grid {record['name']!r}: unknown axes {unknown}; allowed are {list(axes.NAMES)}")
        pairs = record.get("leave_out", [])
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ValueError(
                f"grid {record['name']!r}: leave_out must be [[backend, strategy], ...], got {pairs!r:.80}"
            )
        values = _with_old_values({k: v for k, v in record.items() if k not in ("name", "leave_out")})
        return cls.of(record["name"], pairs, **values)

    def axes(self) -> dict[str, tuple[Any, ...]]:
        return dict(self.values)

    def holds(self, point: Point) -> bool:
        return (point.backend, point.strategy) not in self.leave_out

    def record(self) -> dict[str, Any]:
        """The grid as provenance records it (axes at their old-run value left out: `axes.recorded`)."""
        left = {"leave_out": [list(p) for p in self.leave_out]} if self.leave_out else {}
        return {"name": self.name, **axes.recorded(self.axes()), **left}


@dataclass(frozen=True)
class SweepSpec:
    """The values of every axis of a grid (each a tuple, in the axis table's order) and how each point is checked
    and timed; or a union of named grids (`grids`), whose union its axes then hold."""

    backend: tuple[str, ...] = _grid_default("backend")
    strategy: tuple[str, ...] = _grid_default("strategy")
    batch: tuple[int, ...] = _grid_default("batch")
    context: tuple[str, ...] = _grid_default("context")
    next_n: tuple[int, ...] = _grid_default("next_n")
    cache_dtype: tuple[str, ...] = _grid_default("cache_dtype")
    heads: tuple[int, ...] = _grid_default("heads")
    head_dim: tuple[int, ...] = _grid_default("head_dim")
    acceptance: tuple[str, ...] = _grid_default("acceptance")
    logits_width: tuple[str, ...] = _grid_default("logits_width")
    timed: tuple[str, ...] = _grid_default("timed")
    timer: tuple[str, ...] = _grid_default("timer")
    topk_impl: tuple[str, ...] = _grid_default("topk_impl")
    config: tuple[str, ...] = _grid_default("config")
    # how each point is checked and timed
    seed: int = 0
    timing: TimingConfig = field(default_factory=TimingConfig)
    check_tolerance: float = 1e-3  # ||out - ref|| / ||ref|| on valid positions (bench.check)
    check_requests: int = 2  # requests checked when the full check would be too costly
    full_check_limit: int = 1 << 22  # sum over query rows of their context, below which all are checked
    grids: tuple[Grid, ...] = ()  # a union of named grids (the spec's axes then hold their union); (): one grid

    def __post_init__(self) -> None:
        if self.grids:
            self._join_grids()
            return
        for axis in axes.AXES:
            object.__setattr__(self, axis.name, axis.check(getattr(self, axis.name)))
        for config in self.config:
            _check_config(config, self.backend)
        shortest = min(ContextSpec.parse(c).low for c in self.context)
        if shortest < max(self.next_n):
            raise ValueError(f"context: shortest length {shortest} is below the largest next_n={max(self.next_n)}")
        for acceptance in self.acceptance:
            AcceptanceSpec.parse(acceptance).rates_for(max(self.next_n))  # enough draft positions, or named
        # a log-normal's bound is its clip, not a length it is likely to draw: its points check their own lengths
        bounded = [ContextSpec.parse(c) for c in self.context]
        longest = max((c.high for c in bounded if c.distribution != "lognormal"), default=0)
        for width in self.logits_width:
            model_len = LogitsWidth.parse(width).model_len
            if model_len is not None and model_len < longest:
                raise ValueError(
                    f"logits_width={width!r}: narrower than the longest context this grid can draw ({longest}); "
                    f"allowed: 'batch' or model:N with N >= {longest}"
                )
        tolerance = self.check_tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1:
            raise ValueError(f"check_tolerance={tolerance!r}: must lie in (0, 1)")
        object.__setattr__(self, "seed", check_seed("seed", self.seed))
        check_range("check_requests", self.check_requests, 1, 1 << 16)
        check_range("full_check_limit", self.full_check_limit, 0, 1 << 62)
        if not isinstance(self.timing, TimingConfig):
            raise ValueError(f"timing: expected a TimingConfig, got {type(self.timing).__name__}")

    def _join_grids(self) -> None:
        """A union spec: every grid checked as a spec of its own, the axes set to the union of theirs."""
        if isinstance(self.grids, (str, dict)):
            raise ValueError(f"grids: expected a sequence of grids, got {type(self.grids).__name__}")
        grids = tuple(g if isinstance(g, Grid) else Grid.from_record(g) for g in self.grids)
        settings = {name: getattr(self, name) for name in SETTINGS}
        parts = [SweepSpec(**g.axes(), **settings) for g in grids]
        for axis in axes.AXES:
            union = tuple(dict.fromkeys(v for part in parts for v in getattr(part, axis.name)))
            given = tuple(getattr(self, axis.name))
            if given not in (axis.defaults(), union):
                raise ValueError(f"{axis.name}={given!r}: a spec of several grids takes its axes from its grids")
            object.__setattr__(self, axis.name, union)
        for name in SETTINGS:
            object.__setattr__(self, name, getattr(parts[0], name))
        for grid in grids:
            for backend, strategy in grid.leave_out:
                axes.axis("backend").check(backend), axes.axis("strategy").check(strategy)
        named = tuple(
            Grid(g.name, tuple((a, getattr(p, a)) for a in axes.NAMES), g.leave_out) for g, p in zip(grids, parts)
        )
        object.__setattr__(self, "grids", named)

    def parts(self) -> list[tuple[str, SweepSpec]]:
        """(name, one-grid spec) of each grid, in order (the spec itself when it is one grid)."""
        if not self.grids:
            return [("", self)]
        settings = {name: getattr(self, name) for name in SETTINGS}
        return [(g.name, SweepSpec(**g.axes(), **settings)) for g in self.grids]

    def with_axes(self, **values: Any) -> SweepSpec:
        """A copy with some axes (or settings) replaced, in every grid of a union; unknown names are rejected."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown sweep axes {unknown}: allowed are {sorted(known)}")
        if not self.grids or "grids" in values:
            return dataclasses.replace(self, **values)
        grids = tuple(Grid(g.name, tuple((a, values.get(a, v)) for a, v in g.values), g.leave_out) for g in self.grids)
        return SweepSpec(grids=grids, **{name: values.get(name, getattr(self, name)) for name in SETTINGS})

    def points(self) -> list[Point]:
        """Every point, in `axes.NESTING` order: grouped by workload, then next_n, backend and strategy; for a
        union, each grid's in turn (`grid_points`)."""
        return [point for _, points in self.grid_points() for point in points]

    def grid_points(self) -> list[tuple[str, list[Point]]]:
        """Each grid's name and points, in order: for a union, a point its grid leaves out, or that an earlier
        grid holds, is not among them (so a point runs once, where it first appears)."""
        return [(name, list(points)) for name, points in self._grid_points]

    @cached_property
    def _grid_points(self) -> tuple[tuple[str, tuple[Point, ...]], ...]:
        """`grid_points`, made once: a frozen spec's points do not change, and a dry run of 70k asks thrice."""
        return tuple((name, tuple(points)) for name, points in self._make_grid_points())

    def _make_grid_points(self) -> list[tuple[str, list[Point]]]:
        if not self.grids:
            values = [getattr(self, name) for name in axes.NESTING]
            points = (Point(**dict(zip(axes.NESTING, v))) for v in itertools.product(*values))
            return [("", list({p.key: p for p in points}.values()))]  # implied axes can make two one
        seen: set[str] = set()
        out = []
        for grid, (name, part) in zip(self.grids, self.parts()):
            points = [p for p in part.points() if grid.holds(p) and p.key not in seen]
            seen.update(p.key for p in points)
            out.append((name, points))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The spec as a run's provenance records it (axes at their old-run value left out: `axes.recorded`;
        a union: its grids, whose union the axes are)."""
        values = dataclasses.asdict(self)
        settings = {name: values[name] for name in SETTINGS}
        if self.grids:
            return {"grids": [g.record() for g in self.grids], **settings}
        return {**axes.recorded(values), **settings}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepSpec:
        """The spec a run's provenance recorded (`to_dict`), checked as a new one is."""
        if not isinstance(data, dict):
            raise ValueError(f"spec: expected the JSON object of a sweep spec, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"spec: unknown fields {unknown} (a profile run from an older release?)")
        values = _with_old_values(dict(data))
        if isinstance(values.get("timing"), dict):
            values["timing"] = TimingConfig(**values["timing"])
        return cls(**values)


SETTINGS = tuple(f.name for f in dataclasses.fields(SweepSpec) if f.name not in (*axes.NAMES, "grids"))


def _with_old_values(values: dict[str, Any]) -> dict[str, Any]:
    """A recorded grid's axes: one it does not name was at its old-run value (`axes.recorded` left it out)."""
    if "grids" in values:
        return values
    return {a.name: [a.old_value] for a in axes.AXES if not a.stored_always} | values


def _check_config(config: str, backends: Sequence[str]) -> None:
    """A config must be one at least one backend of the grid takes (the others' points are skipped)."""
    refusals = []
    for name in backends:
        try:
            get_backend(name).configured(config)
            return
        except UnsupportedShape as err:
            refusals.append(str(err))
        except Exception as err:  # a backend's own probe failing: named; another may take the config (its points err)
            refusals.append(f"backend {name!r}: configured({config!r}) raised {type(err).__name__}: {err}")
    raise ValueError(f"config={config!r}: no backend of the grid takes it ({'; '.join(refusals)})")


def expand(spec: SweepSpec) -> list[Point]:
    return spec.points()
