"""The tour's pictures (notebook 00): KV-tile reuse, modeled bytes, the headline measurement.

Drawing only: the numbers come from `dsa_lab.analysis.headline`. Colours and markers are
the project's (`plots.style`): a strategy keeps its colour, a backend its marker, and
vLLM 0.33's choice is a black diamond everywhere. Modeled charts say 'modeled' in their
title; measured ones name the device and the run.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from pandas.io.formats.style import Styler

from dsa_lab.analysis.frames import measured_ok
from dsa_lab.analysis.headline import TileReads
from dsa_lab.analysis.labels import context_title, pieces_title
from dsa_lab.markup import html_text
from dsa_lab.plots.style import (
    MODELED,
    MODELED_COLOR,
    MODELED_LINESTYLE,
    MODELED_MARKER,
    STRATEGY_COLORS,
    STRATEGY_ORDER,
    VLLM_MARKER,
    VLLM_RELEASE,
    add_footer,
    chart_text,
    legend_outside,
    series_label,
    series_style,
    shade_speedups,
)

NOT_SEEN = "#f0f0f0"
LABEL_BOX = {"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.9}


def _read_colours(count: int) -> ListedColormap:
    """Read #1 pale, later reads ever darker: a re-read should look expensive."""
    return ListedColormap([NOT_SEEN, *plt.get_cmap("YlOrRd")(np.linspace(0.12, 0.95, max(count, 1)))])


def plot_tile_reads(reads: Sequence[TileReads]) -> Figure:
    """One grid per strategy: query rows × KV tiles, each cell coloured and numbered by which
    read of that tile serves the row; a box around the rows one read serves."""
    if not reads:
        raise ValueError("reads: need at least one TileReads (see headline.tile_reads)")
    most = max(int(r.grid.max()) for r in reads)
    cmap, norm = _read_colours(most), BoundaryNorm(np.arange(-0.5, most + 1.5), most + 1)
    rows, tiles = reads[0].grid.shape
    size = (3.6 * len(reads) + 0.6, 0.55 * rows + 2.4)
    fig, axes = plt.subplots(1, len(reads), figsize=size, squeeze=False)
    for ax, read in zip(axes[0], reads):
        ax.imshow(read.grid, cmap=cmap, norm=norm, aspect="equal")
        for (j, t), value in np.ndenumerate(read.grid):
            if value:
                ax.text(
                    t,
                    j,
                    f"#{value}",
                    ha="center",
                    va="center",
                    fontsize=9,
                    color="white" if value > max(2, most * 0.55) else "black",
                )
        colour = STRATEGY_COLORS.get(read.strategy, "black")
        for group in read.groups:
            if group:
                ax.add_patch(
                    Rectangle(
                        (-0.45, min(group) - 0.45),
                        tiles - 0.1,
                        max(group) - min(group) + 0.9,
                        fill=False,
                        edgecolor=colour,
                        linewidth=2.2,
                    )
                )
        ax.set_xticks(np.arange(-0.5, tiles), minor=True)
        ax.set_yticks(np.arange(-0.5, rows), minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.grid(which="major", visible=False)
        ax.set_xticks(range(tiles), [str(t) for t in range(tiles)], fontsize=8.5)
        ax.set_yticks(range(rows), [f"row {j}" for j in range(rows)], fontsize=8.5)
        ax.set_xlabel("KV tile (64 cached tokens)", fontsize=9)
        ax.tick_params(which="both", length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        launches = f"{read.launches} launch{'es' if read.launches > 1 else ''}"
        if read.strategy == "flatten":
            launches += f" of {len(read.groups)} pseudo-requests"
        counted = f"{read.tile_reads} tile reads ({read.tile_reads / tiles:g} per tile)"
        ax.set_title(f"{read.label}\n{counted}\n{launches}", color=colour, fontsize=10.5)
    fig.suptitle(
        f"One request, {tiles} KV tiles of 64 tokens, next_n = {rows} query rows: "
        "which read of each tile scores each row",
        fontsize=11.5,
    )
    fig.text(
        0.5,
        0.01,
        "cell #k: the row is scored from the k-th time that tile is read from memory; a box: the rows one read serves",
        ha="center",
        fontsize=8.5,
        color="0.3",
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def plot_modeled_bytes(frame: pd.DataFrame, batch: int, context: str) -> Figure:
    """GB moved per decode step against next_n, a line per strategy, from `headline.modeled_bytes`;
    black diamonds: vLLM 0.33's path on SM90 + DeepGEMM."""
    if frame.empty or set(frame["source"]) != {"modeled"}:
        raise ValueError("frame: need the rows of headline.modeled_bytes (source 'modeled' only)")
    shape = frame.iloc[0]
    fig, ax = plt.subplots(figsize=(9, 5.2))
    labels = {
        "native": "native (one read per tile: our Triton kernel; DeepGEMM on SM100)",
        "atom": "atom (one read per native piece, pieces labelled)",
        "flatten": "flatten (one read per query row)",
    }
    atom = frame[frame["strategy"] == "atom"]
    whole = sorted(int(n) for n, pieces in zip(atom["next_n"], atom["pieces"]) if pieces == str(n))
    if whole:
        labels["atom"] += f"; = native at next_n {', '.join(map(str, whole))}"
    for strategy, part in frame.groupby("strategy", sort=False):
        part = part.sort_values("next_n")
        wide = strategy == "atom"  # a halo, so that native stays visible where the two coincide
        ax.plot(
            part["next_n"],
            part["bytes"] / 1e9,
            color=STRATEGY_COLORS[strategy],
            marker="o",
            linewidth=6 if wide else 2.2,
            alpha=0.45 if wide else 1.0,
            zorder=1 if wide else 2,
            label=labels.get(strategy, strategy),
        )
        for row in part.itertuples():
            if strategy == "atom" and row.launches > 1:
                ax.annotate(
                    row.pieces.split(" ")[0],
                    (row.next_n, row.bytes / 1e9),
                    xytext=(0, -14),
                    textcoords="offset points",
                    ha="center",
                    fontsize=8,
                    color=STRATEGY_COLORS[strategy],
                )
    last = frame[frame["next_n"] == frame["next_n"].max()].set_index("strategy")
    for strategy in ("flatten", "atom"):
        if strategy in last.index and last.loc[strategy, "vs_native"] > 1.01:
            point = (last.loc[strategy, "next_n"], last.loc[strategy, "bytes"] / 1e9)
            ax.annotate(
                f"{last.loc[strategy, 'vs_native']:.1f}× native",
                point,
                xytext=(8, 0),
                textcoords="offset points",
                va="center",
                fontsize=9,
                color=STRATEGY_COLORS[strategy],
                fontweight="bold",
            )
    vllm = frame[frame["vllm_0_33"]]
    ax.scatter(vllm["next_n"], vllm["bytes"] / 1e9, label="vLLM 0.33 on SM90 + DeepGEMM", **VLLM_MARKER)
    ax.set_xticks(sorted(frame["next_n"].unique()))
    ax.set_xlim(frame["next_n"].min() - 0.4, frame["next_n"].max() + 1.2)
    ax.set_ylim(0, None)
    ax.set(xlabel="next_n (query rows per request)", ylabel="GB moved per decode step (KV reads + q, weights, logits)")
    ax.legend(fontsize=8.5, loc="upper left", frameon=False)
    ax.set_title(
        f"Bytes one indexer step moves, modeled (dsa_lab.batch.plan.LaunchPlan.cost), not measured\n"
        f"B = {batch} requests, context {context_title(str(context))}, {shape['cache_dtype'].upper()} cache "
        f"({shape['bytes_per_token']} B/token), H = {shape['heads']}, D = {shape['head_dim']}",
        fontsize=10.5,
    )
    fig.tight_layout()
    return fig


def plot_headline(
    results: pd.DataFrame, table: pd.DataFrame, batch: int, context: str, device_label: str, provenance_line: str
) -> Figure:
    """Measured kernel time vs next_n at one point: a line per strategy (colour) and backend
    (marker), the kernel vLLM runs drawn bold; vLLM 0.33's choice as black diamonds; an arrow
    down to the best option where the gap is beyond the measured spread, labelled with the
    speedup; the time floor of the point (modeled) dashed grey; provenance in the footer.
    Arrows are drawn for GPU measurements only: a CPU stand-in's wall-clock gaps say nothing
    about which strategy a GPU should take, and a bold speedup would read as if they did."""
    data = measured_ok(results)
    data = data[(data["batch"] == batch) & (data["context"] == context)]
    if data.empty:
        raise ValueError(f"results: no measured rows with status 'ok' at batch={batch}, context={context!r}")
    fig, ax = plt.subplots(figsize=(12, 4.7), constrained_layout=True)
    next_ns = sorted(data["next_n"].unique())
    first = table["vllm_backend"].iloc[0]
    order = {backend: i for i, backend in enumerate([first, *sorted(set(data["backend"]) - {first})])}
    series = sorted(
        data.groupby(["strategy", "backend"]), key=lambda kv: (order[kv[0][1]], STRATEGY_ORDER.index(kv[0][0]))
    )
    for (strategy, backend), part in series:
        part = part.set_index("next_n").reindex(next_ns)  # a next_n the series lacks breaks its line
        style = series_style(strategy, backend)
        main = backend == first  # the kernel vLLM runs; others drawn lighter
        ax.plot(
            next_ns,
            part["kernel_us"],
            label=series_label(strategy, backend),
            linewidth=2.4 if main else 1.3,
            markersize=7 if main else 5,
            alpha=1.0 if main else 0.7,
            **style,
        )
        ax.fill_between(
            next_ns, part["p25_ms"] * 1e3, part["p75_ms"] * 1e3, color=style["color"], alpha=0.15, linewidth=0
        )
    floor = table.dropna(subset=["floor_us"]) if "floor_us" in table else table.iloc[:0]
    if not floor.empty:
        ax.plot(
            floor["next_n"],
            floor["floor_us"],
            color=MODELED_COLOR,
            linestyle=MODELED_LINESTYLE,
            marker=MODELED_MARKER,
            markerfacecolor="none",
            label=f"floor, {MODELED}: KV read once or the FLOPs,\nat the run's ceilings (whichever is longer)",
        )
    timed = table.dropna(subset=["vllm_us"])
    ax.scatter(
        timed["next_n"],
        timed["vllm_us"],
        label=f"{VLLM_RELEASE} takes (SM90 + DeepGEMM rule, {first} time)",
        **VLLM_MARKER,
    )
    on_gpu = bool((data["device"] == "cuda").all()) if "device" in data else True
    for row in timed[timed["beyond_spread"]].itertuples() if on_gpu else ():
        ax.annotate(
            "",
            xy=(row.next_n, row.best_us),
            xytext=(row.next_n, row.vllm_us),
            arrowprops={"arrowstyle": "-|>", "color": "black", "linewidth": 1.3, "shrinkA": 6, "shrinkB": 4},
        )
        ax.annotate(
            f"{row.speedup:.2f}×",
            (row.next_n, (row.vllm_us + row.best_us) / 2),
            xytext=(7, 0),
            textcoords="offset points",
            va="center",
            fontsize=10,
            fontweight="bold",
            zorder=7,
            bbox=LABEL_BOX,
        )
    if on_gpu:
        ax.scatter(
            [], [], marker=r"$\downarrow$", color="black", s=80, label="to the best option: vLLM's time / best (×)"
        )
    else:
        ax.plot([], [], linestyle="none", label="CPU wall clock: no speedups drawn\n(they say nothing about a GPU)")
    ax.set_xticks(next_ns)
    ax.set_xlim(min(next_ns) - 0.4, max(next_ns) + 0.8)  # room for the speedup labels right of the arrows
    spread = data["kernel_us"].max() / data["kernel_us"].min()
    if spread > 30:  # e.g. a noisy CPU stand-in: a linear axis would flatten every other point
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, None)
    scale = " (log scale)" if spread > 30 else ""
    ax.set(
        xlabel="next_n (query rows per request)", ylabel=f"kernel time per decode step (µs, median; band: IQR){scale}"
    )
    legend_outside(ax, fontsize=8.5)
    native = sorted(int(n) for n in table.loc[table["vllm_strategy"] == "native", "next_n"])
    ax.set_title(
        f"Paged MQA-logits kernel time, measured on {chart_text(device_label)}: batch = {batch}, "
        f"context = {context_title(context)}"
        f"\n{VLLM_RELEASE} on SM90 runs next_n in {native} natively and flattens the rest",
        fontsize=11,
    )
    return add_footer(fig, provenance_line)


def style_headline(table: pd.DataFrame, device_label: str, speedups: bool = True) -> Styler:
    """The headline table for display: µs, the best option's pieces, speedups shaded in the one speedup palette
    (`style.shade_speedups`: white, vLLM is best; blue, the best option is faster), and the run of each row when
    they come from several. Without `speedups` (a CPU's wall clock) the times only."""
    shown = pd.DataFrame(
        {
            "next_n": table["next_n"],
            "vLLM 0.33 takes": table["vllm_strategy"] + " (" + table["vllm_backend"] + ")",
            "vLLM µs": table["vllm_us"],
            "best option": table["best_strategy"]
            + np.where(table["best_pieces"] != "", " " + table["best_pieces"].map(pieces_title), "")
            + " ("
            + table["best_backend"]
            + ")",
            "best µs": table["best_us"],
            "speedup": table["speedup"],
            "gap": np.select(
                [table["vllm_us"].isna(), table["beyond_spread"]],
                ["vLLM's strategy not timed", "beyond spread"],
                "within spread",
            ),
        }
    )
    if "floor_us" in table and table["floor_us"].notna().any():
        shown[f"floor µs ({MODELED})"] = table["floor_us"]
        shown["best / floor"] = table["best_us"] / table["floor_us"]
    if "run_id" in table and table["run_id"].nunique() > 1:
        shown["run"] = table["run_id"]
    if not speedups:
        shown = shown.drop(columns=["speedup", "gap"])
    formats = {
        "vLLM µs": "{:.0f}",
        "best µs": "{:.0f}",
        "speedup": "{:.2f}×",
        f"floor µs ({MODELED})": "{:.0f}",
        "best / floor": "{:.2f}×",
    }
    styled = shown.style.format({k: v for k, v in formats.items() if k in shown}, na_rep="—", escape="html")
    styled = shade_speedups(styled, ["speedup"]) if speedups else styled
    what = "vLLM 0.33's choice against the fastest option timed" if speedups else "wall-clock times, no speedups"
    return styled.set_caption(f"Measured on {html_text(device_label)}: {what}").hide(axis="index")
