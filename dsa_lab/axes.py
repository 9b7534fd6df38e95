"""The axes of a point, declared once: what a sweep varies, how the command line writes it, how runs store it.

Every layer above derives from `AXES` and spells no axis itself: `bench.point.Point` and
`SweepSpec` get one field per axis, `dsa-lab bench` and `dsa-lab profile` one flag per axis
(`Axis.parse`, the command line's one list syntax: comma-separated values), `store` one
column per axis, `compare` its keys, the profile tables their configuration columns, and the
analysis its group keys (`POINT_KEYS`).

Roles: *series* axes name the option that runs (backend, strategy, config), *shape* axes the
model's dimensions (cache dtype, heads, head dim; a chart shows one shape at a time) and
*point* axes the decode step within a shape (batch, context, next_n, and the serving step's
acceptance, logits width, timed unit and timer). `POINT_KEYS` (shape and point) is what an
answer is computed per; `SERIES_KEYS` what competes there.

The serving axes (issue 19): `acceptance` ('none', 'accept:R1,R2,...' or a published curve:
`acceptance.AcceptanceSpec`, the rows each request brings), `logits_width` ('batch' or
'model:N': `plan.LogitsWidth`, the kernels' max_context_len), `timed` (`TIMED_UNITS`: the
logits launches, or the launches and the top-k after them) and `timer` (`TIMERS`: CUDA events
around each eager step, or one CUDA-graph replay of the whole step). The timer is not called
`timing`: that is the spec's `TimingConfig` (how long and how carefully a point is sampled),
and each row's `timing_method` names what was measured in full ('cuda_graph_step_cold_l2').
The context's distribution and request order ride its label (`workload.ContextSpec`).

An axis added later is one row. Give it `old_value`, the value runs stored before it existed
were measured at: `complete` fills the missing column with it when such a run loads, and an
axis at that value is left out of a point's key (`point_key`) and of a spec's record
(`recorded`), so older runs keep loading, comparing and resuming.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dsa_lab.batch.acceptance import AcceptanceSpec, parse_acceptance_list
from dsa_lab.batch.metadata import STRATEGIES
from dsa_lab.batch.plan import LogitsWidth
from dsa_lab.batch.workload import CACHE_DTYPES, MAX_NEXT_N, SUPPORTED_HEAD_DIMS, SUPPORTED_HEADS, ContextSpec
from dsa_lab.errors import as_int, check_choice, check_range
from dsa_lab.kernels import backend_names, baseline_backend
from dsa_lab.kernels.registry import ask_backend
from dsa_lab.topk import topk_names

ROLES = ("series", "shape", "point")
MAX_BATCH = 4096
TIMED_UNITS = ("logits", "logits+topk")  # what a point times: `bench.timed_unit.timed_step`
TIMERS = ("events", "graph", "replay")  # how a step is timed: `bench.timing.time_step`, `bench.replay`
NO_TOPK = "none"  # the top-k of a logits-only point: it runs none


class _Always:
    """`Axis.old_value` of an axis every stored run has (its column is required)."""

    def __repr__(self) -> str:
        return "ALWAYS_STORED"


ALWAYS_STORED = _Always()


@dataclass(frozen=True)
class Axis:
    """One axis: its name (also its stored column and, with '-' for '_', its flag), the type of a
    value, its role, the values a grid takes when none are given, what is allowed, and the
    value runs stored before the axis existed were measured at."""

    name: str
    kind: type  # int or str
    role: str  # one of ROLES
    default: Callable[[], tuple[Any, ...]] | tuple[Any, ...]  # the values of a grid that names none
    help: str
    choices: Callable[[], Sequence[Any]] | Sequence[Any] | None = None  # None: `bounds`, or any string
    bounds: tuple[int, int] | None = None  # an int axis's closed range
    canonical: Callable[[Any], Any] | None = None  # one spelling per value ('8K' -> '8192')
    every: Sequence[Any] | None = None  # what 'all' stands for on the command line
    split: Callable[[str], tuple[str, ...]] | None = None  # the command line's list, where commas sit inside values
    workload: bool = False  # the inputs (KV cache, queries) depend on it: built once per value
    old_value: Any = ALWAYS_STORED
    stored_any_name: bool = False  # a stored run may name a value this process lacks (a plain name is checked)
    implied_value: Any = None  # a value no grid chooses: the other axes imply it where `implied_when` holds
    implied_when: Callable[[Mapping[str, Any]], bool] | None = None

    def __post_init__(self) -> None:
        check_choice("role", self.role, ROLES)
        check_choice("kind", self.kind, (int, str))

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}"

    @property
    def column(self) -> str:
        return self.name

    @property
    def stored_always(self) -> bool:
        return self.old_value is ALWAYS_STORED

    def defaults(self) -> tuple[Any, ...]:
        return tuple(self.default()) if callable(self.default) else self.default

    def allowed(self) -> tuple[Any, ...] | None:
        return tuple(self.choices()) if callable(self.choices) else self.choices

    def parse(self, text: str) -> tuple[Any, ...]:
        """The command line's one list syntax: 'a,b,c' (ints for an int axis; 'all' where the axis has it)."""
        if self.split is not None:
            return self.split(str(text))
        parts = [part.strip() for part in str(text).split(",") if part.strip()]
        if not parts:
            raise ValueError(
                f"{self.flag}: give at least one value (comma-separated, e.g. {self.flag} {self._example()})"
            )
        if self.every is not None and "all" in parts:
            return tuple(self.every)
        if self.kind is int:
            try:
                return tuple(int(part) for part in parts)
            except ValueError:
                raise ValueError(f"{self.flag}={text!r}: values must be integers, comma-separated") from None
        return tuple(parts)

    def check(self, values: Any) -> tuple[Any, ...]:
        """`values` (one or several) in their canonical spelling, each checked, duplicates dropped;
        a ValueError names the axis, the value and what is allowed."""
        values = (values,) if isinstance(values, (str, int)) else tuple(values)
        if not values:
            raise ValueError(f"{self.name}: needs at least one value")
        out = []
        for value in values:
            if self.kind is int:
                value = as_int(self.name, value)
            elif not isinstance(value, str):
                raise ValueError(f"{self.name}={value!r}: values must be strings")
            if self.canonical is not None:
                value = self.canonical(value)
            allowed = self.allowed()
            if allowed is not None:
                check_choice(self.name, value, allowed)
            elif self.bounds is not None:
                check_range(self.name, value, *self.bounds)
            out.append(value)
        return tuple(dict.fromkeys(out))

    def in_key(self, value: Any) -> bool:
        """Whether `value` names a point: always, unless it is the value runs without this axis had."""
        return self.stored_always or value != self.old_value

    def implied_by(self, values: Mapping[str, Any]) -> Any:
        """The value the other axes of a point leave this one, or None where it is free to choose."""
        return self.implied_value if self.implied_when is not None and self.implied_when(values) else None

    def _example(self) -> str:
        return "1,2,4" if self.kind is int else ",".join(map(str, self.defaults()))


def _context_label(value: str | int) -> str:
    return ContextSpec.parse(value).label


def _baseline() -> tuple[str, ...]:
    return (baseline_backend().name,)


def _acceptance_label(value: str) -> str:
    return AcceptanceSpec.parse(value).label


def _acceptance_list(text: str) -> tuple[str, ...]:
    """'none,accept:0.8,0.6,v3-report': a comma separates profiles, except between an 'accept:' profile's rates."""
    return tuple(spec.label for spec in parse_acceptance_list(text))


def _width_label(value: str) -> str:
    return LogitsWidth.parse(value).label


def _logits_only(values: Mapping[str, Any]) -> bool:
    """A point that times the logits alone runs no top-k, whatever its grid names."""
    return values.get("timed", "logits") == "logits"


AXES: tuple[Axis, ...] = (
    Axis(
        "backend",
        str,
        "series",
        _baseline,
        "kernel backends (`dsa-lab env` lists them; --backend-module FILE adds yours)",
        choices=backend_names,
        canonical=ask_backend,  # a name asked for may be an installed entry point's (`kernels.external`)
        stored_any_name=True,  # a run of a backend from a module not loaded here still loads
    ),
    Axis("strategy", str, "series", STRATEGIES, "how rows reach the kernel, or 'all'", STRATEGIES, every=STRATEGIES),
    Axis("batch", int, "point", (2,), "requests a decode step", bounds=(1, MAX_BATCH), workload=True),
    Axis(
        "context",
        str,
        "point",
        ("256",),
        "cached tokens a request: 8192, 8K, mixed:1K-64K or lognormal:16K:1.2 (':sorted': shortest first)",
        workload=True,
        canonical=_context_label,
    ),
    Axis("next_n", int, "point", (1, 2), "query rows a request (1 + speculative tokens)", bounds=(1, MAX_NEXT_N)),
    Axis("cache_dtype", str, "shape", ("fp8",), "indexer K cache format", CACHE_DTYPES, workload=True),
    Axis("heads", int, "shape", (64,), "indexer heads", SUPPORTED_HEADS, workload=True),
    Axis("head_dim", int, "shape", (128,), "indexer head dimension", SUPPORTED_HEAD_DIMS, workload=True),
    Axis(
        "acceptance",
        str,
        "point",
        ("none",),
        "MTP acceptance: none, accept:R1,R2,... (per-position rates) or a published curve (NAME, NAME:K)",
        canonical=_acceptance_label,
        split=_acceptance_list,
        old_value="none",
    ),
    Axis(
        "logits_width",
        str,
        "point",
        ("batch",),
        "the kernels' max_context_len: batch (the longest context) or model:N (vLLM's max_model_len)",
        canonical=_width_label,
        old_value="batch",
    ),
    Axis("timed", str, "point", ("logits",), "what is timed: logits or logits+topk", TIMED_UNITS, old_value="logits"),
    Axis(
        "timer",
        str,
        "point",
        ("events",),
        "how a step is timed: events, graph (CUDA) or replay (CUDA: one graph over ragged steps, issue 26)",
        TIMERS,
        old_value="events",
    ),
    Axis(
        "topk_impl",
        str,
        "point",
        ("vllm",),
        "the top-k a logits+topk point runs: vllm (vLLM 0.33's own), torch (a stand-in), triton-radix, "
        "cuda-radix or cuda-split (ours); only vllm is vLLM's",
        choices=topk_names,
        old_value="torch",  # what 'logits+topk' ran before the axis; a logits-only point's is implied: 'none'
        stored_any_name=True,
        implied_value=NO_TOPK,
        implied_when=_logits_only,
    ),
    Axis(
        "config",
        str,
        "series",
        ("rule",),
        "tuning configs: 'rule' (the backend's own) or knob=value/knob=value",
        old_value="rule",
    ),
)
BY_NAME: Mapping[str, Axis] = {axis.name: axis for axis in AXES}
NAMES = tuple(BY_NAME)
POINT_KEYS = tuple(a.name for a in AXES if a.role in ("point", "shape"))  # what an answer is computed per
SHAPE_KEYS = tuple(a.name for a in AXES if a.role == "shape")
STEP_KEYS = tuple(a.name for a in AXES if a.role == "point" and a.stored_always)  # batch, context, next_n
OPTION_KEYS = tuple(a.name for a in AXES if a.role == "series" and a.stored_always)  # backend, strategy: an option
SERIES_KEYS = tuple(a.name for a in AXES if a.role == "series")  # what competes at a point
# The point axes added for serving workloads (acceptance, logits width, timed unit, timer): a run that measured
# several values of them holds several workloads at each (batch, context, next_n).
SETTING_KEYS = tuple(a.name for a in AXES if a.role == "point" and not a.stored_always)
WORKLOAD_KEYS = tuple(a.name for a in AXES if a.workload)
# The order `SweepSpec.points` walks a grid: the inputs' axes outermost (each workload built once),
# then the step's other axes, then the options that run on it.
NESTING = (*WORKLOAD_KEYS, *(a.name for a in AXES if not a.workload and a.role != "series"), *SERIES_KEYS)


def axis(name: str) -> Axis:
    check_choice("axis", name, NAMES)
    return BY_NAME[name]


def point_key(values: Mapping[str, Any]) -> str:
    """A point's name in every run file: 'backend=...|strategy=...|...', axes at their old-run value left out
    (an axis added later that `values` lacks is at that value, as `complete` reads an older run)."""
    given = {a.name: values[a.name] if a.name in values or a.old_value is ALWAYS_STORED else a.old_value for a in AXES}
    return "|".join(f"{a.name}={given[a.name]}" for a in AXES if _named(a, given))


def _named(a: Axis, given: Mapping[str, Any]) -> bool:
    """Whether axis `a` is part of the point key of `given`: always stored, or off its old-run value where the other
    axes leave it a choice (`Axis.in_key` and `Axis.implied_by`, in the order that asks least: a dry run names 70k)."""
    if a.stored_always:
        return True
    return given[a.name] != a.old_value and (a.implied_when is None or not a.implied_when(given))


def recorded(values: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """A grid's axes as its provenance records them: an axis whose values are just its old-run value is left out."""
    return {a.name: list(values[a.name]) for a in AXES if a.stored_always or tuple(values[a.name]) != (a.old_value,)}


def at_old_values(frame: pd.DataFrame, names: Sequence[str] = SETTING_KEYS) -> pd.Series:
    """Rows whose `names` axes are each at the old-run value, or at the value the row's other axes imply
    (a logits-only row's top-k is 'none', never the old 'torch'): the step every run before these axes timed."""
    keep = pd.Series(True, index=frame.index)
    for name in names:
        a = axis(name)
        if a.implied_when is None or not len(frame):
            keep &= frame[name] == a.old_value
        else:
            keep &= frame.apply(lambda row, a=a: _at_old_value(a, row), axis=1).astype(bool)
    return keep


def at_old_setting(values: Mapping[str, Any], names: Sequence[str] = SETTING_KEYS) -> bool:
    """`at_old_values` of one point's values."""
    return all(_at_old_value(axis(name), values) for name in names)


def _at_old_value(a: Axis, values: Mapping[str, Any]) -> bool:
    """Axis `a` of `values` at its old-run value, or at the value the other axes imply."""
    value = values[a.name]
    return value == a.old_value or (a.implied_by(values) is not None and value == a.implied_value)


def complete(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with every axis column: a column a run stored before the axis existed lacks gets its old-run value,
    or on each row the value that row's other axes imply."""
    missing = [a for a in AXES if not a.stored_always and a.name not in frame.columns]
    if not missing:
        return frame
    frame = frame.assign(**{a.name: a.old_value for a in missing})
    for a in missing:
        if a.implied_when is not None and len(frame):
            implied = frame.apply(lambda row, a=a: a.implied_by(row), axis=1)
            frame[a.name] = implied.where(implied.notna(), frame[a.name])
    return frame


def shown(frame: pd.DataFrame) -> list[str]:
    """The axes a table for people shows: those the rows differ in, and always the option (backend, strategy)."""
    return [
        a.name
        for a in AXES
        if a.name in frame.columns and ((a.role == "series" and a.stored_always) or frame[a.name].nunique() > 1)
    ]


def shapes(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The distinct shapes (cache dtype, heads, head dim) of a results frame, in order of appearance."""
    present = [k for k in SHAPE_KEYS if k in frame.columns]
    return frame[present].drop_duplicates().to_dict("records") if present else [{}]


def describe_shape(shape: Mapping[str, Any]) -> str:
    """'cache_dtype=fp8, heads=64, head_dim=128'."""
    return ", ".join(f"{k}={shape[k]}" for k in SHAPE_KEYS if k in shape)


def select(frame: pd.DataFrame, values: Mapping[str, Any]) -> pd.DataFrame:
    """The rows of `frame` at the given axis values."""
    mask = pd.Series(True, index=frame.index)
    for name, value in values.items():
        mask &= frame[axis(name).column] == value
    return frame[mask]
