"""A point of the harness and the grid that expands it, both derived from the axis table; presets.

`Point` has one field per axis of `dsa_lab.axes.AXES`, and every mode of the harness (timing,
torch.profiler, Nsight Compute), every stored row and every comparison names a point by them
(`Point.key`). A `SweepSpec` declares the values of each axis (as nvbench or
`triton.testing.Benchmark` declare theirs) plus how a point is checked and timed; `points()`
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
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dsa_lab import axes
from dsa_lab.acceptance import AcceptanceSpec
from dsa_lab.bench.timing import TimingConfig
from dsa_lab.errors import UnsupportedShape, check_choice, check_range, check_seed
from dsa_lab.kernels import family_of, get_backend, preset_backends, vllm_backend
from dsa_lab.metadata import STRATEGIES
from dsa_lab.plan import DEEPSEEK_V32_MAX_MODEL_LEN, LaunchPlan, LogitsWidth
from dsa_lab.policy.steps import StepRoute, step_route
from dsa_lab.policy.vllm import Platform, PolicyQuery
from dsa_lab.workload import ContextSpec, DecodeBatch

PRESETS = ("ci", "smoke", "h200-full", "sm100", "h200-serving", "step")
BLOCK_SIZE = 64


class _PointMethods:
    """What a `Point` (one value per axis) knows: its name, its workload, its decode step and its plan."""

    def __post_init__(self) -> None:
        """An axis the others leave no choice (`Axis.implied`: a logits-only point's top-k) takes that value."""
        values = self.axes()
        for axis in axes.AXES:
            implied = axis.implied_by(values)
            if implied is not None:
                object.__setattr__(self, axis.name, implied)
            elif axis.implied_when is not None and values[axis.name] == axis.implied_value:
                raise ValueError(
                    f"{axis.name}={axis.implied_value!r}: only where the other axes imply it; allowed here: "
                    f"{list(axis.allowed() or ())}"
                )

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
class _Settings:
    """How each point of a grid is checked and timed (the axes' values are the spec's other fields)."""

    seed: int = 0
    timing: TimingConfig = field(default_factory=TimingConfig)
    check_tolerance: float = 1e-3  # ||out - ref|| / ||ref|| on valid positions (bench.check)
    check_requests: int = 2  # requests checked when the full check would be too costly
    full_check_limit: int = 1 << 22  # sum over query rows of their context, below which all are checked
    grids: tuple[Grid, ...] = ()  # a union of named grids (the spec's axes then hold their union); (): one grid


SETTINGS = tuple(f.name for f in dataclasses.fields(_Settings) if f.name != "grids")


class _SpecMethods:
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


SERVING = "h200-serving"
SERVING_SPOT_CHECK = f"{SERVING}:spot-check"  # a backend of h200-full that joins only the serving study's spot check
RAGGED = "mixed:2048-131072"  # the serving study's ragged batch (issue 19's mixed:2K-128K)
HEAVY_TAIL = "lognormal:16384:1.2"  # most requests near 16K, a 99th percentile of ~270K clipped to 160K
MODEL_WIDTH = f"model:{DEEPSEEK_V32_MAX_MODEL_LEN}"  # vLLM's logits width for DeepSeek-V3.2
ALL_NEXT_N = tuple(range(1, 9))
WIDTH_NEXT_N = (1, 3, 4, 6, 8)
SMALL_NEXT_N = (1, 2, 3, 4, 6, 8)
# One published acceptance curve per next_n it has positions for (`acceptance.PUBLISHED`); next_n = 6 takes the
# 7-position curve's first 5, labelled so.
SERVING_ACCEPTANCE = (
    (2, "v3-sglang3582"),
    (3, "v4flash-vllm41044"),
    (4, "v4flash-ascend131"),
    (6, "v4flash-dspark-ascend13640:5"),
    (8, "v4flash-dspark-ascend13640"),
)


def serving_grids() -> tuple[Grid, ...]:
    """The grids of `h200-serving`, in the order they run (issue 19's serving study; issue 18's goals first).

    Backends are those of `h200-full`, but for those that declare they join only the spot check
    (`SERVING_SPOT_CHECK`), which run a few native points of their own. Another build of vLLM's own library
    (of the family of vLLM's backend) launches vLLM's one-row kernel for flatten, so it runs native and
    atom only (its flatten would time that kernel twice).
    """
    spot, vllm = preset_backends(SERVING_SPOT_CHECK), vllm_backend().name
    main = tuple(b for b in preset_backends("h200-full") if b not in spot)
    builds = tuple(b for b in main if b != vllm and b in family_of(vllm))

    def grid(name: str, build_strategies: tuple[str, ...] = ("native", "atom"), **values: Any) -> Grid:
        left = [(b, s) for b in builds for s in STRATEGIES if s not in build_strategies]
        return Grid.of(name, left, backend=main, strategy=STRATEGIES, **values)

    ragged = {"batch": 128, "context": RAGGED}
    grids = [
        grid("goals", batch=128, context=("32768", "65536", "131072", RAGGED, "mixed:16384-65536"), next_n=ALL_NEXT_N),
        grid("goals", batch=(64, 256), context=("65536", RAGGED), next_n=ALL_NEXT_N),
        grid("width", ("native",), batch=128, context=("65536", RAGGED), next_n=WIDTH_NEXT_N, logits_width=MODEL_WIDTH),
        grid("top-k", **ragged, next_n=(1, 3, 4, 6), timed="logits+topk"),
        grid("graphs", **ragged, next_n=(1, 3, 4), timed="logits+topk", timer="graph"),
        grid("small batches", batch=1, context=("65536", RAGGED), next_n=SMALL_NEXT_N),
        grid("small batches", batch=16, context=("65536", RAGGED, HEAVY_TAIL), next_n=SMALL_NEXT_N),
        *(grid("acceptance", **ragged, next_n=n, acceptance=curve) for n, curve in SERVING_ACCEPTANCE),
        grid("heavy tail", batch=128, context=HEAVY_TAIL, next_n=ALL_NEXT_N),
    ]
    if spot:
        native = {"strategy": "native", "batch": 128, "context": ("65536", RAGGED)}
        grids.append(Grid.of("spot check", backend=spot, **native, next_n=(1, 3, 4, 8)))
    return tuple(grids)


STEP = "step"
STEP_BATCHES = (1, 16, 64, 128, 256)
STEP_NEXT_N = (1, 3, 4, 6)


def step_grids() -> tuple[Grid, ...]:
    """The grids of `step`: the decode step a user pays for (issue 26), logits then vLLM's top-k, at vLLM's
    logits width, B 1-256, on the serving study's ragged batch (and a uniform 64K one under graphs), beside
    the logits alone under the same timer, so each option's step splits into logits and top-k; then ragged
    verification (`bench.replay`): per published acceptance curve, one graph replayed over steps whose requests
    verify different numbers of drafts, natively against vLLM's route (flatten on SM90).

    Backends are those that declare `step`. vLLM's own library runs every strategy (its route among them);
    another build of it native and atom (its flatten launches vLLM's one-row kernel: the same time twice);
    every other backend its native launch, the one option a kernel native for any next_n offers.
    """
    backends, vllm = preset_backends(STEP), vllm_backend().name
    builds = [b for b in backends if b != vllm and b in family_of(vllm)]
    leave = [(b, s) for b in backends if b != vllm for s in STRATEGIES if s != "native"]
    leave = [(b, s) for b, s in leave if not (b in builds and s == "atom")]
    step = {"backend": backends, "strategy": STRATEGIES, "batch": STEP_BATCHES, "next_n": STEP_NEXT_N}
    step |= {"logits_width": MODEL_WIDTH, "timed": ("logits", "logits+topk"), "topk_impl": "vllm"}
    verify = {**step, "batch": 128, "context": RAGGED, "timer": "replay"}
    ragged = [(b, s) for b in backends if b != vllm for s in STRATEGIES if s != "native"]
    return (
        Grid.of("whole step, graphs", leave, context=(RAGGED, "65536"), timer="graph", **step),
        Grid.of("whole step, events", leave, context=RAGGED, timer="events", **step),
        *(
            Grid.of("ragged verification", ragged, **{**verify, "next_n": n, "acceptance": curve})
            for n, curve in SERVING_ACCEPTANCE
        ),
    )


def preset(name: str) -> SweepSpec:
    """'ci' (CPU, tiny), 'smoke' (GPU, small), 'h200-full' (the study's grid on an H200), 'sm100' (the same
    grid for a B200/GB200, where DeepGEMM and Triton are native for any next_n, so atom plans are one native
    piece and recorded as skipped), 'h200-serving' (the serving study: a union of grids, `serving_grids`) or
    'step' (the whole decode step with vLLM's top-k on any SM90 GPU: `step_grids`).
    Each preset's backends are those that declare it (`LogitsBackend.presets`)."""
    check_choice("preset", name, PRESETS)
    if name == SERVING:
        return SweepSpec(grids=serving_grids(), timing=STUDY_TIMING)
    if name == STEP:
        return SweepSpec(grids=step_grids(), timing=STUDY_TIMING)
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
