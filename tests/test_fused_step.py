"""Issue 27's fused step against the unfused ones (`analysis.fused_step`, notebook 03's chart and table), on the
shipped H100 step run that timed `gluon-fused` beside every option's logits and vLLM's top-k: every workload's best
unfused option is another backend's, the ratio and the goals read as the issue sets them, and the chart draws."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from dsa_lab.analysis import fused_step, step_split  # noqa: E402
from dsa_lab.kernels import fused_backends  # noqa: E402
from dsa_lab.notebook.sections import FUSED_STEP  # noqa: E402
from dsa_lab.plots.fused_step import plot_fused_step, style_fused_step  # noqa: E402
from dsa_lab.store import folders  # noqa: E402

RUN = Path(__file__).resolve().parents[1] / "data" / "h100" / "h100-step-fused-20261207"


@pytest.fixture(scope="module")
def results() -> pd.DataFrame:
    return folders.load_run(RUN).results


def test_every_workload_sets_the_fused_step_against_the_fastest_other_option(results: pd.DataFrame) -> None:
    table = fused_step.fused_step_table(results)
    fused = fused_backends()[0]
    # 4 next_n x 5 batches under three (context, timer) settings; the replay is not a workload here.
    assert len(table) == 60 and set(table["fused"]) == {fused} and "replay" not in set(table["timer"])
    assert not table["best"].str.contains(fused, regex=False).any()
    steps = results[(results["status"] == "ok") & (results["timed"] == "logits+topk") & (results["timer"] == "graph")]
    row = table[(table["context"] == "65536") & (table["timer"] == "graph") & (table["batch"] == 128)]
    row = row[row["next_n"] == 3].iloc[0]
    at = steps[(steps["context"] == "65536") & (steps["batch"] == 128) & (steps["next_n"] == 3)]
    others = at[at["backend"] != fused]
    assert row["best_us"] == pytest.approx(1000 * others["median_ms"].min())
    assert row["fused_us"] == pytest.approx(1000 * at[at["backend"] == fused]["median_ms"].min())
    assert row["ratio"] == pytest.approx(row["fused_us"] / row["best_us"])


def test_the_goals_are_the_issues(results: pd.DataFrame) -> None:
    table = fused_step.fused_step_table(results)
    judged = table[table["goal"].notna()]
    assert set(judged["batch"]) == {1, 16, 64, 128} and set(judged["next_n"]) == {1, 3, 4}
    assert (judged.loc[judged["batch"] <= 16, "goal"] == 0.70).all()
    assert (judged.loc[judged["batch"] >= 64, "goal"] == 0.90).all()
    assert list(judged["met"]) == list(judged["ratio"] <= judged["goal"])
    assert table.loc[table["goal"].isna(), "met"].isna().all()
    reading = fused_step.fused_reading(table)
    assert f"met at {int(judged['met'].sum())} of {len(judged)} judged points" in reading


def test_a_faster_fused_step_meets_its_goal(results: pd.DataFrame) -> None:
    fused = fused_backends()[0]
    faster = results.copy()
    chosen = (faster["backend"] == fused) & (faster["batch"] == 1) & (faster["timed"] == "logits+topk")
    faster.loc[chosen, "median_ms"] = faster.loc[chosen, "median_ms"] / 4
    table = fused_step.fused_step_table(faster)
    at_one = table[(table["batch"] == 1) & table["goal"].notna()]
    assert not at_one.empty and at_one["met"].all()


def test_no_fused_rows_no_table(results: pd.DataFrame) -> None:
    unfused = results[results["backend"] != fused_backends()[0]]
    table = fused_step.fused_step_table(unfused)
    assert table.empty
    assert "No workload of this run holds both" in fused_step.fused_reading(table)


def test_the_chart_and_table_draw_one_context_and_timer(results: pd.DataFrame) -> None:
    table = fused_step.fused_step_table(results)
    shown, others = step_split.one_chart(table)
    assert set(shown["context"]) == {"mixed:2048-131072"} and set(shown["timer"]) == {"graph"}
    assert "context 65536" in others and "timer events" in others
    figure = plot_fused_step(shown, footer="provenance")
    assert len(figure.axes) == shown["next_n"].nunique()
    assert len(style_fused_step(table).full) == len(table)


def test_the_notebook_section_finds_the_shipped_run() -> None:
    assert FUSED_STEP.covers(folders.load_run(RUN))
