"""Issue 27's fused step against the best unfused one (logits, then vLLM's top-k), per batch size, with the issue's
goals: notebook 03's chart and table. Drawing only: the frame comes from `analysis.fused_step`."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from pandas.io.formats.style import Styler

from dsa_lab.analysis.fused_step import shown_columns
from dsa_lab.analysis.labels import axis_value_title
from dsa_lab.plots.style import FOOTER_STYLE, backend_color, backend_marker
from dsa_lab.plots.tables import FoldedTable, folded

UNFUSED_COLOR = "0.35"  # the unfused step: the line at 1
GOAL_COLOR = "#d62728"


def plot_fused_step(table: pd.DataFrame, footer: str = "") -> Figure:
    """One panel per next_n: at each batch size the fused step over the best unfused step (logits, then vLLM's
    top-k; below 1 the fused step is faster), issue 27's goal for it where it sets one (red ticks), and under each
    batch the best unfused step in µs. `table`: one context and timer of `analysis.fused_step.fused_step_table`."""
    panels = sorted(table["next_n"].unique())
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels) + 0.6, 3.6), squeeze=False, sharey=True)
    for ax, next_n in zip(axes[0], panels):
        panel = table[table["next_n"] == next_n].sort_values("batch")
        batches = list(dict.fromkeys(panel["batch"]))
        xs = {batch: i for i, batch in enumerate(batches)}
        for fused, rows in panel.groupby("fused", sort=False):
            ax.plot([xs[b] for b in rows["batch"]], rows["ratio"], color=backend_color(fused),
                    marker=backend_marker(fused), markersize=7, label=f"{fused}: its step / the best unfused step")  # fmt: skip
            for batch, ratio in zip(rows["batch"], rows["ratio"]):
                ax.annotate(f"{ratio:.2f}", (xs[batch], ratio), textcoords="offset points", xytext=(0, 7),
                            ha="center", fontsize=7)  # fmt: skip
        goals = panel.dropna(subset=["goal"]).drop_duplicates("batch")
        ax.scatter([xs[b] for b in goals["batch"]], goals["goal"], marker="_", s=400, color=GOAL_COLOR, zorder=3,
                   label="issue 27's goal (at most)")  # fmt: skip
        best = panel.drop_duplicates("batch").set_index("batch")["best_us"]
        ax.set_xticks(range(len(batches)), [f"{b}\n{best[b]:.0f} µs" for b in batches], fontsize=8)
        ax.axhline(1.0, color=UNFUSED_COLOR, linewidth=0.8, linestyle=":")
        ax.set_xlabel("B (the best unfused step)")
        ax.set_title(f"next_n = {next_n}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.1)  # a goal's tick is never drawn on the frame
    axes[0][0].set_ylabel("fused step / best unfused step")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, frameon=False)
    first = table.iloc[0]
    fig.text(0.01, 0.01, f"{axis_value_title('context', first['context'])}; timer {first['timer']}", fontsize=8)
    if footer:
        fig.text(0.99, 0.01, footer, ha="right", va="bottom", **FOOTER_STYLE)
    fig.tight_layout(rect=(0, 0.04, 1, 0.9))
    return fig


def style_fused_step(table: pd.DataFrame) -> FoldedTable:
    """`analysis.fused_step.fused_step_table` for display, folded: every workload, its ratio and goal; every value
    formatted and escaped."""

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format(precision=2, na_rep="—", escape="html").hide(axis="index")

    return folded(table[shown_columns(table)], style, "The fused step against the best unfused one, every workload")
