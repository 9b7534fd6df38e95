"""The declared row (issue 30): a stored row's columns are declared in groups, each owned by the code that writes
it (`store.format.COLUMN_GROUPS`); every producer writes its group's columns and no other, every shipped run holds
declared columns only, and a column no group declares is refused by name when a run loads."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from dsa_lab import axes
from dsa_lab.bench.measurement import Measurement
from dsa_lab.bench.point import Point
from dsa_lab.bench.recorder import STUDY_PLATFORM, Recorder, route_columns
from dsa_lab.model.roofline import roofline_columns
from dsa_lab.paths import data_dir
from dsa_lab.store import folders as store
from dsa_lab.store.format import COLUMN_GROUPS, GROUP_OF, RESULT_COLUMNS, RESULTS_FILE, RunFormatError

GROUPS = {group.name: set(group.columns) for group in COLUMN_GROUPS}
POINT = Point("reference", "flatten", 2, "256", 3, "fp8", 32, 64, acceptance="accept:0.8,0.5")
PLAN = POINT.plan(POINT.seq_lens(0), (1, 2), 0)


def test_the_groups_are_the_brief_s_and_each_column_is_declared_once() -> None:
    names = [group.name for group in COLUMN_GROUPS]
    assert names == ["row", "axes", "plan", "check", "measurement", "roofline", "route", "top-k", "replay"]
    assert len(GROUP_OF) == sum(len(group.columns) for group in COLUMN_GROUPS)  # no column in two groups
    assert all(group.owner and group.columns for group in COLUMN_GROUPS)
    assert GROUPS["axes"] == set(axes.NAMES)
    assert set(RESULT_COLUMNS) <= set(GROUP_OF)


def test_each_producer_writes_its_group() -> None:
    assert set(PLAN.columns()) == GROUPS["plan"]
    measured = {f.name for f in dataclasses.fields(Measurement)} - {"device"}  # the row's device, the same value
    assert measured <= GROUPS["measurement"]
    assert GROUPS["measurement"] - measured == {"metadata_host_ms", "schedule_ms"}  # bench.evaluate's host times
    roofline = set(roofline_columns(PLAN.cost, 1.0, None, True))
    assert roofline - GROUPS["plan"] == GROUPS["roofline"]  # besides the plan's bytes and FLOPs it repeats
    assert set(route_columns(POINT, 0, STUDY_PLATFORM)) == GROUPS["route"]


def test_a_recorded_row_starts_from_declared_columns(tmp_path) -> None:
    recorder = Recorder(tmp_path, torch.device("cpu"), 0, 1, 0, progress=False)
    row = recorder.row(POINT)
    recorder.close()
    assert {GROUP_OF[column] for column in row} == {"row", "axes", "route", "measurement"}


def test_every_shipped_run_holds_declared_columns_only() -> None:
    runs = sorted(path.parent for path in data_dir().rglob(RESULTS_FILE))
    if not runs:
        pytest.skip("no shipped run in this checkout's data folder")
    for run_dir in runs:
        columns = store.load_run(run_dir).results.columns  # loading checks them
        assert set(columns) <= set(GROUP_OF), run_dir


def test_a_column_no_group_declares_is_refused_by_name(tmp_path) -> None:
    from dsa_lab.bench.presets import preset
    from dsa_lab.bench.sweep import run_sweep

    run_dir = tmp_path / "run"
    spec = preset("ci").with_axes(strategy=("native",), next_n=(1,), context=("96",))
    run_sweep(spec, run_dir, "cpu", max_points=1, progress=False)
    assert set(store.load_run(run_dir).results.columns) <= set(GROUP_OF)
    results = pd.read_parquet(run_dir / RESULTS_FILE).assign(mystery=1.0, also_unknown="x")
    results.to_parquet(run_dir / RESULTS_FILE, index=False)
    with pytest.raises(
        RunFormatError, match=r"column\(s\) \['mystery', 'also_unknown'\] belong to no column group .*row, axes, plan"
    ):
        store.load_run(run_dir)
