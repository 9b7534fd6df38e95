"""Loads validate types and schemas: every results column and provenance field has its type, named with
the file and rows; a run of an unknown backend, of every registered one, or with no rows still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from run_files_support import KEY, PARQUET, PROV, make_run, provenance

from dsa_lab import axes
from dsa_lab.kernels import backend_names
from dsa_lab.store import folders as store
from dsa_lab.store import opening


def rekey(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with each row's point_key made again from its axes, as a producer that changed them would."""
    return frame.assign(point_key=[axes.point_key(row) for row in frame.to_dict("records")])


# ---------------------------------------------------------------- loads validate types and schemas

TYPED = {
    "times as numeric strings": (lambda f: f.assign(median_ms=f["median_ms"].map(str)), r"'median_ms' is not a number"),
    "next_n NaN": (lambda f: f.assign(next_n=float("nan")), r"column 'next_n' must hold integers"),
    "next_n 1.5": (lambda f: f.assign(next_n=1.5), r"column 'next_n' must hold integers"),
    "next_n 17": (lambda f: f.assign(next_n=17), r"column 'next_n': next_n=17: allowed range is \[1, 16\]"),
    "batch as strings": (lambda f: f.assign(batch="1"), r"column 'batch' must hold integers"),
    "batch 0": (lambda f: f.assign(batch=0), r"column 'batch': batch=0: allowed range is \[1, "),
    "context an int": (lambda f: f.assign(context=64), r"column 'context' holds non-text"),
    "context not a label": (lambda f: f.assign(context="64K"), r"column 'context': context='64K': stored as '65536', its one spelling"),
    "strategy unknown": (lambda f: f.assign(strategy="diagonal"), r"column 'strategy': strategy='diagonal': allowed values are"),
    "cache_dtype unknown": (lambda f: f.assign(cache_dtype="int8"), r"column 'cache_dtype': cache_dtype='int8': allowed values are"),
    "backend with markup": (lambda f: f.assign(backend="<img src=x onerror=alert(1)>"), r"column 'backend' holds a value that is not a plain name"),
    "heads no kernel has": (lambda f: f.assign(heads=48), r"column 'heads': heads=48: allowed values are"),
    "only the minimal columns": (lambda f: f[list(store.RESULT_COLUMNS)],
                                 r"timed rows without the plan's columns \['launches', 'kernel_rows', 'pieces'"),
    "samples negative": (lambda f: f.assign(samples_ms=[[-1.0, -2.0]]), r"samples_ms are not a list of finite, positive"),
    "samples NaN": (lambda f: f.assign(samples_ms=[[float("nan")]]), r"samples_ms are not a list"),
    "samples strings": (lambda f: f.assign(samples_ms=[["1.0"]]), r"samples_ms are not a list"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TYPED))
def test_load_run_validates_every_column_naming_the_file_and_rows(tmp_path: Path, case: str) -> None:
    """Times stored as strings, a NaN next_n or only the minimal columns used to load, then break a
    notebook with a raw TypeError or KeyError; a backend name with markup used to load and go live
    through the latency explorer's pandas Styler (a backend is now a plain name)."""
    change, says = TYPED[case]
    run_dir = make_run(tmp_path, "a")
    change(pd.read_parquet(run_dir / PARQUET)).to_parquet(run_dir / PARQUET, index=False)
    with pytest.raises(store.RunFormatError, match=says) as err:
        store.load_run(run_dir)
    assert PARQUET in str(err.value) and (f"row 0 ({KEY})" in str(err.value) or "columns" in case)


def test_a_run_of_a_backend_this_checkout_does_not_know_loads(tmp_path: Path) -> None:
    """A backend from a module not loaded here (docs/add_a_kernel.md) is a plain name in a stored run."""
    run_dir = make_run(tmp_path, "a")
    rekey(pd.read_parquet(run_dir / PARQUET).assign(backend="nobody")).to_parquet(run_dir / PARQUET, index=False)
    assert list(store.load_run(run_dir).results["backend"]) == ["nobody"]


@pytest.mark.parametrize("backend", backend_names())
def test_every_registered_backend_and_a_run_from_before_the_config_axis_load(tmp_path: Path, backend: str) -> None:
    """The vocabularies are the axis table's: every registered backend is a name a run may hold, and a run
    stored before the `config` axis existed (no column) loads with the value it was measured at."""
    run_dir = make_run(tmp_path, "a")
    frame = rekey(pd.read_parquet(run_dir / PARQUET).assign(backend=backend))
    frame.drop(columns=[c for c in ("config",) if c in frame]).to_parquet(run_dir / PARQUET, index=False)
    results = store.load_run(run_dir).results
    assert list(results["backend"]) == [backend] and list(results["config"]) == [axes.axis("config").old_value]


PROVENANCE_TYPES = {
    "git a string": ({"git": "abc"}, r"git must be dict"),
    "environment a list": ({"environment": [1]}, r"environment must be dict"),
    "created not a time": ({"created": "yesterday"}, r"created 'yesterday' is not an ISO 8601 time"),
    "run_id with markup": ({"run_id": "<script>x</script>"}, r"run_id '<script>x</script>' is not a plain name"),
    "seed a string": ({"seed": "zero"}, r"seed must be int"),
    "seed a bool": ({"seed": True}, r"seed must be int"),
    "device_name a number": ({"device_name": 7}, r"device_name must be str"),
}


@pytest.mark.parametrize("case", list(PROVENANCE_TYPES))
def test_provenance_fields_have_their_types(tmp_path: Path, case: str) -> None:
    change, says = PROVENANCE_TYPES[case]
    run_dir = make_run(tmp_path, "a")
    path = run_dir / PROV
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(store.RunFormatError, match=says) as err:
        store.load_run(run_dir)
    assert PROV in str(err.value)


def test_a_run_with_no_rows_still_loads(tmp_path: Path) -> None:
    run_dir = opening.create_run(tmp_path / "cpu" / "empty", provenance("empty"))
    store.write_results(run_dir)
    assert store.load_run(run_dir).results.empty


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(st.text(max_size=6), st.floats(allow_nan=True), st.booleans(), st.none()))
def test_any_non_integer_batch_is_refused_by_name(tmp_path: Path, value: object) -> None:
    run_dir = tmp_path / "cpu" / "a"
    if not run_dir.exists():
        make_run(tmp_path, "a")
    frame = pd.read_parquet(run_dir / PARQUET)
    frame["batch"] = pd.Series([value], dtype=object)
    try:
        frame.to_parquet(run_dir / PARQUET, index=False)
    except Exception:  # pyarrow cannot store this value at all: nothing to load
        return
    with pytest.raises(store.RunFormatError, match=r"column 'batch'"):
        store.load_run(run_dir)
    frame.assign(batch=1).to_parquet(run_dir / PARQUET, index=False)
