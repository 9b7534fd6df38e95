"""Issue 13's goals drawn and styled for notebook 03: the speedup heatmap, the points, the summary, the ncu table.

Drawing only, apart from the judging (`studies.goals`) and the reading of runs (`studies.goal_runs`): it is handed their frames.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from dsa_lab.analysis.frames import context_order
from dsa_lab.analysis.labels import context_title
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.markup import html_text
from dsa_lab.plots.style import (
    ANNOTATION_SIZE,
    SPEEDUP_CMAP,
    add_footer,
    chart_text,
    point_columns,
    shade_speedups,
    speedup_norm,
)
from dsa_lab.plots.tables import FoldedTable, folded
from dsa_lab.studies.goals import GOAL_COLUMNS


def plot_goal_ratio_heatmap(points: pd.DataFrame, device: str, provenance_line: str | None, candidate: str) -> Figure:
    """The candidate's speedup over the best DeepGEMM option at every uniform point (`goal_points`: the best's
    time / the candidate's, > 1 faster, the one ratio direction of every chart; ragged batches have a section of
    their own): rows batch x context,
    columns next_n, the one speedup palette (`style.SPEEDUP_CMAP`, blue: the candidate faster). Each cell
    names the option it is held to: its strategy, and its backend when more than one wins somewhere."""
    shown = points.dropna(subset=["speedup"])
    shown = shown[~shown["context"].map(lambda c: ContextSpec.parse(c).mixed)]  # the goals' batches: uniform ones
    if shown.empty:
        raise ValueError("points: no point has both a candidate and a DeepGEMM time (column 'speedup' all NaN)")
    several = shown["best_backend"].nunique() > 1
    text = [
        f"{r.speedup:.3f}\n{r.best_strategy}" + (f"\n{r.best_backend}" if several else "") for r in shown.itertuples()
    ]
    keys = ["batch", "context"]
    grid = shown.pivot_table(index=keys, columns="next_n", values="speedup")
    notes = shown.assign(text=text).pivot(index=keys, columns="next_n", values="text")
    contexts = context_order(shown["context"])
    order = [(b, c) for b in sorted(shown["batch"].unique()) for c in contexts if (b, c) in grid.index]
    grid, notes = grid.reindex(order), notes.reindex(index=order, columns=grid.columns).fillna("")
    grid.index = [f"B={b}, L={context_title(c)}" for b, c in grid.index]
    rows, columns = grid.shape
    fig, ax = plt.subplots(
        figsize=(3.5 + 1.0 * columns, 1.4 + (0.56 if several else 0.5) * rows), constrained_layout=True
    )
    sns.heatmap(
        grid,
        annot=notes.to_numpy(),
        fmt="",
        annot_kws={"fontsize": ANNOTATION_SIZE},
        cmap=SPEEDUP_CMAP,
        norm=speedup_norm(grid.to_numpy(dtype=float)),
        ax=ax,
        linewidths=0.5,
        linecolor="white",
        cbar_kws={"label": f"best DeepGEMM option / {candidate} native (×, > 1: {candidate} faster)"},
    )
    ax.set(xlabel="next_n", ylabel="batch, context")
    ax.tick_params(axis="y", rotation=0)
    title = (
        f"{candidate} native's speedup over the best DeepGEMM option on {chart_text(device)} (measured; the fastest "
        f"strategy over every DeepGEMM backend timed)\nabove 1 (blue): {candidate} faster. Each cell: the speedup and "
        "the option it is held to; empty: a side was not timed"
    )
    fig.suptitle(title)
    return add_footer(fig, provenance_line)


def style_goal_points(points: pd.DataFrame) -> FoldedTable:
    """`goal_points` for display: µs, speedups (the other side's time over the candidate's, as in the heatmap)
    shaded in the one speedup palette (blue: the candidate wins), the floor's share in %, verdicts as met /
    missed ('—': the goal does not apply, or a side was not timed); folded (`plots.tables`): the heatmap above
    draws every point's speedup."""
    names = {
        "candidate_us": "candidate µs",
        "best_us": "best µs",
        "best_strategy": "best option",
        "best_backend": "its backend",
        "speedup": "best / candidate",
        "flatten_atom_us": "flatten/atom µs",
        "flatten_atom_speedup": "flatten/atom / candidate",
        "floor_us": "floor µs",
        "floor_share": "floor share",
        **{goal: f"goal {goal[-1]}" for goal in GOAL_COLUMNS},
    }
    shown = points[[*point_columns(points), *names]].rename(columns=names)
    shown = shown.assign(context=shown["context"].map(context_title))
    goals = [names[goal] for goal in GOAL_COLUMNS]
    verdict = lambda v: "met" if v else "missed"  # noqa: E731
    colour = lambda v: "" if pd.isna(v) else f"color: {'#1a7f37' if v else '#cf222e'}; font-weight: bold"  # noqa: E731
    style = lambda rows: (  # noqa: E731
        rows.style.format(
            {
                **dict.fromkeys(["candidate µs", "best µs", "flatten/atom µs", "floor µs"], "{:.1f}"),
                "best / candidate": "{:.3f}×",
                "flatten/atom / candidate": "{:.3f}×",
                "floor share": "{:.1%}",
                **dict.fromkeys(goals, verdict),
            },
            na_rep="—",
            escape="html",
        )
        .pipe(shade_speedups, ["best / candidate", "flatten/atom / candidate"])
        .map(colour, subset=goals)
        .hide(axis="index")
    )
    return folded(shown, style, "Every point with its goals' verdicts (its speedup: the heatmap above)")


def style_goal_summary(summary: pd.DataFrame) -> Any:
    """`goal_summary` for display: the least and most speedup per next_n (the best DeepGEMM option's time over
    the candidate's), shaded in the one speedup palette."""
    names = {
        "speedup_min": "best / candidate, min",
        "speedup_max": "best / candidate, max",
        "met": "shapes met",
        "worst": "worst shape",
    }
    shaded = list(names.values())[:2]
    styled = summary.rename(columns=names).style.format(dict.fromkeys(shaded, "{:.3f}×"), na_rep="—", escape="html")
    return shade_speedups(styled, shaded).hide(axis="index")


def style_ncu_comparison(table: pd.DataFrame) -> Any:
    """`ncu_comparison` for display, in words and units, its caption naming ncu's tensor-pipe counter."""
    counter = table.attrs.get("tensor_counter", "?")
    names = {
        "us": "kernel µs",
        "dram_read_per_unique": "DRAM / unique KV",
        "l2_hit_pct": "L2 hit %",
        "occupancy_pct": "occupancy %",
        "tensor_pipe_pct": "tensor pipe busy %",
        "useful_tflops": "useful TFLOP/s",
    }
    formats = ["{:.1f}", "{:.3f}", "{:.1f}", "{:.2f}", "{:.1f}", "{:.0f}"]
    return (
        table.rename(columns=names)
        .style.format(dict(zip(names.values(), formats)), na_rep="—", escape="html")
        .set_caption(
            f"Nsight Compute (kernel replay, caches flushed); tensor pipe busy: ncu counter {html_text(counter)}"
        )
        .hide(axis="index")
    )
