"""The axis table: one row per axis, from which points, grids, flags, columns and keys derive.

`config` is an axis added after runs were stored: those runs must keep loading (the column
filled with the value they were measured at), keep their point keys and keep resuming.
"""

from __future__ import annotations

import argparse
import dataclasses

import pandas as pd
import pytest

from dsa_lab import axes
from dsa_lab.analysis import compare
from dsa_lab.bench import cli as bench_cli
from dsa_lab.bench.point import SETTINGS, Point, SweepSpec
from dsa_lab.bench.presets import preset
from dsa_lab.bench.run_folder import _recorded_form
from dsa_lab.profiling.ncu_tables import CONFIG_KEYS
from dsa_lab.store import folders as store


def test_every_axis_is_a_point_field_a_spec_field_a_flag_a_column_and_a_profile_key() -> None:
    parser = argparse.ArgumentParser()
    bench_cli.add_grid_flags(parser)
    flags = {a for action in parser._actions for a in action.option_strings}
    for axis in axes.AXES:
        assert axis.name in Point.__dataclass_fields__ and axis.name in SweepSpec.__dataclass_fields__
        assert axis.flag in flags and axis.name in CONFIG_KEYS
        assert axis.column in store.RESULT_COLUMNS or not axis.stored_always
    assert set(axes.POINT_KEYS) | set(axes.SERIES_KEYS) == set(axes.NAMES)
    assert axes.NESTING[: len(axes.WORKLOAD_KEYS)] == axes.WORKLOAD_KEYS  # each workload is built once


def test_point_and_spec_are_written_field_by_field_as_the_axis_table_declares() -> None:
    """Written dataclasses (a reader, a type checker and an IDE see `point.next_n`), held to `axes.AXES`: a field
    per axis, in the table's order, of its kind; a point's default is the axis's old-run value (none for an axis
    every run stores), a spec's the axis's grid default; the spec's settings come after its axes."""
    point_fields, spec_fields = dataclasses.fields(Point), dataclasses.fields(SweepSpec)
    assert [f.name for f in point_fields] == list(axes.NAMES)
    assert [f.name for f in spec_fields][: len(axes.NAMES)] == list(axes.NAMES)
    for axis, point_field, spec_field in zip(axes.AXES, point_fields, spec_fields):
        assert point_field.type == axis.kind.__name__ and spec_field.type == f"tuple[{axis.kind.__name__}, ...]"
        if axis.stored_always:
            assert point_field.default is dataclasses.MISSING, axis.name
        else:
            assert point_field.default == axis.old_value, axis.name
        assert spec_field.default_factory() == axis.defaults(), axis.name
    assert {f.name for f in spec_fields[len(axes.NAMES) :]} == {*SETTINGS, "grids"}
    assert SweepSpec().next_n == axes.axis("next_n").defaults()
    assert Point("reference", "native", 2, "256", 3, "fp8", 64, 128).timer == axes.axis("timer").old_value


def test_values_are_checked_and_named_by_their_axis() -> None:
    assert axes.axis("context").check(["8K", "8192", "mixed:1K-64K"]) == ("8192", "mixed:1024-65536")
    for name, value, message in (
        ("heads", 48, r"heads=48"),
        ("next_n", 17, r"next_n=17"),
        ("batch", True, r"batch=True"),
        ("backend", "nope", r"backend='nope'"),
        ("strategy", "fast", r"strategy='fast'"),
        ("context", "lots", r"context='lots'"),
    ):
        with pytest.raises(ValueError, match=message):
            axes.axis(name).check(value)
    with pytest.raises(ValueError, match=r"axis='nope'"):
        axes.axis("nope")


def test_an_axis_added_later_leaves_older_runs_loading_comparing_and_resuming(shipped_full_run: store.Run) -> None:
    results = shipped_full_run.results
    assert (results["config"] == axes.axis("config").old_value).all()  # the column the run predates, filled in
    some = results.iloc[0]
    point = Point(**{name: some[name] for name in axes.NAMES})
    assert point.key == some["point_key"]  # an axis at its old-run value is not part of a key
    assert Point(**{**point.axes(), "config": "dot_rows=64"}).key == point.key + "|config=dot_rows=64"
    recorded = shipped_full_run.provenance["spec"]
    spec = SweepSpec.from_dict(recorded)
    assert "config" not in recorded and "config" not in spec.to_dict()
    assert _recorded_form(shipped_full_run.path, spec) == recorded  # it resumes as stored
    table = compare.compare_runs(shipped_full_run, shipped_full_run)
    flagged = table["note"].str.startswith(("noisier", "noisy"))  # a point too noisy for a verdict gets none
    assert table.loc[~flagged, "verdict"].eq("same").all() and (~flagged).sum() > len(table) // 2
    assert table.loc[flagged, "verdict"].eq("unsure").all()


def test_complete_fills_only_what_is_missing() -> None:
    frame = pd.DataFrame({"backend": ["reference"], "config": ["dot_rows=64"]})
    assert axes.complete(frame)["config"].tolist() == ["dot_rows=64"]
    assert axes.complete(frame.drop(columns="config"))["config"].tolist() == ["rule"]
    # an axis added later whose default is its old-run value is not recorded; one whose default moved on is
    added_later = {a.name for a in axes.AXES if not a.stored_always and a.defaults() == (a.old_value,)}
    assert preset("ci").to_dict().keys() == {*axes.NAMES, *SweepSpec.__dataclass_fields__} - added_later - {"grids"}
    assert preset("ci").to_dict()["topk_impl"] == ["vllm"]  # the step vLLM runs; older runs read 'torch'
    logits_rows = pd.DataFrame({"timed": ["logits", "logits+topk"]})
    assert axes.complete(logits_rows)["topk_impl"].tolist() == ["none", "torch"]  # what each row of an older run ran
