"""Issue 27's fused step against the best unfused one (logits, then vLLM's top-k), per batch size: notebook 03's
chart and table. Drawing only: the frame comes from `analysis.fused_step`."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from pandas.io.formats.style import Styler

from dsa_lab.analysis.labels import axis_value_title
from dsa_lab.plots.style import FOOTER_STYLE, backend_color, backend_marker
from dsa_lab.plots.tables import FoldedTable, folded

UNFUSED_COLOR = "0.35"


def plot_fused_step(table: pd.DataFrame, footer: str = "") -> Figure:
    """One panel per next_n: at each batch size the fused step and the best unfused step (µs, log scale), each
    fused point labelled with its ratio to the unfused one. `table`: one context and timer of
    `analysis.fused_step.fused_step_table`."""
    panels = sorted(table["next_n"].unique())
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels) + 0.6, 3.6), squeeze=False, sharey=True)
    for ax, next_n in zip(axes[0], panels):
        panel = table[table["next_n"] == next_n].sort_values("batch")
        best = panel.drop_duplicates("batch")
        ax.plot(best["batch"], best["best_us"], color=UNFUSED_COLOR, linestyle="--", marker="o", markersize=4,
                label="best unfused option + vLLM's top-k")  # fmt: skip
        for fused, rows in panel.groupby("fused", sort=False):
            ax.plot(rows["batch"], rows["fused_us"], color=backend_color(fused), marker=backend_marker(fused),
                    markersize=7, label=f"{fused} (fused step)")  # fmt: skip
            for batch, us, ratio in zip(rows["batch"], rows["fused_us"], rows["ratio"]):
                ax.annotate(f"{ratio:.2f}×", (batch, us), textcoords="offset points", xytext=(0, 7), ha="center",
                            fontsize=7)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(best["batch"]), [str(b) for b in best["batch"]])
        ax.set_xlabel("B (requests a step)")
        ax.set_title(f"next_n = {next_n}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("step time (µs)")
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

    shown = [c for c in ("context", "timer", "batch", "next_n", "fused", "fused_us", "best", "best_us", "ratio",
                         "goal", "met") if c in table]  # fmt: skip
    return folded(table[shown], style, "The fused step against the best unfused one, every workload")
