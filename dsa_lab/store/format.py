"""What a stored run holds, declared, and checked on every read; each failure names the file (and rows).

A run folder holds `provenance.json`, `points.jsonl` (the log a sweep appends a row to per point) and
`results.parquet` (the log's last row per point). A row's columns are declared here, in groups, each owned by the
code that writes it (`COLUMN_GROUPS`: the row's own, the axes, the plan, the check, the measurement, the roofline,
vLLM's route, the top-k and ragged verification's replays; `tests/test_store_format.py` holds each producer to its
group),
and a run is read only if every column it holds is one a group declares: a column no group declares is refused by
name, not carried into frames no chart knows.

`store` reads the files; this module says whether what it read is a run: the provenance's
fields have their types (a run id is one folder name, `created` an ISO 8601 time, `git`
and `environment` objects, the seed an int), and `results.parquet` has every column it
needs with its dtype: the axes as ints within range or names from the project's
vocabulary, timed rows with their plan columns and with times and samples that are
finite and positive. A notebook that reads a run therefore never meets a string where a
time belongs, a NaN next_n, or a missing column: the load fails first, naming them.

The vocabularies are the axis table's (`axes.AXES`: each axis's kind, choices or range and
canonical spelling; a backend is a plain name, registered here or not: a run of a backend from a
module this process has not loaded still loads, and nothing is imported for it), so an axis added
later is checked as soon as it is a row of that table, and a run stored before it existed
loads with the value it was measured at (`axes.complete`, before these checks).

Judgement calls: names that end up in pages (backend, run id) must be plain names
(letters, digits, '.', '_', '-'), so they can carry no markup, rather than being
accepted and escaped at every use (a run id is one folder name); free text (device names,
messages) is accepted and escaped where it becomes HTML.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dsa_lab import axes
from dsa_lab.errors import PLAIN_NAME

SCHEMA_VERSION = 1
RESULTS_FILE = "results.parquet"
PROVENANCE_FILE = "provenance.json"
POINTS_FILE = "points.jsonl"
LOCK_FILE = ".lock"
SOURCES = ("measured", "modeled")
STATUSES = ("ok", "failed", "error", "skipped")


@dataclass(frozen=True)
class ColumnGroup:
    """The columns one producer writes into a stored row: the group's name, the code that writes them (`owner`)
    and the columns, each declared by one group only."""

    name: str
    owner: str
    columns: tuple[str, ...]


COLUMN_GROUPS = (
    ColumnGroup(
        "row",
        "bench.recorder.Recorder.row and the sweep's loop (bench.sweep)",
        ("point_key", "status", "message", "source", "device", "device_name", "estimated_bytes", "elapsed_s"),
    ),
    ColumnGroup("axes", "bench.point.Point.axes: one column per axis of dsa_lab.axes.AXES", axes.NAMES),
    ColumnGroup(
        "plan",
        "plan.LaunchPlan.columns (its cost's bytes and FLOPs also model.roofline.roofline_columns')",
        (
            "launches",
            "kernel_rows",
            "query_tokens",
            "max_decode_len",
            "logits_columns",
            "pieces",
            "native_sizes",
            "unique_bytes",
            "strategy_bytes",
            "unique_kv_bytes",
            "strategy_kv_bytes",
            "flops",
        ),
    ),  # fmt: skip
    ColumnGroup(
        "check",
        "bench.check.check_point and the workload's numerics, through bench.evaluate",
        (
            "rel_err",
            "checked_requests",
            "checked_tokens",
            "poisoned",
            "check_tolerance",
            "tolerance_reason",
            "k_scales",
        ),
    ),
    ColumnGroup(
        "measurement",
        "bench.measurement.Measurement.as_row (its device is the row's), and bench.evaluate's host times",
        (
            "timing_method",
            "samples",
            "median_ms",
            "mean_ms",
            "min_ms",
            "p10_ms",
            "p25_ms",
            "p75_ms",
            "p90_ms",
            "iqr_ms",
            "rel_iqr",
            "noisy",
            "stop_reason",
            "host_us",
            "warmup",
            "torch_threads",
            "spin_us",
            "samples_ms",
            "metadata_host_ms",
            "schedule_ms",
        ),
    ),  # fmt: skip
    ColumnGroup(
        "roofline",
        "model.roofline.roofline_columns",
        (
            "moved_bytes",
            "logit_bytes",
            "roofline_gpu",
            "floor_ms",
            "floor_bound",
            "achieved_tbps",
            "effective_tbps",
            "achieved_tflops",
            "fraction_of_floor",
        ),
    ),  # fmt: skip
    ColumnGroup(
        "route", "bench.recorder.route_columns", ("vllm_route", "vllm_decodes", "vllm_prefills", "vllm_platform")
    ),
    ColumnGroup(
        "top-k",
        "bench.evaluate (bench.timed_unit.check_step_topk) and bench.replay.replay_point",
        ("topk", "topk_kernel", "topk_rows", "topk_rows_equal", "topk_max_score_gap", "topk_poisoned"),
    ),
    ColumnGroup("replay", "bench.replay.replay_point", ("replays", "replays_wrong")),
)
GROUP_OF = {column: group.name for group in COLUMN_GROUPS for column in group.columns}
RESULT_COLUMNS = (  # every run has these; an axis added later is filled in on load (`axes.complete`)
    "point_key",
    "status",
    "message",
    "source",
    *(a.column for a in axes.AXES if a.stored_always),
    "median_ms",
    "p25_ms",
    "p75_ms",
    "iqr_ms",
)
TIME_COLUMNS = ("p25_ms", "median_ms", "p75_ms")  # in this order for every timed (status ok) row
TIMED_COLUMNS = ("launches", "kernel_rows", "pieces", "unique_bytes", "strategy_bytes", "flops")  # the plan's
TEXT_COLUMNS = ("point_key", "status", "message", "source")  # besides the text axes (`axes.AXES`)
NUMBER_COLUMNS = (*TIME_COLUMNS, "iqr_ms", "samples", *(c for c in TIMED_COLUMNS if c != "pieces"))
PROVENANCE_KEYS = (
    "schema_version",
    "run_id",
    "source",
    "device",
    "created",
    "command",
    "timing_method",
    "seed",
    "environment",
    "git",
)
PROVENANCE_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "created": (str,),
    "device": (str,),
    "device_name": (str,),
    "timing_method": (str,),
    "environment": (dict,),
    "git": (dict,),
    "spec": (dict,),
    "seed": (int,),
}
SHOWN_ROWS = 3
MEDIAN_RTOL = 1e-6  # a row's median_ms against the median of its own samples_ms: rounding, never a swap


class RunFormatError(ValueError):
    """A run file is missing, corrupt or not one of ours; the message names the file."""


def check_provenance_fields(provenance: dict[str, Any], path: Path) -> None:
    """Each field a reader uses has its type; the run id is a plain name and `created` an ISO 8601 time."""
    for key, types in PROVENANCE_TYPES.items():
        if key not in provenance or (key == "device_name" and provenance[key] is None):
            continue
        value = provenance[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise RunFormatError(f"{path}: {key} must be {' or '.join(t.__name__ for t in types)}, got {value!r:.80}")
    if not PLAIN_NAME.fullmatch(provenance["run_id"]):
        raise RunFormatError(
            f"{path}: run_id {provenance['run_id']!r:.80} is not a plain name (letters, digits, "
            "'.', '_', '-'; a run id is one folder name)"
        )
    try:
        dt.datetime.fromisoformat(provenance["created"])
    except ValueError:
        raise RunFormatError(f"{path}: created {provenance['created']!r:.80} is not an ISO 8601 time") from None


def _rows(frame: pd.DataFrame, mask: Any) -> str:
    picked = frame.index[np.asarray(mask, dtype=bool)]
    keys = frame["point_key"] if "point_key" in frame else pd.Series("?", index=frame.index)
    shown = ", ".join(f"row {i} ({keys.at[i]})" for i in picked[:SHOWN_ROWS])
    more = f" and {len(picked) - SHOWN_ROWS} more" if len(picked) > SHOWN_ROWS else ""
    return f"{len(picked)} row(s): {shown}{more}"


def _fail(path: Path, frame: pd.DataFrame, mask: Any, what: str) -> None:
    if np.asarray(mask, dtype=bool).any():
        raise RunFormatError(f"{path}: {what}; {_rows(frame, mask)}")


def _not_in_vocabulary(axis: Any, values: pd.Series) -> tuple[Any, str] | None:
    """The first value of `values` the axis refuses (or does not spell canonically) and the axis's reason."""
    for value in values.unique():
        try:
            canonical = axis.check(value.item() if isinstance(value, np.generic) else value)[0]
        except ValueError as err:
            return value, str(err)
        if canonical != value:
            return value, f"{axis.name}={value!r}: stored as {canonical!r}, its one spelling"
    return None


def check_axes(results: pd.DataFrame, path: Path) -> None:
    """Every axis column of the axis table (`axes.AXES`) its kind, each value one the axis allows (a backend
    any plain name, `Axis.stored_any_name`), in its one spelling; an axis a run stored before it existed lacks
    is `axes.complete`'s to fill in, with the value those runs were measured at."""
    for axis in axes.AXES:
        if axis.column not in results:
            continue
        values = results[axis.column]
        if axis.kind is int:
            if not pd.api.types.is_integer_dtype(values.dtype):
                not_int = values.map(lambda v: isinstance(v, bool) or not isinstance(v, (int, np.integer)))
                _fail(path, results, not_int, f"column {axis.column!r} must hold integers")
        else:
            _fail(path, results, ~values.map(lambda v: isinstance(v, str)), f"column {axis.column!r} holds non-text")
        if axis.stored_any_name:  # e.g. a backend of a module this process has not loaded: never imported here
            plain = values.map(lambda v: isinstance(v, str) and PLAIN_NAME.fullmatch(v) is not None)
            _fail(
                path,
                results,
                ~plain,
                f"column {axis.column!r} holds a value that is not a plain name (letters, digits, '.', '_', '-')",
            )
            continue
        refused = _not_in_vocabulary(axis, values)
        if refused is not None:
            value, reason = refused
            _fail(path, results, values == value, f"column {axis.column!r}: {reason}")


def check_columns(results: pd.DataFrame, path: Path) -> None:
    """Every column one a group of `COLUMN_GROUPS` declares; the first others are named, with the groups."""
    unknown = [str(column) for column in results.columns if column not in GROUP_OF]
    if unknown:
        groups = ", ".join(group.name for group in COLUMN_GROUPS)
        raise RunFormatError(
            f"{path}: column(s) {unknown[:SHOWN_ROWS]}{' and more' if len(unknown) > SHOWN_ROWS else ''} belong "
            f"to no column group (a run's columns are declared in dsa_lab.store.format.COLUMN_GROUPS: {groups})"
        )


def check_results(results: pd.DataFrame, path: Path) -> None:
    """Every column declared and of its dtype, the axes within their vocabulary and range, timed rows complete and
    sane."""
    check_columns(results, path)
    for column in TEXT_COLUMNS:
        if column in results:
            _fail(
                path, results, ~results[column].map(lambda v: isinstance(v, str)), f"column {column!r} holds non-text"
            )
    check_axes(results, path)
    check_keys(results, path)
    timed = results[results["status"] == "ok"]
    if timed.empty:
        return
    missing = [column for column in TIMED_COLUMNS if column not in results]
    if missing:
        raise RunFormatError(
            f"{path}: timed rows without the plan's columns {missing} (required: {list(TIMED_COLUMNS)})"
        )
    for column in NUMBER_COLUMNS:
        if column in timed:
            values = timed[column]
            _fail(
                path,
                timed,
                ~values.map(lambda v: isinstance(v, (int, float, np.number)) and not isinstance(v, bool)),
                f"timed rows whose {column!r} is not a number",
            )
    _check_times(timed, path)
    if "samples_ms" in timed:
        _fail(
            path,
            timed,
            ~timed["samples_ms"].map(_valid_samples),
            "timed rows whose samples_ms are not a list of finite, positive times",
        )
        _check_medians(timed, path)


def check_keys(results: pd.DataFrame, path: Path) -> None:
    """Every row's point_key is the key of its own axis columns (`axes.point_key`): compare and resume match rows
    by key, so a key moved to another row would set different points against each other."""
    if results.empty or "point_key" not in results:
        return
    columns = [a.column for a in axes.AXES if a.column in results]
    names = [a.name for a in axes.AXES if a.column in results]
    expected = [
        axes.point_key(
            {name: value.item() if isinstance(value, np.generic) else value for name, value in zip(names, row)}
        )
        for row in results[columns].itertuples(index=False)
    ]
    wrong = results["point_key"].to_numpy() != np.asarray(expected, dtype=object)
    if wrong.any():
        first = int(np.flatnonzero(wrong)[0])
        _fail(
            path,
            results,
            wrong,
            f"point_key is not the key of the row's own axis columns (e.g. row {results.index[first]} holds "
            f"{results['point_key'].iat[first]!r:.200}, its axes make {expected[first]!r:.200}): rows moved or edited",
        )


def _check_medians(timed: pd.DataFrame, path: Path) -> None:
    """A timed row's median_ms is the median of its own samples_ms (within `MEDIAN_RTOL`), where it stores them."""

    def off(median: float, samples: Any) -> bool:
        if samples is None or (isinstance(samples, float) and math.isnan(samples)):
            return False
        return not math.isclose(float(np.median(np.asarray(samples, dtype=np.float64))), median, rel_tol=MEDIAN_RTOL)

    wrong = [off(float(m), s) for m, s in zip(timed["median_ms"], timed["samples_ms"], strict=True)]
    _fail(
        path,
        timed,
        wrong,
        f"timed rows whose median_ms is not the median of their own samples_ms (within {MEDIAN_RTOL:g})",
    )


def _valid_samples(value: Any) -> bool:
    """None (not stored), or a non-empty list of finite, positive numbers."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) == 0:
        return False
    try:
        values = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if any(isinstance(v, (str, bytes, bool)) for v in value):
        return False
    return bool(values.ndim == 1 and np.isfinite(values).all() and (values > 0).all())


def _check_times(timed: pd.DataFrame, path: Path) -> None:
    """Every timed row: finite, positive times, p25 <= median <= p75; else name the file and the rows."""
    values = timed[list(TIME_COLUMNS)].astype(float).to_numpy()
    bad_value = ~(np.isfinite(values) & (values > 0)).all(axis=1)
    ordered = (values[:, 0] <= values[:, 1]) & (values[:, 1] <= values[:, 2])
    _fail(
        path,
        timed,
        bad_value,
        f"{len(timed.index[bad_value])} timed row(s) with non-finite or non-positive times (p25_ms, median_ms, p75_ms)",
    )
    _fail(
        path,
        timed,
        ~ordered,
        f"{len(timed.index[~ordered])} timed row(s) with quartiles out of order (need p25_ms <= median_ms <= p75_ms)",
    )
