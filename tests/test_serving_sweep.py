"""Issue 19's serving axes wired into the harness, on the CPU through the reference backend: the axis rows
(acceptance, logits width, timed unit, timer; the context's distribution and order in its label), runs that
predate them, the store and compare, the sweep that runs them (ragged rows from acceptance and vLLM's route,
wide logits, the top-k unit and its check, the graph timer refused off CUDA), and union-of-grids specs."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from dsa_lab import axes
from dsa_lab.analysis.compare import compare_runs, summarize
from dsa_lab.analysis.frames import context_order, mixed_context_gap, recommend, uniform_twin, vllm_path
from dsa_lab.analysis.labels import context_title
from dsa_lab.batch.acceptance import AcceptanceSpec
from dsa_lab.bench.inputs import Workload
from dsa_lab.bench.point import Grid, Point, SweepSpec
from dsa_lab.bench.sweep import run_sweep
from dsa_lab.bench.timing import TimingConfig
from dsa_lab.bench.walk import skip_reason
from dsa_lab.kernels import registry
from dsa_lab.kernels.reference import ReferenceBackend
from dsa_lab.policy.query import Platform
from dsa_lab.store import folders as store

FAST = TimingConfig(warmup=1, min_samples=2, max_samples=3, max_seconds=0.01, window=2)
CPU = torch.device("cpu")


def tiny(**values) -> SweepSpec:
    base = SweepSpec(
        backend=("reference",),
        strategy=("native", "flatten"),
        batch=(3,),
        context=("96",),
        next_n=(3,),
        heads=(32,),
        head_dim=(64,),
        timing=FAST,
    )
    return base.with_axes(**values)


def rows_of(run_dir: Path) -> pd.DataFrame:
    return store.load_run(run_dir).results


# ---------------------------------------------------------------- the axis rows


def test_the_serving_axes_are_rows_with_old_run_values_canonical_labels_and_named_errors() -> None:
    for name, old in (("acceptance", "none"), ("logits_width", "batch"), ("timed", "logits"), ("timer", "events")):
        axis = axes.axis(name)
        assert axis.old_value == old and axis.defaults() == (old,) and axis.role == "point" and name in axes.POINT_KEYS
    assert axes.axis("acceptance").check(["V3-REPORT", "accept:0.90", "v4flash-dspark-ascend13640:7"]) == (
        "v3-report",
        "accept:0.9",
        "v4flash-dspark-ascend13640",
    )
    assert axes.axis("acceptance").parse("none,accept:0.8,0.6,v3-report") == ("none", "accept:0.8,0.6", "v3-report")
    assert axes.axis("logits_width").check("MODEL:163840") == ("model:163840",)
    assert axes.axis("context").check(["lognormal:16K:1.20:sorted"]) == ("lognormal:16384:1.2:sorted",)
    for name, bad, says in (
        ("acceptance", "often", r"acceptance='often': allowed values are 'none', 'accept:R1,R2,...'"),
        ("logits_width", "wide", r"logits_width='wide': allowed values are 'batch' .* or 'model:N'"),
        ("timed", "topk", r"timed='topk': allowed values are \('logits', 'logits\+topk'\)"),
        ("timer", "replays", r"timer='replays': allowed values are \('events', 'graph', 'replay'\)"),
        (
            "topk_impl",
            "radix",
            r"topk_impl='radix': allowed values are \('cuda-radix', 'cuda-split', 'torch', 'triton-radix', 'vllm'\)",
        ),
    ):
        with pytest.raises(ValueError, match=says):
            axes.axis(name).check(bad)


def test_a_grid_refuses_an_acceptance_too_short_for_its_next_n_and_a_width_narrower_than_its_contexts() -> None:
    with pytest.raises(ValueError, match="acceptance='v3-report': gives 1 draft positions, next_n=3 needs 2"):
        tiny(acceptance=("v3-report",))
    with pytest.raises(ValueError, match=r"logits_width='model:90': narrower than the longest context .* \(96\)"):
        tiny(logits_width=("model:90",))
    tiny(acceptance=("v3-report",), next_n=(2,), logits_width=("model:96",))  # enough positions, wide enough


def test_runs_stored_before_the_serving_axes_load_with_their_old_run_values(shipped_full_run) -> None:
    results = shipped_full_run.results
    for name in ("acceptance", "logits_width", "timed", "timer"):
        assert (results[name] == axes.axis(name).old_value).all()
    first = results.iloc[0]
    assert Point(**{name: first[name] for name in axes.NAMES}).key == first["point_key"]  # keys unchanged


def test_a_stored_value_an_axis_refuses_is_a_named_error_on_load(tmp_path) -> None:
    run = tmp_path / "run"
    run_sweep(tiny(strategy=("native",)), run, "cpu", progress=False)
    frame = pd.read_parquet(run / store.RESULTS_FILE)
    frame.assign(acceptance="sometimes").to_parquet(run / store.RESULTS_FILE, index=False)
    with pytest.raises(store.RunFormatError, match=r"column 'acceptance': acceptance='sometimes': allowed values"):
        store.load_run(run)
    frame.assign(logits_width="Model:512").to_parquet(run / store.RESULTS_FILE, index=False)
    with pytest.raises(
        store.RunFormatError,
        match=r"column 'logits_width': logits_width='Model:512': stored as 'model:512', its one spelling",
    ):
        store.load_run(run)


def test_lognormal_and_sorted_contexts_are_ordered_titled_and_twinned() -> None:
    labels = [
        "lognormal:16384:1.2",
        "mixed:2048-131072:sorted",
        "65536",
        "mixed:2048-131072",
        "8192",
        "lognormal:4096:1.5",
        "mixed:16384-65536",
    ]
    assert context_order(labels) == [
        "8192",
        "65536",
        "mixed:16384-65536",
        "mixed:2048-131072",
        "mixed:2048-131072:sorted",
        "lognormal:4096:1.5",
        "lognormal:16384:1.2",
    ]
    assert context_title("lognormal:16384:1.2:sorted") == "lognormal 16K σ1.2, sorted"
    assert uniform_twin("mixed:2048-131072:sorted") == "131072" and uniform_twin("lognormal:16384:1.2") == "16384"


def test_the_mixed_context_gap_sets_a_lognormal_batch_beside_its_median() -> None:
    rows = []
    for context, ms in (("16384", 1.0), ("lognormal:16384:1.2", 1.5)):
        for backend, strategy, factor in (("triton", "native", 1.0), ("deepgemm", "native", 0.5)):
            for n in (1, 2):
                rows.append(
                    {
                        "backend": backend,
                        "strategy": strategy,
                        "batch": 8,
                        "context": context,
                        "next_n": n,
                        "cache_dtype": "fp8",
                        "heads": 64,
                        "head_dim": 128,
                        "status": "ok",
                        "source": "measured",
                        "median_ms": ms * factor * n,
                        "p25_ms": ms * factor * n,
                        "p75_ms": ms * factor * n,
                        "pieces": str(n),
                    }
                )
    gap = mixed_context_gap(pd.DataFrame(rows), seed=0, candidate=("triton", "native"))
    (row,) = gap.to_dict("records")
    lens = Point("triton", "native", 8, "lognormal:16384:1.2", 1, "fp8", 64, 128).seq_lens(0)
    assert row["uniform"] == "16384" and row["token_share"] == pytest.approx(sum(lens) / (16384 * 8))
    assert row["candidate_scale"] == (1.5, 1.5) and row["baseline_scale"] == (1.5, 1.5)


# ---------------------------------------------------------------- the harness


def test_a_workload_hands_each_request_its_first_rows_as_acceptance_draws_them() -> None:
    point = Point("reference", "native", 4, "mixed:64-300", 4, "fp8", 32, 64, acceptance="accept:0.7,0.5,0.2")
    seq_lens = point.seq_lens(3)
    workload = Workload(point, seq_lens, 4, 3, CPU)
    inputs = workload.inputs(point)
    lens = point.decode_lens(3)
    assert inputs.batch.decode_lens == lens == AcceptanceSpec.parse("accept:0.7,0.5,0.2").decode_lens(4, 4, 3)
    assert len(set(lens)) > 1 and inputs.q.shape[0] == sum(lens)
    expected_q = torch.cat([workload.q[b, :d] for b, d in enumerate(lens)])
    assert torch.equal(inputs.q.view(torch.uint8), expected_q.view(torch.uint8))
    assert torch.equal(inputs.weights, torch.cat([workload.weights[b, :d] for b, d in enumerate(lens)]))
    uniform = Point("reference", "native", 4, "mixed:64-300", 2, "fp8", 32, 64)
    assert workload.inputs(uniform).batch.decode_lens == (2,) * 4


def test_ragged_wide_and_topk_points_run_checked_through_the_reference(tmp_path) -> None:
    """acceptance -> ragged rows (and vLLM's route for the step), a model-wide logits width, the top-k unit
    (checked first), all timed; every row says what vLLM 0.33 runs for its step on SM90 + DeepGEMM."""
    spec = tiny(
        batch=(4,),
        context=("mixed:64-300",),
        next_n=(2, 4),
        acceptance=("none", "v4flash-ascend131"),
        logits_width=("batch", "model:512"),
        timed=("logits", "logits+topk"),
        topk_impl=("torch",),  # vLLM's own top-k needs CUDA: on the CPU the labelled stand-in
        strategy=("native", "flatten", "atom"),
    )
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    results = rows_of(tmp_path / "run")
    ok = results[results["status"] == "ok"]
    assert len(ok) == len(results) - 16 and set(results.loc[results["status"] != "ok", "strategy"]) == {"atom"}
    assert ok["rel_err"].max() <= 1e-3 and (ok["vllm_platform"] == "sm90+dg").all()
    for point in spec.points():
        row = results.set_index("point_key").loc[point.key]
        lens = point.decode_lens(spec.seed)
        if row["status"] == "ok":
            assert row["query_tokens"] == sum(lens) and row["max_decode_len"] == max(lens)
            assert row["logits_columns"] == (512 if point.logits_width == "model:512" else max(point.seq_lens(0)))
        route = point.vllm_route(spec.seed, Platform("sm90", True))
        assert (row["vllm_route"], row["vllm_decodes"], row["vllm_prefills"]) == (route.path, route.decodes, 0)
        if point.acceptance != "none":  # drafts admitted per request: adaptive verification, which flattens here
            assert row["vllm_route"] == "flatten" and (point.next_n == 2 or len(set(lens)) > 1)
        else:
            assert row["vllm_route"] == ("native" if point.next_n in (2, 4) else "flatten")
        if row["status"] == "ok" and point.timed == "logits+topk":
            assert row["topk_rows_equal"] == row["topk_rows"] == row["query_tokens"] and row["topk"] == 2048
            assert row["topk_impl"] == "torch" and row["topk_kernel"] == "torch.topk on a masked copy"
        elif row["status"] == "ok":
            assert pd.isna(row.get("topk_rows"))
    wide = ok[(ok["logits_width"] == "model:512") & (ok["acceptance"] == "none")]
    assert (wide["moved_bytes"] > wide["strategy_bytes"]).all()  # the reference cleans the tail: it writes 512 columns


class _MissesTheLastRow(ReferenceBackend):
    """Right, but leaves the first column of its last kernel row unwritten (NaN)."""

    name, baseline, presets = "test-misses", False, ()

    def logits(self, call):
        out = super().logits(call).clone()
        out[-1, 0] = float("nan")
        return out


def test_a_nan_the_sampled_check_misses_fails_the_topk_check(tmp_path, monkeypatch) -> None:
    """With only the first request checked, a NaN left in another request's row passes the logits check;
    the top-k check scans every row and fails the point, untimed."""
    monkeypatch.setitem(registry._BACKENDS, _MissesTheLastRow.name, _MissesTheLastRow())
    spec = tiny(backend=("test-misses",), strategy=("native",), timed=("logits", "logits+topk"), topk_impl=("torch",))
    run_sweep(spec.with_axes(full_check_limit=0, check_requests=1), tmp_path / "run", "cpu", progress=False)
    by = {row["timed"]: row for row in store.read_points(tmp_path / "run")}
    assert by["logits"]["status"] == "ok"  # the sampled check looked at the first request only
    assert by["logits+topk"]["status"] == "failed" and "top-k check:" in by["logits+topk"]["message"]
    assert "non-finite" in by["logits+topk"]["message"] and by["logits+topk"]["median_ms"] is None


def test_the_graph_timer_is_skipped_off_cuda_saying_why(tmp_path) -> None:
    point = tiny(timer=("graph",)).points()[0]
    assert "timer='graph': CUDA-graph replay needs a CUDA device" in skip_reason(point, CPU)
    run_sweep(tiny(timer=("events", "graph"), strategy=("native",)), tmp_path / "run", "cpu", progress=False)
    by = {row["timer"]: row for row in store.read_points(tmp_path / "run")}
    assert by["events"]["status"] == "ok" and by["events"]["timing_method"] == "wall_clock"
    assert by["graph"]["status"] == "skipped" and "timer='graph'" in by["graph"]["message"]


def test_the_answer_compares_against_the_route_vllm_runs_for_the_step(tmp_path) -> None:
    spec = tiny(next_n=(2,), acceptance=("none", "v3-sglang3582"), strategy=("native", "flatten"))
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    results = rows_of(tmp_path / "run")
    path = vllm_path(results, "reference").set_index("acceptance")["vllm_strategy"]
    assert path["none"] == "native" and path["v3-sglang3582"] == "flatten"  # ragged rows: vLLM flattens
    assert set(recommend(results)["acceptance"]) == {"none", "v3-sglang3582"}  # answered per workload


# ---------------------------------------------------------------- store and compare


def test_a_run_with_the_serving_axes_compares_with_an_older_run_on_their_shared_points(tmp_path, shipped_full_run):
    old = shipped_full_run.results
    newer = old.assign(acceptance="none", logits_width="batch", timed="logits", timer="events")
    extra = newer[newer["next_n"] == 2].assign(acceptance="v3-report")
    extra = extra.assign(point_key=[Point(**{n: r[n] for n in axes.NAMES}).key for _, r in extra.iterrows()])
    assert extra["point_key"].str.endswith("|acceptance=v3-report").all()
    folder = tmp_path / "new"
    folder.mkdir()
    shutil.copy(shipped_full_run.path / store.PROVENANCE_FILE, folder / store.PROVENANCE_FILE)
    pd.concat([newer, extra]).to_parquet(folder / store.RESULTS_FILE, index=False)
    new = store.load_run(folder)
    table = compare_runs(shipped_full_run, new)
    summary = summarize(table, shipped_full_run, new, 0.05)
    given = ~table["note"].str.startswith(("noisier", "noisy"))  # a point too noisy for a verdict gets none
    assert summary.only_b == len(extra) and summary.only_a == 0 and set(table.loc[given, "verdict"]) == {"same"}
    assert summary.both == (old["status"] == "ok").sum() and {"acceptance", "timer"} <= set(table.columns)


# ---------------------------------------------------------------- union specs


def union_spec() -> SweepSpec:
    one = Grid.of(
        "first",
        backend="reference",
        strategy=("native", "flatten"),
        batch=2,
        context="96",
        next_n=(1, 2),
        heads=32,
        head_dim=64,
    )
    two = Grid.of(
        "second",
        [("reference", "flatten")],
        backend="reference",
        strategy=("native", "flatten"),
        batch=(2, 3),
        context="96",
        next_n=2,
        heads=32,
        head_dim=64,
        timed="logits+topk",
    )
    again = Grid.of(
        "again", backend="reference", strategy="native", batch=2, context="96", next_n=1, heads=32, head_dim=64
    )
    return SweepSpec(grids=(one, two, again), timing=FAST)


def test_a_union_of_grids_runs_each_grid_in_turn_each_point_once() -> None:
    spec = union_spec()
    names = [(name, [p.key for p in points]) for name, points in spec.grid_points()]
    assert [n for n, _ in names] == ["first", "second", "again"] and names[2][1] == []  # already in 'first'
    assert len(names[0][1]) == 4 and len(names[1][1]) == 2  # 'second' leaves flatten out
    assert all("timed=logits+topk" in key and "strategy=native" in key for key in names[1][1])
    assert spec.batch == (2, 3) and spec.timed == ("logits", "logits+topk") and spec.strategy == ("native", "flatten")
    again = SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and [p.key for p in again.points()] == [p.key for p in spec.points()]
    assert spec.to_dict()["grids"][1]["leave_out"] == [["reference", "flatten"]]
    only_native = spec.with_axes(strategy=("native",), seed=3)
    assert only_native.seed == 3 and {p.strategy for p in only_native.points()} == {"native"}
    with pytest.raises(ValueError, match="a spec of several grids takes its axes from its grids"):
        SweepSpec(grids=spec.grids, batch=(7,))
    with pytest.raises(ValueError, match=r"grid 'x': unknown axes \['colour'\]"):
        SweepSpec.from_dict({"grids": [{"name": "x", "colour": ["red"]}]})
    with pytest.raises(ValueError, match="strategy='sideways'"):
        SweepSpec(grids=(Grid.of("x", [("reference", "sideways")], batch=2, context="96"),))


def test_a_union_run_resumes_into_the_same_points_in_the_same_order(tmp_path, capsys) -> None:
    from dsa_lab.cli import main

    spec, run = union_spec(), tmp_path / "run"
    first = run_sweep(spec, run, "cpu", max_points=3, progress=False)
    assert first.stop_reason == "max_points" and first.remaining == len(spec.points()) - 3
    assert main(["bench", "--resume", "--out", str(run), "--device", "cpu", "--no-progress"]) == 0
    logged = [row["point_key"] for row in store.read_points(run)]
    assert logged == [p.key for p in spec.points()]  # resumed from the provenance's grids, in order, once each
    assert store.read_provenance(run / store.PROVENANCE_FILE)["spec"] == json.loads(json.dumps(spec.to_dict()))


def test_a_union_run_records_the_libraries_its_grids_name(tmp_path, monkeypatch) -> None:
    """A union's provenance spec holds grids, not a backend list: the PR #340 build a grid named (and ran
    on the H200) used to be left out of the run's environment."""
    from dsa_lab import env_info
    from dsa_lab.kernels import deepgemm_pr340 as pr
    from tests.test_deepgemm_pr340 import fake_build

    monkeypatch.setenv(pr.ENV_VAR, str(fake_build(tmp_path / "pr340")))
    monkeypatch.delitem(sys.modules, pr.MODULE_NAME, raising=False)
    monkeypatch.setattr(pr, "_LOADED", {})
    env_info.environment_facts.cache_clear()
    try:
        spec = union_spec()
        grids = (
            *spec.grids,
            Grid.of(
                "pr340",
                backend="deepgemm-pr340",
                strategy="native",
                batch=2,
                context="96",
                next_n=1,
                heads=32,
                head_dim=64,
            ),
        )
        run_sweep(SweepSpec(grids=grids, timing=FAST), tmp_path / "run", "cpu", progress=False)
        environment = store.read_provenance(tmp_path / "run" / store.PROVENANCE_FILE)["environment"]
        assert "57b90e0" in environment["deepgemm_pr340_origin"] and environment["deepgemm_pr340"] == "2.5.0"
    finally:
        env_info.environment_facts.cache_clear()
