"""Kernel profiles as charts: device time per strategy, DRAM bytes against unique KV, tensor-pipe use.

Every chart carries a caption naming the device and the run it came from; bytes that
come from the cost model rather than a counter are drawn apart and labelled 'modeled'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dsa_lab.metadata import STRATEGIES
from dsa_lab.profiling.step import PHASES
from dsa_lab.profiling.torch_profile import OUTSIDE_PHASES

PHASE_ORDER = (*PHASES, OUTSIDE_PHASES)
PHASE_COLORS = dict(zip(PHASE_ORDER, sns.color_palette("colorblind", len(PHASE_ORDER))))
STRATEGY_COLORS = dict(zip(STRATEGIES, sns.color_palette("deep", len(STRATEGIES))))


def provenance_caption(provenance: Mapping[str, Any]) -> str:
    """'measured on NVIDIA H200 | run profile-... | 2026-11-29 | git 1a2b3c4' (device first, always)."""
    git = provenance.get("git") or {}
    sha = (git.get("sha") or "")[:7]
    parts = [
        f"{provenance.get('source', 'measured')} on {provenance.get('device_name', provenance.get('device', '?'))}",
        f"run {provenance.get('run_id', '?')}",
        str(provenance.get("created", ""))[:10],
        f"git {sha}{'+dirty' if git.get('dirty') else ''}" if sha else "",
    ]
    return " | ".join(p for p in parts if p)


def _caption(fig: Figure, caption: str) -> None:
    """Provenance under the figure (inline and saved figures use a tight box, so it stays visible)."""
    fig.text(0.0, -0.01, caption, fontsize=7, color="0.35", ha="left", va="top")


def plot_kernel_timeline(kernels: pd.DataFrame, caption: str, batch: int, next_n: int) -> Figure:
    """Each strategy's step as its kernels back to back in launch order, coloured by phase.

    Gaps between kernels are left out and repeated launches of one kernel are merged, so
    a bar's length is the step's device time (host-op time on a CPU run).
    """
    chosen = kernels[(kernels["batch"] == batch) & (kernels["next_n"] == next_n)]
    if chosen.empty:
        raise ValueError(f"kernels: no rows for batch={batch}, next_n={next_n}")
    rows = list(chosen.groupby(["backend", "strategy"], sort=False))
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.55 * len(rows)), constrained_layout=True)
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
                linewidth=0.4,
            )
            start += record.total_us
        calls = int(frame["launches"].iloc[0]) if "launches" in frame else 0
        labels.append(f"{backend} {strategy} ({calls} logits call{'s' if calls != 1 else ''})")
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    unit = "host µs (CPU ops)" if (chosen["device_name"] == "cpu").all() else "device µs"
    ax.set_xlabel(f"{unit}, kernels in launch order, gaps removed")
    ax.set_title(f"One decode step per strategy, B={batch}, next_n={next_n}")
    present = [p for p in PHASE_ORDER if p in set(chosen["phase"])]
    ax.legend(handles=[Patch(color=PHASE_COLORS[p], label=p) for p in present], loc="lower right", fontsize=8)
    _caption(fig, caption)
    return fig


def plot_phase_time(kernels: pd.DataFrame, caption: str) -> Figure:
    """Time per phase for every strategy and next_n (one panel per backend and batch size)."""
    per_phase = kernels.groupby(["backend", "batch", "next_n", "strategy", "phase"], as_index=False)["total_us"].sum()
    grid = sns.catplot(
        data=per_phase, kind="bar", x="next_n", y="total_us", hue="phase", hue_order=[p for p in PHASE_ORDER if p in set(per_phase["phase"])],
        col="strategy", col_order=[s for s in STRATEGIES if s in set(per_phase["strategy"])], row="backend",
        palette=PHASE_COLORS, height=2.8, aspect=1.1, errorbar=None,
    )  # fmt: skip
    grid.set_titles("{row_name} | {col_name}")
    grid.set_axis_labels("next_n", "time per step (µs)")
    grid.figure.suptitle("Where a decode step spends its time, by phase", y=1.02)
    _caption(grid.figure, caption)
    return grid.figure


def plot_dram_vs_unique(summary: pd.DataFrame, caption: str, batch: int) -> Figure:
    """Measured DRAM bytes read per unique KV byte, beside the modeled re-read factor (one row per backend).

    1.0 means the KV cache came from DRAM once. Where the model says flatten reads n
    times the KV but the counter shows far less, the L2 absorbed the re-reads.
    """
    chosen = summary[summary["batch"] == batch]
    if chosen.empty:
        raise ValueError(f"summary: no rows for batch={batch}")
    measured = chosen.assign(kind="measured (ncu dram__bytes_read)")
    modeled = chosen.assign(
        dram_read_per_unique=chosen["strategy_kv_bytes"] / chosen["unique_kv_bytes"], kind="modeled re-reads (no cache)"
    )
    data = pd.concat([measured, modeled], ignore_index=True)
    grid = sns.catplot(
        data=data, kind="bar", x="next_n", y="dram_read_per_unique", hue="strategy",
        hue_order=[s for s in STRATEGIES if s in set(data["strategy"])], col="kind", row="backend",
        palette=STRATEGY_COLORS, height=3.0, aspect=1.3, errorbar=None, sharey=True,
    )  # fmt: skip
    for ax in grid.axes.flat:
        ax.axhline(1.0, color="0.2", linestyle="--", linewidth=0.8)
    grid.set_titles("{row_name} | {col_name}")
    grid.set_axis_labels("next_n", "KV bytes read / unique KV bytes")
    grid.figure.suptitle(f"DRAM reads against the unique KV bytes, B={batch} (dashed: each token once)", y=1.02)
    _caption(grid.figure, caption)
    return grid.figure


def plot_modeled_reread(modeled: pd.DataFrame, caption: str) -> Figure:
    """The modeled re-read factor alone, for runs without counters (labelled modeled)."""
    fig, ax = plt.subplots(figsize=(6, 3.2), constrained_layout=True)
    sns.barplot(data=modeled, x="next_n", y="kv_read_per_unique", hue="strategy", palette=STRATEGY_COLORS, ax=ax)
    ax.axhline(1.0, color="0.2", linestyle="--", linewidth=0.8)
    ax.set_ylabel("KV bytes read / unique (modeled)")
    ax.set_title("Modeled KV reads per unique KV byte (no L2, plan.LaunchPlan)")
    _caption(fig, caption)
    return fig


def tensor_column(summary: pd.DataFrame) -> str:
    """The tensor-pipe metric this run has numbers for (Hopper: GMMA; older GPUs: HMMA)."""
    for column in ("tensor_gmma_pct", "tensor_hmma_pct"):
        if column in summary and summary[column].notna().any():
            return column
    raise ValueError("summary: no tensor-pipe utilisation in this run (both metrics n/a)")


def plot_tensor_pipe(summary: pd.DataFrame, caption: str) -> Figure:
    """Tensor-pipe utilisation (time-weighted over the logits kernels) against next_n."""
    column = tensor_column(summary)
    grid = sns.relplot(
        data=summary, kind="line", x="next_n", y=column, hue="strategy", style="backend", col="batch",
        hue_order=[s for s in STRATEGIES if s in set(summary["strategy"])], palette=STRATEGY_COLORS,
        markers=True, height=3.0, aspect=1.2,
    )  # fmt: skip
    grid.set_titles("B={col_name}")
    grid.set(xticks=sorted(summary["next_n"].unique()))
    grid.set_axis_labels("next_n", f"{column.split('_')[1].upper()} tensor pipe, % of peak (active)")
    grid.figure.suptitle("Tensor-pipe utilisation of the logits kernels", y=1.02)
    _caption(grid.figure, caption)
    return grid.figure
