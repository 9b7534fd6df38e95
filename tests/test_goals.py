"""Issue 13's goals (`studies.goals`) and the best option over several backends (`frames.best_option`):
hand-built runs whose every verdict is known, then the shipped Gluon run."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from dsa_lab.analysis import frames  # noqa: E402
from dsa_lab.batch.plan import LaunchPlan  # noqa: E402
from dsa_lab.model.roofline import GpuSpec, floor_ms  # noqa: E402
from dsa_lab.notebook.runs import timed_backends  # noqa: E402
from dsa_lab.paths import DATA_ENV, resolve_data_path  # noqa: E402
from dsa_lab.plots import style  # noqa: E402
from dsa_lab.studies import goal_display, goal_runs, goals, lab_notes  # noqa: E402

CEILINGS = {"read_tbps": 4.0, "fp8_tflops": 1300.0}
PROVENANCE = {"device_name": "NVIDIA H200", "seed": 0, "ceilings": CEILINGS, "run_id": "hand-built"}
POINT = ["batch", "context", "next_n"]
# (batch, context, next_n) -> {(backend, strategy): µs}; None: the row is there but did not run ok
TIMES_US: dict[tuple[int, str, int], dict[tuple[str, str], float | None]] = {
    (64, "32768", 3): {
        ("gluon", "native"): 100.0,
        ("deepgemm", "atom"): 120.0,
        ("deepgemm", "flatten"): 150.0,
        ("deepgemm-pr340", "native"): 90.0,
    },
    (64, "32768", 4): {("gluon", "native"): 100.0, ("deepgemm", "native"): 110.0, ("deepgemm", "flatten"): 200.0},
    (128, "65536", 3): {("gluon", "native"): 380.0, ("deepgemm", "atom"): 500.0, ("deepgemm-pr340", "native"): 505.0},
    (128, "32768", 1): {("gluon", "native"): None, ("deepgemm", "native"): 150.0},
    (16, "8192", 2): {
        ("gluon", "native"): 20.0,
        ("deepgemm", "native"): 15.0,
        ("deepgemm", "flatten"): 25.0,
        ("triton", "native"): 10.0,
    },
    (1, "65536", 5): {("gluon", "native"): 30.0, ("deepgemm", "flatten"): 28.0, ("deepgemm", "atom"): None},
}


def _row(backend: str, strategy: str, batch: int, context: str, next_n: int, us: float | None) -> dict:
    ms = None if us is None else us / 1e3
    return {
        "backend": backend,
        "strategy": strategy,
        "batch": batch,
        "context": context,
        "next_n": next_n,
        "heads": 64,
        "head_dim": 128,
        "cache_dtype": "fp8",
        "source": "measured",
        "status": "failed" if us is None else "ok",
        "median_ms": ms,
        "p25_ms": None if ms is None else ms * 0.99,
        "p75_ms": None if ms is None else ms * 1.01,
    }


@pytest.fixture(scope="module")
def results() -> pd.DataFrame:
    return pd.DataFrame([_row(b, s, *point, us) for point, times in TIMES_US.items() for (b, s), us in times.items()])


@pytest.fixture(scope="module")
def points(results: pd.DataFrame) -> pd.DataFrame:
    return goals.goal_points(results, PROVENANCE, candidate="gluon").set_index(POINT)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_best_option_over_one_or_several_backends(results: pd.DataFrame) -> None:
    one = frames.best_option(results).set_index(POINT)  # the default: the vendored DeepGEMM alone
    assert one.loc[(64, "32768", 3), ["best_backend", "best_strategy"]].tolist() == ["deepgemm", "atom"]
    assert np.isclose(one.loc[(64, "32768", 3), "best_ms"], 0.120)
    both = frames.best_option(results, frames.vllm_family()).set_index(POINT)
    assert both.loc[(64, "32768", 3), ["best_backend", "best_strategy"]].tolist() == ["deepgemm-pr340", "native"]
    assert np.isclose(both.loc[(64, "32768", 3), "best_ms"], 0.090)
    assert both.loc[(128, "65536", 3), "best_backend"] == "deepgemm"  # 500 µs beats PR #340's 505
    assert both.loc[(16, "8192", 2), "best_backend"] == "deepgemm"  # triton's 10 µs is no DeepGEMM option
    rivals = frames.best_option(results, frames.vllm_family(), ("flatten", "atom")).set_index(POINT)
    assert rivals.loc[(16, "8192", 2), "best_strategy"] == "flatten" and np.isclose(
        rivals.loc[(16, "8192", 2), "best_ms"], 0.025
    )
    assert (1, "65536", 5) in rivals.index and rivals.loc[(1, "65536", 5), "best_strategy"] == "flatten"  # atom failed
    none = frames.best_option(results, "no-such-backend")
    assert none.empty and {"best_backend", "best_strategy", "best_ms"} <= set(none.columns)


def test_goal_points_times_ratios_and_the_best_option(points: pd.DataFrame) -> None:
    row = points.loc[(64, "32768", 3)]
    assert (row.best_backend, row.best_strategy) == ("deepgemm-pr340", "native")
    assert np.isclose(row.candidate_us, 100.0) and np.isclose(row.best_us, 90.0)
    assert np.isclose(row.ratio, 100 / 90)
    assert (row.flatten_atom_backend, row.flatten_atom_strategy) == ("deepgemm", "atom")
    assert np.isclose(row.flatten_atom_ratio, 100 / 120)
    assert np.isclose(points.loc[(128, "65536", 3), "ratio"], 380 / 500)
    assert np.isnan(points.loc[(128, "32768", 1), "candidate_us"])  # gluon failed there
    assert len(points) == len(TIMES_US)


def test_the_floor_reads_kv_once_at_the_runs_ceilings(points: pd.DataFrame) -> None:
    gpu = GpuSpec("this run", CEILINGS["read_tbps"], CEILINGS["fp8_tflops"], "test", measured=True)
    for batch, context, next_n in [(128, "65536", 3), (64, "32768", 4)]:
        cost = LaunchPlan((int(context),) * batch, next_n, "native", 64, 128, "fp8").cost
        expected_us = floor_ms(cost, gpu)[0] * 1e3
        row = points.loc[(batch, context, next_n)]
        assert np.isclose(row.floor_us, expected_us)
        assert np.isclose(row.floor_share, expected_us / row.candidate_us)
    assert points["floor_gpu"].iloc[0] == "NVIDIA H200 (this run)"


def test_verdicts_where_each_goal_applies(points: pd.DataFrame) -> None:
    def verdicts(point: tuple[int, str, int]) -> list[object]:
        return [None if pd.isna(v) else bool(v) for v in points.loc[point, list(goals.GOAL_COLUMNS)]]

    assert verdicts((64, "32768", 3)) == [False, None, None, None]  # 1.11x the PR #340 native; B*L = 2M: no goal 3
    assert verdicts((64, "32768", 4)) == [True, None, None, None]
    share = points.loc[(128, "65536", 3), "floor_share"]
    assert 0.8 <= share < 1.0
    assert verdicts((128, "65536", 3)) == [True, True, True, None]  # 380 µs <= 400 µs
    assert verdicts((128, "32768", 1)) == [None, None, None, None]  # goals 1 and 3 apply, but gluon failed
    assert verdicts((16, "8192", 2)) == [None, None, None, True]  # 20 µs against DeepGEMM flatten's 25
    assert verdicts((1, "65536", 5)) == [None, None, None, False]  # 30 µs against flatten's 28


def test_summary_per_next_n(points: pd.DataFrame) -> None:
    summary = goals.goal_summary(points.reset_index()).set_index("next_n")
    assert list(summary.index) == list(range(1, 9))  # every next_n of goal 1, measured or not
    assert summary.loc[3, "shapes"] == 2 and summary.loc[3, "met"] == 1
    assert np.isclose(summary.loc[3, "speedup_max"], 500 / 380) and np.isclose(summary.loc[3, "speedup_min"], 90 / 100)
    assert summary.loc[3, "worst"] == "B=64 L=32K"
    assert summary.loc[1, "shapes"] == 0 and np.isnan(summary.loc[1, "speedup_min"])


def test_sentences_say_met_missed_and_where(points: pd.DataFrame) -> None:
    first, second, third, fourth = goals.goal_sentences(points.reset_index(), "gluon")
    assert first.startswith("**Goal 1 missed**")
    assert "n=3 (0.900×)" in first and "native (deepgemm-pr340) 90.0 µs" in first  # best / gluon: below 1
    assert "next_n [1, 2, 5, 6, 7, 8] not measured" in first and "Not judged at 1 more" in first
    assert second.startswith("**Goal 2 met**") and "380.0 µs" in second
    assert third.startswith("**Goal 3 not met**") and "Not judged at 1 more" in third  # gluon failed at B=128 L=32K
    assert (
        fourth.startswith("**Goal 4 missed**") and "n=5 (0.933×)" in fourth and "flatten (deepgemm) 28.0 µs" in fourth
    )


def test_not_judged_without_ceilings_or_small_batches(results: pd.DataFrame) -> None:
    large = results[results["batch"] >= 64]
    table = goals.goal_points(large, {"device_name": "cpu", "seed": 0}, candidate="gluon")
    assert table["floor_us"].isna().all() and table["goal3"].isna().all()
    _, _, third, fourth = goals.goal_sentences(table, "gluon")
    assert third.startswith("**Goal 3 not judged**") and fourth.startswith("**Goal 4 not judged**")
    with pytest.raises(ValueError, match="provenance: no 'seed'"):
        goals.goal_points(large, {"device_name": "NVIDIA H200", "ceilings": CEILINGS}, candidate="gluon")


def test_a_missing_candidate_is_an_error(results: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="candidate='gluon': no measured timed 'native' rows"):
        goals.goal_points(results[results["backend"] != "gluon"], PROVENANCE, candidate="gluon")
    other = goals.goal_points(results, PROVENANCE, candidate="triton").set_index(POINT)
    assert other["candidate_us"].notna().sum() == 1 and np.isclose(other.loc[(16, "8192", 2), "ratio"], 10 / 15)


def test_heatmap_speedup_cells_and_footer(points: pd.DataFrame) -> None:
    """The heatmap shows speedups (the best option's time / the candidate's: > 1 faster), the one ratio
    direction of every chart, in the one speedup palette centred at 1 and as far either way in ratio."""
    fig = goal_display.plot_goal_ratio_heatmap(
        points.reset_index(), "NVIDIA H200", "measured on NVIDIA H200 | run x", "gluon"
    )
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "0.900\nnative\ndeepgemm-pr340" in texts  # two DeepGEMM backends win somewhere: the cell names it
    assert "1.316\natom\ndeepgemm" in texts  # time ratio 0.76: gluon 1.316x faster
    assert style.footer_text(fig) == "measured on NVIDIA H200 | run x"
    norm = fig.axes[0].collections[0].norm
    assert norm.vcenter == 1.0 and np.isclose(1.0 / norm.vmin, norm.vmax)
    assert fig.axes[0].collections[0].cmap.name == style.SPEEDUP_CMAP
    with pytest.raises(ValueError, match="no point has both"):
        goal_display.plot_goal_ratio_heatmap(points.reset_index().assign(speedup=np.nan), "H200", None, "gluon")
    html = goal_display.style_goal_points(points.reset_index()).to_html()
    assert "missed" in html and "met" in html


def test_no_run_says_what_is_missing(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    chosen, missing = goal_runs.goal_run("h200/h200-gluon-20261130", "h200", "gluon")
    assert chosen is None
    assert "No measured H200 run with the 'gluon' backend" in missing and "is not there" in missing
    assert "scripts/h200_sweep.sh --backend deepgemm,deepgemm-pr340,gluon,triton" in missing
    with pytest.raises(FileNotFoundError, match="No Nsight Compute run at .*dsa-lab profile"):
        goal_runs.ncu_comparison("h200/experiments/gluon-ncu-20261130", "gluon")


SHIPPED = "h200/h200-gluon-20261130"
SHIPPED_NCU = "h200/experiments/gluon-ncu-20261130"


@pytest.mark.skipif(not resolve_data_path(SHIPPED).is_dir(), reason=f"data/{SHIPPED} is not in this checkout")
def test_the_shipped_gluon_run() -> None:
    chosen, missing = goal_runs.goal_run(SHIPPED, "h200", "gluon")
    assert chosen is not None and not missing and chosen.run.provenance["run_id"] == "h200-gluon-20261130"
    table = goals.goal_points(chosen.run.results, chosen.run.provenance, candidate="gluon").set_index(POINT)
    row = table.loc[(128, "65536", 3)]
    assert (row.best_backend, row.best_strategy) == ("deepgemm", "atom")
    assert row.best_us == pytest.approx(511.7, abs=0.5) and row.candidate_us == pytest.approx(455.2, abs=0.5)
    assert row.ratio < 1 and row.ratio == pytest.approx(455.2 / 511.7, abs=0.002)
    assert bool(row.goal1) and not bool(row.goal2)  # 455 µs: faster than DeepGEMM, not yet within 400 µs
    # the floor is the one the sweep recorded beside each row, at the ceilings it measured
    gluon = chosen.run.results.query("backend == 'gluon' and strategy == 'native'").set_index(POINT)
    assert np.allclose(table["floor_us"], gluon["floor_ms"].reindex(table.index) * 1e3)
    assert table["goal4"].isna().all()  # no batch 1 or 16 in this run
    rounds = lab_notes.tuning_rounds()
    assert "## Round 5 (issue 13)" in rounds and "## Round 10" in rounds and "## Round 4" not in rounds


@pytest.mark.skipif(not resolve_data_path(SHIPPED_NCU).is_dir(), reason=f"data/{SHIPPED_NCU} is not in this checkout")
def test_the_shipped_nsight_compute_comparison() -> None:
    table = goal_runs.ncu_comparison(SHIPPED_NCU, "gluon").set_index(["next_n", "backend"])
    assert table.loc[(3, "gluon"), "us"] == pytest.approx(451.3, abs=0.1)
    assert table.loc[(3, "deepgemm"), "strategy"] == "atom" and table.loc[(4, "deepgemm"), "strategy"] == "native"
    assert table.loc[(3, "gluon"), "dram_read_per_unique"] == pytest.approx(1.007, abs=0.001)
    assert table.loc[(3, "gluon"), "kernel"] == "_paged_mqa_logits_gluon_kernel"
    assert table.loc[(4, "deepgemm"), "tensor_pipe_pct"] == pytest.approx(61.0, abs=0.1)
    assert "hmma" in table.attrs["tensor_counter"]


@pytest.mark.skipif(not resolve_data_path(SHIPPED).is_dir(), reason=f"data/{SHIPPED} is not in this checkout")
def test_an_absent_run_path_falls_back_to_the_newest_gluon_run_and_says_so() -> None:
    chosen, note = goal_runs.goal_run("h200/no-such-run", "h200", "gluon")  # asked for, absent: a banner says so
    assert chosen is not None and "gluon" in timed_backends(chosen.run)
    assert note.startswith("run_path 'h200/no-such-run' is not there: showing h200/") and chosen.missing == note
    chosen, note = goal_runs.goal_run("h200/h200-full-20261129", "h200", "gluon")  # there, but without gluon
    assert "run_path 'h200/h200-full-20261129' holds no goal point ('gluon' not timed on a GPU): showing h200/" in note
    assert chosen is not None and chosen.missing == note and "gluon" in timed_backends(chosen.run)  # a banner
    # gluon timed, but only whole steps and logits at vLLM's width (the step run): no uniform goal point there
    chosen, note = goal_runs.goal_run("h100/h100-step-20261207", "h200", "gluon")
    assert "holds no goal point (no uniform point with 'gluon' beside a DeepGEMM option): showing h200/" in note
    assert chosen is not None and goal_runs.goal_gap(chosen.run, "gluon") is None


ISSUE13 = "h200/h200-issue13-20261130"
ISSUE13_NCU = "h200/experiments/gluon-ncu-pr340-20261130"


@pytest.mark.skipif(not resolve_data_path(ISSUE13).is_dir(), reason=f"data/{ISSUE13} is not in this checkout")
def test_the_run_with_both_deepgemm_builds_holds_gluon_to_pr340_at_next_n_3() -> None:
    chosen, _ = goal_runs.goal_run(ISSUE13, "h200", "gluon")
    assert chosen is not None and {"deepgemm", "deepgemm-pr340", "gluon"} <= timed_backends(chosen.run)
    assert "57b90e06933a7c66a6e3b2135becc54e01ec4f87" in chosen.run.provenance["environment"]["deepgemm_pr340_origin"]
    table = goals.goal_points(chosen.run.results, chosen.run.provenance, candidate="gluon").set_index(POINT)
    row = table.loc[(128, "65536", 3)]
    assert (row.best_backend, row.best_strategy) == ("deepgemm-pr340", "native")  # PR #340 beats atom (a padded 4)
    assert row.best_us == pytest.approx(476.6, abs=0.5) and row.candidate_us == pytest.approx(414.9, abs=0.5)
    assert bool(row.goal1) and not bool(row.goal2)  # faster than every DeepGEMM option, 15 µs short of 400
    small = table[table.index.get_level_values("batch").isin([1, 16])]
    assert small["goal4"].notna().all() and len(small) == 32 and table["goal4"].notna().sum() == 32
    assert not bool(table.loc[(1, "32768", 1), "goal4"])  # one small request: latency, where DeepGEMM leads
    summary = goals.goal_summary(table.reset_index()).set_index("next_n")
    assert summary.loc[3, "met"] == 4 and summary.loc[3, "speedup_min"] > 1 / 0.91


@pytest.mark.skipif(not resolve_data_path(ISSUE13_NCU).is_dir(), reason=f"data/{ISSUE13_NCU} is not in this checkout")
def test_the_nsight_compute_run_with_pr340() -> None:
    table = goal_runs.ncu_comparison(ISSUE13_NCU, "gluon").set_index(["next_n", "backend"])
    assert table.loc[(3, "deepgemm-pr340"), "strategy"] == "native"
    assert table.loc[(3, "gluon"), "us"] < table.loc[(3, "deepgemm-pr340"), "us"] < table.loc[(3, "deepgemm"), "us"]
    assert table.loc[(4, "deepgemm-pr340"), "dram_read_per_unique"] == pytest.approx(2.0, abs=0.01)  # atom 3+1
