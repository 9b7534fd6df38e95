"""The `h200-serving` preset (issue 19's serving study: one run, a union of grids) and the dry run's
estimate, held to what the shipped H200 runs took."""

from __future__ import annotations

import json

import pytest

from dsa_lab.bench.estimate import START_S, estimate, estimate_seconds
from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.presets import SERVING_ACCEPTANCE, preset
from dsa_lab.cli import main
from dsa_lab.kernels import family_of, preset_backends, vllm_backend
from dsa_lab.paths import resolve_data_path
from dsa_lab.store import folders as store

ISSUE13 = "h200/h200-issue13-20261130"  # four backends, B 1-128, 32K and 64K, next_n 1-8, every strategy


@pytest.fixture(scope="module")
def serving() -> SweepSpec:
    return preset("h200-serving")


def test_the_serving_preset_is_its_grids_in_order(serving) -> None:
    names = list(dict.fromkeys(name for name, _ in serving.grid_points()))
    assert names == ["goals", "width", "top-k", "graphs", "small batches", "acceptance", "heavy tail", "spot check"]
    points = serving.points()
    assert len(points) == len({p.key for p in points})
    vllm = vllm_backend().name
    builds = {b for b in family_of(vllm) if b != vllm}
    spot = set(preset_backends("h200-serving:spot-check"))
    assert builds and spot and not {p.backend for p in points if p.strategy == "flatten"} & builds
    assert {p.backend for p in points} == set(preset_backends("h200-full"))
    by_grid = dict((name, pts) for name, pts in reversed(serving.grid_points()))  # each name's first part
    assert {p.backend for p in by_grid["spot check"]} == spot and {p.strategy for p in by_grid["spot check"]} == {
        "native"
    }
    assert not any(p.backend in spot for name, pts in serving.grid_points() if name != "spot check" for p in pts)
    assert {(p.next_n, p.acceptance) for p in points if p.acceptance != "none"} == set(SERVING_ACCEPTANCE)
    assert {p.logits_width for p in points} == {"batch", "model:163840"}
    assert {(p.timed, p.timer) for p in points} == {
        ("logits", "events"),
        ("logits+topk", "events"),
        ("logits+topk", "graph"),
    }
    assert {"mixed:2048-131072", "mixed:16384-65536", "lognormal:16384:1.2"} <= set(serving.context)
    assert set(serving.batch) == {1, 16, 64, 128, 256} and serving.next_n == tuple(range(1, 9))
    goals = [p for name, pts in serving.grid_points() if name == "goals" for p in pts]
    assert {(p.batch, p.context) for p in goals} >= {(256, "mixed:2048-131072"), (128, "mixed:16384-65536")}


def test_the_serving_preset_resumes_as_recorded_and_a_flag_narrows_every_grid(serving, tmp_path, capsys) -> None:
    again = SweepSpec.from_dict(json.loads(json.dumps(serving.to_dict())))
    assert again == serving and [p.key for p in again.points()] == [p.key for p in serving.points()]
    name = next(b for b in serving.backend if b not in family_of(vllm_backend().name))
    narrowed = serving.with_axes(backend=(name,))
    assert {p.backend for p in narrowed.points()} == {name} and len(narrowed.grids) == len(serving.grids)
    assert main(["bench", "--preset", "h200-serving", "--device", "cpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{len(serving.points())} points" in out and "estimated H200 time" in out
    for grid in ("goals", "width", "top-k", "graphs", "acceptance", "heavy tail", "spot check"):
        assert f"\n  {grid} " in out


def test_the_serving_study_fits_its_h200_budget(serving) -> None:
    """~11 minutes of device time in all, two calls of under 9 minutes each: the estimate leaves room."""
    parts = estimate(serving)
    assert sum(p.points for p in parts) == len(serving.points())
    assert 0 < sum(p.run for p in parts) < len(serving.points())  # H200 skips (DeepGEMM's missing sizes, twins)
    assert START_S + estimate_seconds(serving) < 8 * 60


def test_the_estimate_is_held_to_a_shipped_h200_run() -> None:
    """The dry run's estimate of a shipped run's spec against what its points took (their elapsed time and a
    workload build each): within 25 %."""
    path = resolve_data_path(ISSUE13)
    if not path.is_dir():
        pytest.skip(f"{ISSUE13} is not in this checkout's data folder")
    run = store.load_run(path)
    spec = SweepSpec.from_dict(run.provenance["spec"])
    measured = float(run.results["elapsed_s"].sum()) + 0.3 * len(spec.batch) * len(spec.context)
    parts = estimate(spec)
    assert sum(p.run for p in parts) == int((run.results["status"] == "ok").sum())
    assert abs(estimate_seconds(spec) / measured - 1) < 0.25
