"""Kernel latency against next_n: the charts of notebook 02 and its decision table for display.

Input is a run's results frame (`dsa_lab.store.folders.load_run(...).results`); only rows with
status 'ok' are drawn, and one shape (heads, head_dim, cache dtype) at a time. The look is
the project's (`plots.style`): a strategy keeps its colour and a backend its marker in every
chart; measured and modeled rows (roofline times, built by `dsa_lab.analysis.modeled`) never
share a chart or a colour scale, and modeled ones say so. The frames come from
`dsa_lab.analysis.frames`; nothing here times or models anything.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator, NullLocator
from pandas.io.formats.style import Styler

from dsa_lab import axes
from dsa_lab.analysis.frames import SM90_DEEPGEMM, context_order, speedup_over_strategy, speedup_over_vllm, vllm_path
from dsa_lab.analysis.labels import context_title
from dsa_lab.analysis.readings import DECISIONS_NAMED
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.kernels import vllm_backend
from dsa_lab.plots.style import (
    ANNOTATION_SIZE,
    MAX_WIDTH,
    MODELED,
    MODELED_CMAP,
    MODELED_HATCH,
    SPEEDUP_CMAP,
    STRATEGY_ORDER,
    VLLM_MARKER,
    VLLM_RELEASE,
    add_footer,
    chart_text,
    legend_outside,
    point_columns,
    series_label,
    series_style,
    shade_speedups,
    speedup_norm,
    strategy_color,
)
from dsa_lab.plots.tables import FoldedTable, folded, top_rows
from dsa_lab.policy.vllm import Platform

SPEEDUP_TICKS = (0.25, 0.33, 0.5, 0.67, 1.0, 1.5, 2.0, 3.0, 4.0)


def few_contexts(labels: Sequence[str], focus: str | None = None) -> list[str]:
    """The columns of the small multiples: the shortest uniform context, `focus` (else the
    longest uniform one) and every mixed one."""
    ordered = context_order(labels)
    uniform = [c for c in ordered if not ContextSpec.parse(c).mixed]
    focus = ContextSpec.parse(focus).label if focus else None
    chosen = [uniform[0], focus if focus in uniform else uniform[-1]] if uniform else []
    return list(dict.fromkeys([*chosen, *(c for c in ordered if ContextSpec.parse(c).mixed)]))


def plot_vs_vllm(
    frame: pd.DataFrame,
    device: str,
    provenance_line: str | None = None,
    backend: str | None = None,
    contexts: Sequence[str] | None = None,
    platform: Platform = SM90_DEEPGEMM,
) -> Figure:
    """Small multiples (rows: batch, columns: `contexts`) of every measured series' speedup
    over what vLLM 0.33 runs at the same point (its strategy, timed on `backend`; None: what vLLM
    runs), on one shared log scale: above 1 the series is faster than vLLM's choice, below it slower."""
    backend = vllm_backend().name if backend is None else backend
    data = speedup_over_vllm(frame, backend, platform).dropna(subset=["speedup"])
    if data.empty:
        raise ValueError(f"frame: no measured point has vLLM's strategy timed on backend={backend!r}")
    contexts = list(contexts) if contexts else context_order(data["context"])
    data = data[data["context"].isin(contexts)]
    batches = sorted(int(b) for b in data["batch"].unique())
    fig, axes = plt.subplots(
        len(batches),
        len(contexts),
        figsize=(3.3 * len(contexts) + 2.6, max(4.5, 1.55 * len(batches) + 1)),
        sharex=True,
        sharey=True,
        squeeze=False,
        constrained_layout=True,
    )
    series = sorted(data.groupby(["strategy", "backend"]).groups, key=lambda k: (k[1], STRATEGY_ORDER.index(k[0])))
    for (i, batch), (j, context) in ((r, c) for r in enumerate(batches) for c in enumerate(contexts)):
        ax = axes[i, j]
        part = data[(data["batch"] == batch) & (data["context"] == context)]
        ax.axhline(1.0, color="black", linewidth=1.2, zorder=1)
        for strategy, name in series:
            rows = part[(part["strategy"] == strategy) & (part["backend"] == name)].sort_values("next_n")
            ax.plot(
                rows["next_n"],
                rows["speedup"],
                markersize=4.5,
                linewidth=1.6,
                label=series_label(strategy, name),
                **series_style(strategy, name),
            )
        if i == 0:
            ax.set_title(f"context {context_title(context)}", fontsize=10)
        if j == 0:
            ax.set_ylabel(f"B = {batch}", fontsize=10)
        if part.empty:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="0.5")
    low, high = data["speedup"].min(), data["speedup"].max()
    ticks = [t for t in SPEEDUP_TICKS if low / 1.2 <= t <= high * 1.2]
    axes[0, 0].set_yscale("log", base=2)
    axes[0, 0].set_ylim(min(low, 0.9) / 1.1, max(high, 1.1) * 1.1)
    axes[0, 0].yaxis.set_major_locator(FixedLocator(ticks))
    axes[0, 0].yaxis.set_minor_locator(NullLocator())
    axes[0, 0].set_yticklabels([f"{t:g}×" for t in ticks])
    axes[0, 0].set_xticks(sorted(data["next_n"].unique()))
    fig.supxlabel("next_n (query rows per request)", fontsize=10)
    fig.supylabel(f"speedup over {VLLM_RELEASE}'s choice (×, log scale)", fontsize=10)
    entries = {label: handle for ax in axes.flat for handle, label in zip(*ax.get_legend_handles_labels())}
    handles = [*entries.values(), plt.Line2D([], [], color="black", linewidth=1.2)]
    labels = [*entries, f"{VLLM_RELEASE}'s choice ({backend}), = 1"]
    legend_outside(fig, handles, labels, title="strategy (backend)")
    fig.suptitle(
        f"Speedup over what {VLLM_RELEASE} runs, measured on {chart_text(device)}\n"
        "one y scale for every panel; above the black line: faster"
    )
    return add_footer(fig, provenance_line)


def plot_speedup(
    frame: pd.DataFrame,
    device: str,
    baseline: str = "flatten",
    provenance_line: str | None = None,
    source: str = "measured",
) -> Figure:
    """Heatmaps of the speedup over `baseline` for one `source` (measured or modeled: never on
    one colour scale), a panel per (backend, strategy): rows batch x context, columns next_n;
    blue = faster than `baseline`, red = slower (`style.SPEEDUP_CMAP`, centred at 1)."""
    table = speedup_over_strategy(frame, baseline)
    table = table[table["source"] == source]
    if table.empty:
        raise ValueError(f"frame: no {source} point has both '{baseline}' and another strategy timed ok")
    panels = list(table.groupby(["backend", "strategy"], sort=True))
    panels.sort(key=lambda kv: (kv[0][0], STRATEGY_ORDER.index(kv[0][1])))
    norm = speedup_norm(table["speedup"])
    contexts = context_order(table["context"])
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    width = min(MAX_WIDTH, columns * (3.2 + 0.5 * table["next_n"].nunique()) + 1.5)
    height = max(3.8, rows * (1.3 + 0.17 * table.groupby(["batch", "context"]).ngroups))
    fig, axes = plt.subplots(rows, columns, figsize=(width, height), squeeze=False, constrained_layout=True)
    for index, (ax, ((backend, strategy), part)) in enumerate(zip(axes.flat, panels)):
        grid = part.pivot_table(index=["batch", "context"], columns="next_n", values="speedup")
        order = [(b, c) for b in sorted(part["batch"].unique()) for c in contexts if (b, c) in grid.index]
        grid = grid.reindex(order)
        grid.index = [f"B={b}, {context_title(c)}" for b, c in grid.index]
        sns.heatmap(
            grid,
            annot=True,
            fmt=".2f",
            cmap=SPEEDUP_CMAP,
            norm=norm,
            ax=ax,
            linewidths=0.5,
            linecolor="white",
            cbar=False,
            annot_kws={"fontsize": ANNOTATION_SIZE},
            yticklabels=index % columns == 0,
        )
        label = series_label(strategy, backend, source)
        ax.set_title(f"{label}\nvs {baseline}", color=strategy_color(strategy), fontsize=10)
        ax.set_xlabel("next_n")
        ax.set_ylabel("batch, context" if index % columns == 0 else "")
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    what = f"{source} speedup over {baseline} (×)" + (" — roofline model, not measured" if source == MODELED else "")
    fig.colorbar(axes.flat[0].collections[0], ax=axes, label=what, shrink=0.8)
    title = (
        f"Speedup over {baseline} on {chart_text(device)}, {source}"
        + (" (roofline at the run's ceilings; its own colour scale)" if source == MODELED else "")
        + "; empty cells: not run or skipped"
    )
    fig.suptitle(title)
    return add_footer(fig, provenance_line)


def plot_modeled_speedup(frame: pd.DataFrame, device: str, baseline: str = "flatten") -> Figure:
    """The roofline model's speedup over `baseline` on a colour scale of its own, cells hatched:
    a row per (model, strategy), columns next_n, each cell the median over the batch x context
    points modeled (the title gives the largest spread among them)."""
    table = speedup_over_strategy(frame, baseline)
    table = table[table["source"] == MODELED]
    if table.empty:
        raise ValueError(f"frame: no modeled point has both '{baseline}' and another strategy")
    keys = [*axes.OPTION_KEYS, "next_n"]
    spread = float(table.groupby(keys)["speedup"].agg(lambda s: s.max() - s.min()).max())
    grid = table.pivot_table(index=["backend", "strategy"], columns="next_n", values="speedup", aggfunc="median")
    grid = grid.reindex(sorted(grid.index, key=lambda k: (k[0], STRATEGY_ORDER.index(k[1]))))
    rows = list(grid.index)
    names = [backend.removeprefix("model (").removesuffix(")") for backend, _ in rows]  # 'B200, deepgemm'
    grid.index = [f"{strategy} · {name} ({MODELED})" for (_, strategy), name in zip(rows, names)]
    fig, ax = plt.subplots(figsize=(4.5 + 0.8 * grid.shape[1], max(2.9, 1.6 + 0.5 * len(grid))), layout="constrained")
    sns.heatmap(
        grid,
        annot=True,
        fmt=".2f",
        cmap=MODELED_CMAP,
        vmin=1.0,
        ax=ax,
        linewidths=0.5,
        linecolor="white",
        cbar_kws={"label": f"{MODELED} speedup (×)"},
    )
    for (y, x), value in np.ndenumerate(grid.to_numpy()):
        if np.isfinite(value):
            ax.add_patch(
                Rectangle((x, y), 1, 1, fill=False, hatch=MODELED_HATCH, edgecolor=(1, 1, 1, 0.3), linewidth=0)
            )
    for tick, (_, strategy) in zip(ax.get_yticklabels(), rows):
        tick.set_color(strategy_color(strategy))
        tick.set_rotation(0)
    ax.grid(False)
    ax.set(xlabel="next_n", ylabel="")
    points = table.groupby(["batch", "context"]).ngroups
    gpus = ", ".join(dict.fromkeys(name.split(",")[0] for name in names))
    ax.set_title(
        f"Speedup over {baseline}, {MODELED} at {gpus} ceilings, not measured\n"
        f"median over the {points} batch × context points of {chart_text(device)} (they differ by ≤ {spread:.2f})",
        fontsize=10,
    )
    return fig


def style_decisions(table: pd.DataFrame) -> FoldedTable:
    """`analysis.frames.decisions` for display: times in µs, vLLM's choice beside the fastest strategy
    and the one to use (a tie within the measured spread keeps vLLM's), the speedup shaded; the points
    where vLLM's choice loses most on top, every point folded below (`plots.tables`)."""
    shown = pd.DataFrame(
        {
            **{k: table[k].map(context_title) if k == "context" else table[k] for k in point_columns(table)},
            "source": table["source"],
            "vLLM 0.33 takes": table["vllm_strategy"],
            "vLLM µs": table["vllm_ms"] * 1e3,
            "fastest": table["best_strategy"],
            "fastest µs": table["best_ms"] * 1e3,
            "speedup": table["speedup"],
            "beyond the spread": table["beyond_spread"].map({True: "yes", False: "no"}),
            "recommended": table["recommended_strategy"],
        }
    )

    def style(rows: pd.DataFrame) -> Styler:
        styled = rows.style.format(
            {"vLLM µs": "{:.1f}", "fastest µs": "{:.1f}", "speedup": "{:.2f}×"}, na_rep="—", escape="html"
        )
        return shade_speedups(styled, ["speedup"]).hide(axis="index")

    what = "points where vLLM's choice is furthest from the fastest"
    return top_rows(shown, style, ["speedup"], what, top=DECISIONS_NAMED, tie_format="{:.2f}×")


def plot_point(
    point: pd.DataFrame,
    vllm_backend: str,
    title: str,
    caption: str | None = None,
    baseline: pd.DataFrame | None = None,
    speedups: bool = True,
) -> Figure:
    """The latency explorer's view of one point: left, median µs against next_n with IQR bars, vLLM's
    choice (its strategy on `vllm_backend`, from `baseline`: the point's rows before any were left out;
    default `point`) as hollow diamonds; right, the speedup over vLLM's choice (vLLM's time over the series').
    `caption`: the run's provenance, drawn under the figure. Without `speedups` (a CPU's wall clock) the left
    panel alone."""
    if speedups:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 4.6), layout="constrained")
    else:
        fig, left = plt.subplots(figsize=(8.5, 4.6), layout="constrained")
        right = None
    rows = point if baseline is None else baseline
    path = vllm_path(rows, vllm_backend).dropna(subset=["vllm_ms"])
    vllm_us = path.set_index("next_n")["vllm_ms"] * 1e3
    for (strategy, backend), part in sorted(
        point.groupby(["strategy", "backend"]), key=lambda kv: (STRATEGY_ORDER.index(kv[0][0]), kv[0][1])
    ):
        part = part.sort_values("next_n")
        style = series_style(strategy, backend)
        spread = [part["kernel_us"] - part["p25_ms"] * 1e3, part["p75_ms"] * 1e3 - part["kernel_us"]]
        label = series_label(strategy, backend)
        left.errorbar(part["next_n"], part["kernel_us"], yerr=spread, capsize=3, label=label, **style)
        if right is not None:
            right.plot(part["next_n"], part["next_n"].map(vllm_us) / part["kernel_us"], label=label, **style)
    if not path.empty:
        left.scatter(path["next_n"], vllm_us.to_numpy(), label=f"what {VLLM_RELEASE} runs", **VLLM_MARKER)
    elif right is not None:
        right.text(0.5, 0.5, f"{VLLM_RELEASE}'s choice was not timed here", ha="center", transform=right.transAxes)
    left.set(xlabel="next_n", ylabel="kernel time, µs (median, IQR bars)", title="latency")
    if right is not None:
        right.axhline(1.0, color="grey", lw=1)
        right.set(
            xlabel="next_n",
            ylabel=f"speedup: {VLLM_RELEASE}'s time / this time",
            title=f"speedup over {VLLM_RELEASE}'s choice (> 1: faster)",
        )
    handles, labels = left.get_legend_handles_labels()
    legend_outside(fig, handles, labels)
    fig.suptitle(title)
    return add_footer(fig, caption)


def style_verdicts(comparison: pd.DataFrame) -> FoldedTable:
    """`analysis.compare.compare_runs`' verdicts counted per backend, folded under the one line that totals
    them (the histogram above shows the ratios): escaped, backend names coming from the runs."""
    counts = comparison.groupby(["backend", "verdict"]).size().unstack("verdict", fill_value=0)
    totals = counts.sum().sort_values(ascending=False)
    what = f"compare's verdict at {int(totals.sum())} shared points: " + ", ".join(
        f"{verdict} {int(n)}" for verdict, n in totals.items()
    )

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format_index(escape="html", axis=0).format_index(escape="html", axis=1)

    return folded(counts, style, what)


def plot_run_to_run(
    comparison: pd.DataFrame, device: str, label_a: str, label_b: str, provenance_line: str | None = None
) -> Figure:
    """Distribution of the second run's median over the first's, per backend: the noise floor of every ratio."""
    data = comparison.assign(change_pct=(comparison["ratio"] - 1.0) * 100.0)
    backends = sorted(data["backend"].unique())
    greys = dict(zip(backends, sns.color_palette("Greys_r", len(backends) + 2)))
    fig, ax = plt.subplots(figsize=(10, 3.3), constrained_layout=True)
    sns.histplot(
        data=data,
        x="change_pct",
        hue="backend",
        hue_order=backends,
        palette=greys,
        multiple="stack",
        bins=40,
        ax=ax,
        legend=False,
        alpha=1.0,
    )
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"median of {label_b} vs {label_a} (%; > 0: second call slower)")
    ax.set_ylabel("points")
    handles = [plt.Rectangle((0, 0), 1, 1, color=greys[b]) for b in backends]
    legend_outside(ax, handles, backends, title="backend (stacked)")
    spread = data["change_pct"].abs()
    ax.set_title(
        f"{chart_text(device)}, measured: run-to-run spread over {len(data)} points "
        f"(median |change| {spread.median():.2f} %, max {spread.max():.2f} %)"
    )
    return add_footer(fig, provenance_line)
