"""Kernel profiles as charts: device time per strategy, DRAM bytes against unique KV, tensor-pipe use.

Every chart of a profile carries the run's provenance as a footer (`plots.style`); a
strategy keeps its colour and a backend its marker as everywhere else; bytes that come
from the cost model rather than a counter are hatched and labelled 'modeled'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dsa_lab import axes
from dsa_lab.analysis.labels import context_title
from dsa_lab.analysis.profiles import PHASE_ORDER, tensor_column, tensor_pipe_label
from dsa_lab.plots.style import (
    MODELED,
    MODELED_HATCH,
    PART_PALETTE,
    STRATEGY_ORDER,
    add_footer,
    backend_marker,
    legend_outside,
    provenance_line,
    strategy_color,
)

PHASE_COLORS = dict(zip(PHASE_ORDER, PART_PALETTE))  # no strategy's colour (`style.PART_PALETTE`)


def provenance_caption(provenance: Mapping[str, Any]) -> str:
    """'measured on NVIDIA H200 | run profile-… | 2026-11-29 | git 1a2b3c4 | torch …' (`style.provenance_line`)."""
    return provenance_line(provenance)


def _strategies(frame: pd.DataFrame) -> list[str]:
    return [s for s in STRATEGY_ORDER if s in set(frame["strategy"])]


def plot_kernel_timeline(kernels: pd.DataFrame, caption: str, batch: int, next_n: int) -> Figure:
    """Each strategy's step as its kernels back to back in launch order, coloured by phase.

    Gaps between kernels are left out and repeated launches of one kernel are merged, so
    a bar's length is the step's device time (host-op time on a CPU run). Row labels take
    the strategy's colour.
    """
    chosen = kernels[(kernels["batch"] == batch) & (kernels["next_n"] == next_n)]
    if chosen.empty:
        raise ValueError(f"kernels: no rows for batch={batch}, next_n={next_n}")
    rows = list(chosen.groupby(["backend", "strategy"], sort=False))
    fig, ax = plt.subplots(figsize=(11, 1.1 + 0.55 * len(rows)), constrained_layout=True)
    labels = []
    for y, ((backend, strategy), frame) in enumerate(rows):
        start = 0.0
        for record in frame.sort_values("first_start_us").itertuples():
            ax.barh(
                y,
                record.total_us,
                left=start,
                color=PHASE_COLORS.get(record.phase, "0.5"),
                edgecolor="white",
                linewidth=0.4 if record.total_us > 0.02 * frame["total_us"].sum() else 0,
            )
            start += record.total_us
        calls = int(frame["launches"].iloc[0]) if "launches" in frame else 0
        labels.append(f"{backend} {strategy} ({calls} logits call{'s' if calls != 1 else ''})")
    ax.set_yticks(range(len(rows)), labels)
    for tick, ((_, strategy), _) in zip(ax.get_yticklabels(), rows):
        tick.set_color(strategy_color(strategy))
    ax.invert_yaxis()
    unit = "host µs (CPU ops)" if (chosen["device_name"] == "cpu").all() else "device µs"
    ax.set_xlabel(f"{unit}, kernels in launch order, gaps removed")
    ax.set_title(f"One decode step per strategy, B={batch}, next_n={next_n} (row labels: strategy colour)")
    present = [p for p in PHASE_ORDER if p in set(chosen["phase"])]
    legend_outside(ax, [Patch(color=PHASE_COLORS[p]) for p in present], present, title="phase")
    return add_footer(fig, caption)


def plot_phase_time(kernels: pd.DataFrame, caption: str, batch: int | None = None) -> Figure:
    """Time per phase for every strategy and next_n at one batch size (the largest profiled by
    default): a panel per backend and strategy, one y scale."""
    batch = int(kernels["batch"].max()) if batch is None else batch
    chosen = kernels[kernels["batch"] == batch]
    if chosen.empty:
        raise ValueError(f"kernels: no rows for batch={batch}")
    per_phase = chosen.groupby([*axes.OPTION_KEYS, "next_n", "phase"], as_index=False)["total_us"].sum()
    strategies = _strategies(per_phase)
    grid = sns.catplot(
        data=per_phase,
        kind="bar",
        x="next_n",
        y="total_us",
        hue="phase",
        hue_order=[p for p in PHASE_ORDER if p in set(per_phase["phase"])],
        col="strategy",
        col_order=strategies,
        row="backend",
        palette=PHASE_COLORS,
        height=2.8,
        aspect=1.2,
        errorbar=None,
    )
    grid.set_titles("{row_name} | {col_name}")
    for ax in grid.axes.flat:
        strategy = ax.get_title().split(" | ")[-1]
        ax.title.set_color(strategy_color(strategy))
    grid.set_axis_labels("next_n", "time per step (µs)")
    grid.figure.suptitle(f"Where a decode step spends its time, by phase, B = {batch}", y=1.03)
    return add_footer(grid.figure, caption)


def plot_dram_vs_unique(summary: pd.DataFrame, caption: str, batches: Sequence[int] | None = None) -> Figure:
    """Measured DRAM bytes read per unique KV byte (solid bars) over the modeled re-read factor
    with no cache (hatched outline behind each bar): a panel per backend (rows) and batch
    (columns), one y scale.

    1.0 means the KV cache came from DRAM once. Where the model says flatten reads next_n
    times the KV but the solid bar stays near 1, the L2 absorbed the re-reads.
    """
    batches = sorted(int(b) for b in summary["batch"].unique()) if batches is None else list(batches)
    chosen = summary[summary["batch"].isin(batches)]
    if chosen.empty:
        raise ValueError(f"summary: no rows for batch in {batches}")
    backends = sorted(chosen["backend"].unique())
    strategies = _strategies(chosen)
    next_ns = sorted(chosen["next_n"].unique())
    fig, axes = plt.subplots(
        len(backends),
        len(batches),
        figsize=(4.6 * len(batches) + 2.5, 2.9 * len(backends) + 0.8),
        sharex=True,
        sharey=True,
        squeeze=False,
        constrained_layout=True,
    )
    width = 0.8 / len(strategies)
    for (i, backend), (j, batch) in ((r, c) for r in enumerate(backends) for c in enumerate(batches)):
        ax = axes[i, j]
        part = chosen[(chosen["backend"] == backend) & (chosen["batch"] == batch)]
        for k, strategy in enumerate(strategies):
            rows = part[part["strategy"] == strategy].set_index("next_n").reindex(next_ns)
            x = np.arange(len(next_ns)) + (k - (len(strategies) - 1) / 2) * width
            colour = strategy_color(strategy)
            ax.bar(
                x,
                rows["strategy_kv_bytes"] / rows["unique_kv_bytes"],
                width,
                facecolor="none",
                edgecolor=colour,
                hatch=MODELED_HATCH,
                linewidth=0.8,
            )
            ax.bar(x, rows["dram_read_per_unique"], width * 0.62, color=colour)
        ax.axhline(1.0, color="0.2", linestyle=":", linewidth=0.9)
        ax.set_title(f"{backend}, B = {batch}", fontsize=10)
        ax.set_xticks(np.arange(len(next_ns)), [str(n) for n in next_ns])
        if i == len(backends) - 1:
            ax.set_xlabel("next_n")
        if j == 0:
            ax.set_ylabel("KV bytes read / unique KV bytes")
    handles = [Patch(color=strategy_color(s)) for s in strategies]
    labels = [f"{s}: measured (ncu dram__bytes_read)" for s in strategies]
    handles += [
        Patch(facecolor="none", edgecolor="0.3", hatch=MODELED_HATCH),
        plt.Line2D([], [], color="0.2", linestyle=":"),
    ]
    labels += [f"{MODELED}: every re-read from DRAM (no cache; plan.LaunchPlan)", "each KV token read once"]
    legend_outside(fig, handles, labels)
    context = ", ".join(sorted({context_title(str(c)) for c in chosen["context"]})) if "context" in chosen else "?"
    fig.suptitle(f"DRAM reads of the logits kernels against the unique KV bytes, context {context}")
    return add_footer(fig, caption)


def plot_modeled_reread(modeled: pd.DataFrame, caption: str) -> Figure:
    """The modeled re-read factor alone, for runs without counters (hatched, labelled modeled)."""
    fig, ax = plt.subplots(figsize=(8, 3.4), constrained_layout=True)
    strategies = _strategies(modeled)
    next_ns = sorted(modeled["next_n"].unique())
    width = 0.8 / len(strategies)
    for k, strategy in enumerate(strategies):
        rows = modeled[modeled["strategy"] == strategy].set_index("next_n").reindex(next_ns)
        x = np.arange(len(next_ns)) + (k - (len(strategies) - 1) / 2) * width
        ax.bar(
            x,
            rows["kv_read_per_unique"],
            width,
            facecolor="white",
            edgecolor=strategy_color(strategy),
            hatch=MODELED_HATCH,
            label=f"{strategy}, {MODELED}",
        )
    ax.set_xticks(np.arange(len(next_ns)), [str(n) for n in next_ns])
    ax.axhline(1.0, color="0.2", linestyle=":", linewidth=0.9)
    ax.set(xlabel="next_n", ylabel=f"KV bytes read / unique ({MODELED})")
    ax.set_title(f"KV reads per unique KV byte, {MODELED} (no L2; plan.LaunchPlan), not measured")
    legend_outside(ax)
    return add_footer(fig, caption)


def plot_tensor_pipe(summary: pd.DataFrame, caption: str, provenance: Mapping[str, Any] | None = None) -> Figure:
    """Tensor-pipe utilisation (time-weighted over the logits kernels) against next_n: colour
    strategy, marker backend, a panel per batch on one y scale."""
    column = tensor_column(summary)
    batches = sorted(summary["batch"].unique())
    fig, axes = plt.subplots(
        1, len(batches), figsize=(4.6 * len(batches) + 3, 4.6), sharey=True, squeeze=False, constrained_layout=True
    )
    for ax, batch in zip(axes[0], batches):
        part = summary[summary["batch"] == batch]
        for (backend, strategy), rows in part.groupby(["backend", "strategy"]):
            rows = rows.sort_values("next_n")
            ax.plot(
                rows["next_n"],
                rows[column],
                color=strategy_color(strategy),
                marker=backend_marker(backend),
                linewidth=1.6,
                label=f"{strategy} ({backend})",
            )
        ax.set_title(f"B = {batch}", fontsize=10)
        ax.set_xticks(sorted(summary["next_n"].unique()))
        ax.set_xlabel("next_n")
    axes[0, 0].set_ylabel("tensor pipe busy (% of peak)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    order = sorted(
        range(len(labels)), key=lambda i: (labels[i].split("(")[-1], STRATEGY_ORDER.index(labels[i].split(" ")[0]))
    )
    legend_outside(fig, [handles[i] for i in order], [labels[i] for i in order], title="strategy (backend)")
    fig.suptitle(
        "Tensor-pipe utilisation of the logits kernels, share of active cycles (Nsight Compute, measured)\n"
        + tensor_pipe_label(summary, provenance),
        fontsize=10.5,
    )
    return add_footer(fig, caption)
