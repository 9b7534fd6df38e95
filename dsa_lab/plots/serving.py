"""The answer per serving workload as grids: what to use at each (next_n, batch), uniform beside ragged.

Drawing only: the tables come from `dsa_lab.analysis.workloads` (`answers`, `reversals`). A cell's colour is
the strategy to use (the house colours: native blue, atom green, flatten red), its text the kernel and
vLLM 0.33's time over its (1.00×: vLLM's own choice kept); a cell whose answer differs from the first panel's is outlined in black.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from pandas.io.formats.style import Styler

from dsa_lab.plots.style import add_footer, chart_text, legend_outside, strategy_color
from dsa_lab.plots.tables import FoldedTable, folded

CELL_ALPHA = 0.55


def plot_answers(
    table: pd.DataFrame, workloads: Sequence[str], device: str, provenance_line: str | None = None
) -> Figure:
    """One panel per workload of `analysis.workloads.answers`: next_n down, batch across, the option to use."""
    if not workloads:
        raise ValueError("workloads: empty; name at least one workload of the table")
    grids = [table[table["workload"] == w].set_index(["next_n", "batch"]) for w in workloads]
    for workload, grid in zip(workloads, grids):
        if grid.empty:
            raise ValueError(f"workload={workload!r}: not in the table")
    next_ns = sorted({n for g in grids for n in g.index.get_level_values("next_n")})
    widths = [len(set(g.index.get_level_values("batch"))) for g in grids]
    fig, panels = plt.subplots(
        1,
        len(grids),
        figsize=(1.2 * len(grids) + 1.5 * sum(widths), 0.55 * len(next_ns) + 1.8),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"width_ratios": widths},
    )
    first = grids[0]["choice"]
    for ax, workload, grid in zip(panels[0], workloads, grids):
        batches = sorted(set(grid.index.get_level_values("batch")))
        for (n, b), row in grid.iterrows():
            x, y = batches.index(b), next_ns.index(n)
            ax.add_patch(Rectangle((x, y), 1, 1, color=strategy_color(row["recommended_strategy"]), alpha=CELL_ALPHA))
            if workload != workloads[0] and (n, b) in first.index and first[(n, b)] != row["choice"]:
                ax.add_patch(Rectangle((x + 0.04, y + 0.04), 0.92, 0.92, fill=False, edgecolor="black", linewidth=2))
            ax.text(x + 0.5, y + 0.5, f"{chart_text(row['recommended_backend'])}\n{row['gain']:.2f}×",
                    ha="center", va="center", fontsize=7)  # fmt: skip
        ax.set(xlim=(0, len(batches)), ylim=(len(next_ns), 0), xlabel="batch (requests)", ylabel="next_n")
        ax.set_xticks([i + 0.5 for i in range(len(batches))], [str(b) for b in batches])
        ax.set_yticks([i + 0.5 for i in range(len(next_ns))], [str(n) for n in next_ns])
        ax.set_title(chart_text(workload), fontsize=10)
        ax.grid(False)
    handles = [Patch(color=strategy_color(s), alpha=CELL_ALPHA) for s in ("native", "atom", "flatten")]
    handles.append(Patch(fill=False, edgecolor="black", linewidth=2))
    labels = ["native", "atom", "flatten", f"differs from {workloads[0]}"]
    legend_outside(fig, handles, [chart_text(x) for x in labels], where="below", ncols=4)
    fig.suptitle(
        f"The option to use per workload on {chart_text(device)} (measured; text: kernel, vLLM 0.33's time over its)",
        fontsize=11,
    )
    return add_footer(fig, provenance_line)


def style_answer_summary(summary: pd.DataFrame, drawn: Sequence[str]) -> FoldedTable:
    """`analysis.workloads.answer_summary` for display: the rows of the workloads the grids draw (`drawn`)
    above every workload's, folded; values formatted and escaped (workload labels come from the run)."""

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format({"best speedup": "{:.2f}×"}, escape="html").hide(axis="index")

    head = summary[summary["workload"].isin(drawn)]
    return FoldedTable(head, summary, style, "The workloads the grids below draw")


def style_reversal_counts(counts: pd.DataFrame) -> FoldedTable:
    """`analysis.workloads.reversal_counts` for display, folded under one line (the reading below says the same
    per pair in words); escaped, workload labels coming from the run."""

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format(escape="html").hide(axis="index")

    return folded(counts, style, "Cells per uniform and ragged pair, and where the answer differs")
