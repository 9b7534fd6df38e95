"""Notebook 03's tables, styled for display: a module apart from its charts (`plots.kernel`), as notebook 04's are.

The frames come from `dsa_lab.analysis.versus` and `analysis.workloads`; long ones fold (`plots.tables`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from pandas.io.formats.style import Styler

from dsa_lab.analysis.labels import context_title
from dsa_lab.analysis.versus import modeled_vs_measured
from dsa_lab.plots.style import point_columns, shade_speedups
from dsa_lab.plots.tables import FoldedTable, folded, top_rows


def style_comparison(table: pd.DataFrame) -> FoldedTable:
    """The comparison for display: times in µs, speedups (the other side's time over the candidate's, as in the
    heatmaps) shaded (blue: the candidate wins); the points where the candidate gains most over vLLM's path on
    top, every point folded below (`plots.tables`)."""
    names = {
        "candidate_ms": "candidate µs",
        "floor_pct": "floor share",
        "vllm_strategy": "vLLM 0.33 takes",
        "vllm_ms": "vLLM µs",
        "speedup_vs_vllm": "vLLM / candidate",
        "best_strategy": "best option",
        "best_backend": "its kernel",
        "best_ms": "best µs",
        "speedup_vs_best": "best / candidate",
    }
    shown = table[[*point_columns(table), *names]].rename(columns=names)
    shown = shown.assign(
        context=shown["context"].map(context_title),
        **{c: shown[c] * 1e3 for c in ("candidate µs", "vLLM µs", "best µs")},
    )
    speedups = ["vLLM / candidate", "best / candidate"]

    def style(rows: pd.DataFrame) -> Styler:
        styled = rows.style.format(
            {
                **dict.fromkeys(["candidate µs", "vLLM µs", "best µs"], "{:.1f}"),
                "floor share": "{:.0f}%",
                **dict.fromkeys(speedups, "{:.2f}×"),
            },
            na_rep="—",
            escape="html",
        )
        return shade_speedups(styled, speedups).hide(axis="index")

    return top_rows(shown, style, ["vLLM / candidate"], "points where the candidate gains most over vLLM's path")


def style_outcomes(results: pd.DataFrame) -> FoldedTable:
    """What became of a run's points: per backend how many were timed and skipped, and per backend, strategy
    and outcome with its message (why a point was not timed), folded."""
    counts = results.groupby(["backend", "status"]).size().unstack("status", fill_value=0).reset_index()
    message = results["message"].fillna("") if "message" in results else pd.Series("", index=results.index)
    full = (
        results.assign(message=message)
        .groupby(["backend", "strategy", "status", "message"], sort=False)
        .size()
        .rename("points")
        .reset_index()
    )

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format(escape="html").hide(axis="index")

    return FoldedTable(counts, full, style, "Points per backend and outcome")


def style_modeled_vs_measured(
    frame: pd.DataFrame, batch: int, context: str, candidate: tuple[str, str], baseline: str | Sequence[str] | None
) -> FoldedTable:
    """`analysis.versus.modeled_vs_measured` at (batch, context) for display, folded under one line: the
    chart draws the same times; values to 0.1 µs, headers (backend names from the run) escaped."""

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format("{:.1f}", na_rep="—").format_index(escape="html", axis=1)

    table = modeled_vs_measured(frame, batch, context, candidate, baseline)
    return folded(table, style, "The modeled and measured times the chart draws (µs)")


def style_ragged(table: pd.DataFrame) -> FoldedTable:
    """`analysis.workloads.ragged_kernels` for display, folded under one line: the reading above says what it
    holds; every value formatted and escaped."""

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format(precision=2, na_rep="—", escape="html").hide(axis="index")

    return folded(table, style, "The candidate against each kernel's fastest option, every ragged point")
