"""A candidate kernel against a baseline backend, drawn: the charts of notebook 03 (its tables: `plots.kernel_tables`).

The frames come from `dsa_lab.analysis.versus` (`kernel_comparison`, `modeled_vs_measured`) and
`analysis.frames`; here they are drawn, one shape (heads, head_dim, cache dtype) at a time. Modeled rows
(roofline times) are never part of a comparison: charts draw them grey, dashed or hatched and say
'modeled (roofline, not measured)'. Colours, markers and footers are the project's (`plots.style`).
Nothing here times, models or reads anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from dsa_lab.analysis.frames import (
    SM90_DEEPGEMM,
    baseline_backends,
    best_option,
    context_order,
    ok_rows,
    path_backend,
    vllm_path,
)
from dsa_lab.analysis.labels import baseline_label, context_title
from dsa_lab.analysis.versus import MODELED_LABEL, held_to, kernel_comparison, modeled_gpu, modeled_vs_measured
from dsa_lab.model.roofline import GpuSpec
from dsa_lab.plots.style import (
    ANNOTATION_SIZE,
    BEST_MARKER,
    MAX_WIDTH,
    MODELED_COLOR,
    MODELED_HATCH,
    MODELED_LINESTYLE,
    MODELED_MARKER,
    SPEEDUP_CMAP,
    STRATEGY_ORDER,
    VLLM_MARKER,
    VLLM_RELEASE,
    add_footer,
    backend_marker,
    chart_text,
    legend_outside,
    provenance_line,
    series_label,
    series_style,
    sources_label,
    speedup_norm,
    strategy_color,
    style_handles,
)
from dsa_lab.policy.vllm import Platform

LATENCY_LABEL = "kernel time per decode step (µs, median)"  # the time axis of the latency charts


def caption(provenance: Mapping[str, Any]) -> str:
    """Provenance line for a figure: source, GPU, run id, date, git and versions (`style.provenance_line`)."""
    return provenance_line(provenance)


# ---------------------------------------------------------------- charts


def _platform_label(platform: Platform) -> str:
    return platform.family.upper() + (" + DeepGEMM" if platform.has_deep_gemm else "")


def _series_key(series: str) -> tuple[bool, str, int]:
    """'strategy (backend)' labels: measured before modeled, then by backend, then native, atom, flatten."""
    return "model (" in series, series.split("(")[-1], STRATEGY_ORDER.index(series.split(" ")[0])


def _finish(fig: Figure, title: str, provenance_line: str | None) -> Figure:
    fig.suptitle(title)
    return add_footer(fig, provenance_line)


def _draw_backend_latency(ax: Axes, data: pd.DataFrame, baseline: tuple[str, ...], platform: Platform) -> None:
    """One (batch, context)'s lines on `ax`: a line per backend + strategy (IQR as error bars; colour: the
    strategy, marker: the backend), the best option of the `baseline` backends ringed, vLLM 0.33's path as black
    diamonds; modeled rows dashed grey and labelled."""
    modeled_greys = iter(sns.color_palette("Greys_r", 4))
    for name in sorted(data["series"].unique(), key=_series_key):
        part = data[data["series"] == name].sort_values("next_n")
        strategy, backend = part["strategy"].iloc[0], part["backend"].iloc[0]
        if (part["source"] == "modeled").all():
            ax.plot(
                part["next_n"],
                part["kernel_us"],
                color=next(modeled_greys),
                linestyle=MODELED_LINESTYLE,
                marker=MODELED_MARKER,
                markerfacecolor="none",
                label=f"{strategy} on {modeled_gpu(backend)}: {MODELED_LABEL}",
            )
            continue
        err = np.vstack([part["kernel_us"] - part["p25_ms"] * 1e3, part["p75_ms"] * 1e3 - part["kernel_us"]])
        ax.errorbar(
            part["next_n"],
            part["kernel_us"],
            yerr=err,
            capsize=3,
            linewidth=1.8,
            label=f"{series_label(strategy, backend)}, measured",
            **series_style(strategy, backend),
        )
    best = best_option(data, list(baseline))
    if not best.empty:
        ax.scatter(
            best["next_n"],
            best["best_ms"] * 1e3,
            label=f"{baseline_label(baseline)}: the fastest of its strategies",
            **BEST_MARKER,
        )
    path = vllm_path(data, path_backend(baseline), platform).dropna(subset=["vllm_ms"])
    if not path.empty:
        native = sorted(int(n) for n in path.loc[path["vllm_strategy"] == "native", "next_n"])
        ax.scatter(
            path["next_n"],
            path["vllm_ms"] * 1e3,
            **VLLM_MARKER,
            label=f"{VLLM_RELEASE} path on {_platform_label(platform)} ({path_backend(baseline)}):\n"
            f"native for next_n in {native}, else flatten",
        )
    ax.set_xticks(sorted(data["next_n"].unique()))
    ax.set(xlabel="next_n (query rows per request)", ylim=(0, None))


def _latency_rows(frame: pd.DataFrame, batch: int, context: str) -> pd.DataFrame:
    data = ok_rows(frame)
    data = data[(data["batch"] == batch) & (data["context"] == context)]
    if data.empty:
        raise ValueError(f"frame: no timed rows at batch={batch}, context={context}")
    return data


def _measured_backends(data: pd.DataFrame) -> str:
    return " vs ".join(dict.fromkeys(data.loc[data["source"] == "measured", "backend"])) or "modeled"


def plot_backend_latency(
    frame: pd.DataFrame,
    batch: int,
    context: str,
    device: str,
    provenance_line: str | None = None,
    baseline: str | Sequence[str] | None = None,
    platform: Platform = SM90_DEEPGEMM,
) -> Figure:
    """Kernel time vs next_n at one (batch, context): a line per backend + strategy (IQR as error
    bars), the best option of the `baseline` backends (default: every DeepGEMM build) ringed, vLLM 0.33's path
    as black diamonds; modeled rows dashed grey and labelled."""
    data = _latency_rows(frame, batch, context)
    fig, ax = plt.subplots(figsize=(11.5, 5.0), constrained_layout=True)
    _draw_backend_latency(ax, data, baseline_backends(baseline, data), platform)
    ax.set_ylabel(LATENCY_LABEL)
    legend_outside(ax)
    title = (
        f"Kernel time, {_measured_backends(data)}, on {chart_text(device)} ({sources_label(data)}): "
        f"batch={batch}, context={context_title(context)}"
    )
    return _finish(fig, title, provenance_line)


def plot_backend_latency_panels(
    frame: pd.DataFrame,
    batch: int,
    contexts: Sequence[str],
    device: str,
    provenance_line: str | None = None,
    baseline: str | Sequence[str] | None = None,
) -> Figure:
    """`plot_backend_latency` at one batch for several contexts, a panel each side by side in one figure
    (each its own time axis: contexts differ in bytes), one legend beside them all."""
    if not contexts:
        raise ValueError("contexts: none to draw (give at least one context the frame timed)")
    panels = [_latency_rows(frame, batch, context) for context in contexts]
    every = pd.concat(panels)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.2 * len(panels) + 3.6, 5.0), squeeze=False, constrained_layout=True
    )
    legend: dict[str, Any] = {}
    for ax, data, context in zip(axes.flat, panels, contexts):
        _draw_backend_latency(ax, data, baseline_backends(baseline, every), SM90_DEEPGEMM)
        ax.set_title(f"context {context_title(context)}", fontsize=10)
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    axes.flat[0].set_ylabel(LATENCY_LABEL)
    legend_outside(fig, list(legend.values()), list(legend))
    title = f"Kernel time, {_measured_backends(every)}, on {chart_text(device)} ({sources_label(every)}): batch={batch}"
    return _finish(fig, title, provenance_line)


def plot_speedup_heatmaps(
    comparison: pd.DataFrame,
    device: str,
    provenance_line: str | None,
    candidate: tuple[str, str],
    baseline: str | Sequence[str] | None = None,
) -> Figure:
    """Candidate speedup over vLLM's path (left) and over the best baseline option (right), each the other
    side's time over the candidate's: rows batch x context, columns next_n; blue = the candidate is faster,
    red = slower."""
    backends = held_to(comparison, baseline)
    panels = [
        ("speedup_vs_vllm", f"{VLLM_RELEASE}'s path ({path_backend(backends)}) / candidate"),
        ("speedup_vs_best", f"{baseline_label(backends)} / candidate"),
    ]
    values = comparison[[c for c, _ in panels]].to_numpy(dtype=float)
    if np.isnan(values).all():
        raise ValueError("comparison: no point has a baseline time to compare with")
    norm = speedup_norm(values)
    contexts = context_order(comparison["context"])
    groups = comparison.groupby(["batch", "context"]).ngroups
    width = min(MAX_WIDTH, 2 * (3.5 + 0.6 * comparison["next_n"].nunique()))
    fig, axes = plt.subplots(1, 2, figsize=(width, max(3.5, 1.4 + 0.22 * groups)), constrained_layout=True)
    for ax, (column, title) in zip(axes, panels):
        grid = comparison.pivot_table(index=["batch", "context"], columns="next_n", values=column)
        order = [(b, c) for b in sorted(comparison["batch"].unique()) for c in contexts if (b, c) in grid.index]
        grid = grid.reindex(order)
        grid.index = [f"B={b}, {context_title(c)}" for b, c in grid.index]
        sns.heatmap(
            grid,
            annot=True,
            fmt=".2f",
            cmap=SPEEDUP_CMAP,
            norm=norm,
            ax=ax,
            cbar=False,
            linewidths=0.5,
            linecolor="white",
            annot_kws={"fontsize": ANNOTATION_SIZE},
        )
        ax.set(title=title, xlabel="next_n", ylabel="batch, context")
    label = "speedup (×): the other side's time / the candidate's (> 1: the candidate is faster)"
    fig.colorbar(axes[0].collections[0], ax=axes, label=label, shrink=0.8)
    title = f"{candidate[0]} {candidate[1]} speedup on {chart_text(device)} (measured); empty cell: the other side was not timed"
    return _finish(fig, title, provenance_line)


def plot_roofline_intensity(
    frame: pd.DataFrame, gpu: GpuSpec, device: str, provenance_line: str | None = None
) -> Figure:
    """Achieved TFLOP/s against useful FLOPs per unique byte (log-log) under `gpu`'s ceilings:
    the HBM slope and the FP8 roof. Intensity depends on next_n alone (top axis), so a kernel
    that reads KV once moves right with next_n until the FP8 MMA, not HBM, bounds it.
    Colour: strategy; marker: backend; size: batch; modeled points hollow grey X."""
    data = ok_rows(frame).dropna(subset=["flops", "unique_bytes"])
    if data.empty:
        raise ValueError("frame: no timed rows with roofline columns (flops, unique_bytes)")
    data = data.assign(intensity=data["flops"] / data["unique_bytes"], tflops=data["flops"] / (data["median_ms"] * 1e9))
    fig, ax = plt.subplots(figsize=(11, 5.8), constrained_layout=True)
    ridge = gpu.fp8_tflops / gpu.hbm_tbps
    low = min(data["intensity"].min(), ridge) / 2
    high = max(data["intensity"].max(), ridge) * 2
    span = np.logspace(np.log10(low), np.log10(high), 200)
    ax.plot(
        span,
        span * gpu.hbm_tbps,
        color="black",
        linestyle=":",
        linewidth=1,
        label=f"HBM slope {gpu.hbm_tbps:.2f} TB/s ({gpu.name})",
    )
    ax.axhline(
        gpu.fp8_tflops,
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"FP8 roof {gpu.fp8_tflops:.0f} TFLOP/s ({gpu.name})",
    )
    ax.plot(span, np.minimum(gpu.fp8_tflops, span * gpu.hbm_tbps), color="black", linewidth=2)
    ax.axvline(ridge, color="0.6", linewidth=0.8)
    ax.annotate(
        f"ridge {ridge:.0f} FLOP/B", (ridge, gpu.fp8_tflops), xytext=(4, 6), textcoords="offset points", fontsize=8
    )
    batches = sorted(data["batch"].unique())
    sizes = dict(zip(batches, np.linspace(18, 110, len(batches))))
    # a small sideways offset per backend, so that two backends at one intensity do not hide each other
    backends = sorted(data.loc[data["source"] == "measured", "backend"].unique())
    nudge = {b: 1.0 + 0.035 * (i - (len(backends) - 1) / 2) for i, b in enumerate(backends)}
    for (source, backend, strategy), part in data.groupby(["source", "backend", "strategy"]):
        x = part["intensity"] * nudge.get(backend, 1.0)
        if source == "modeled":
            ax.scatter(
                x,
                part["tflops"],
                s=part["batch"].map(sizes),
                marker=MODELED_MARKER,
                facecolors="none",
                edgecolors=MODELED_COLOR,
                linewidths=1.0,
                alpha=0.9,
            )
        else:
            ax.scatter(
                x,
                part["tflops"],
                s=part["batch"].map(sizes),
                marker=backend_marker(backend),
                color=strategy_color(strategy),
                alpha=0.75,
                edgecolors="white",
                linewidths=0.4,
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(low, high),
        xlabel="arithmetic intensity (useful FLOPs / unique bytes)",
        ylabel="achieved TFLOP/s (useful FLOPs / median time)",
    )
    ticks = data.groupby("next_n")["intensity"].median()
    top = ax.secondary_xaxis("top")
    top.set_xticks(ticks.to_numpy(), [str(n) for n in ticks.index], fontsize=8)
    top.minorticks_off()
    top.set_xlabel("next_n (at its median intensity)", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    strategies = [s for s in STRATEGY_ORDER if s in set(data.loc[data["source"] == "measured", "strategy"])]
    more, more_labels = style_handles(strategies, backends)
    handles += more
    labels += [f"strategy: {label}" if label in strategies else f"backend: {label}" for label in more_labels]
    for batch in batches:
        handles.append(plt.Line2D([], [], marker="o", linestyle="none", color="0.5", markersize=np.sqrt(sizes[batch])))
        labels.append(f"B = {batch}")
    if (data["source"] == "modeled").any():
        gpus = ", ".join(modeled_gpu(b) for b in data.loc[data["source"] == "modeled", "backend"].unique())
        handles.append(
            plt.Line2D([], [], marker=MODELED_MARKER, linestyle="none", color=MODELED_COLOR, markerfacecolor="none")
        )
        labels.append(f"native on {gpus}: {MODELED_LABEL}")
    legend_outside(ax, handles, labels, fontsize=7.5)
    ceilings = "measured" if gpu.measured else "datasheet"
    title = (
        f"Roofline on {chart_text(device)} ({sources_label(data)} points); ceilings: {gpu.name} ({ceilings} ceilings)"
    )
    return _finish(fig, title, provenance_line)


def plot_modeled_sm100(
    frame: pd.DataFrame,
    batch: int,
    context: str,
    device: str,
    provenance_line: str | None,
    candidate: tuple[str, str],
    baseline: str | Sequence[str] | None = None,
) -> Figure:
    """Bars per next_n from `modeled_vs_measured`: measured times on `device` (solid, coloured by
    the strategy each bar ran, topped by its series' mark: the candidate's backend marker, the
    best-option ring, vLLM's diamond) beside modeled native times on other GPUs (grey, hatched)."""
    table = modeled_vs_measured(frame, batch, context, candidate, baseline)
    measured = [c for c in table.columns if not c.endswith(MODELED_LABEL)]
    modeled = [c for c in table.columns if c.endswith(MODELED_LABEL)]
    strategies: dict[str, pd.Series] = {}
    marks: dict[str, dict[str, Any]] = {}
    if measured:
        comp = kernel_comparison(frame, candidate, baseline)
        comp = comp[(comp["batch"] == batch) & (comp["context"] == context)].set_index("next_n")
        first, second, third = measured
        strategies = {
            first: pd.Series(candidate[1], index=table.index),
            second: comp["best_strategy"],
            third: comp["vllm_strategy"],
        }
        marks = {
            first: {"marker": backend_marker(candidate[0]), "color": "black", "s": 30},
            second: {**BEST_MARKER, "s": 60},
            third: {**VLLM_MARKER, "s": 40},
        }
    greys = dict(zip(modeled, (str(g) for g in np.linspace(0.85, 0.5, max(len(modeled), 2)))))
    fig, ax = plt.subplots(figsize=(max(11, 1.5 * len(table) + 4), 5.2), constrained_layout=True)
    width = 0.8 / len(table.columns)
    x = np.arange(len(table))
    for i, column in enumerate(table.columns):
        offset = x + (i - (len(table.columns) - 1) / 2) * width
        if column in modeled:
            ax.bar(
                offset, table[column], width, color=greys[column], hatch=MODELED_HATCH, edgecolor="0.25", label=column
            )
            continue
        colours = [
            strategy_color(s) if isinstance(s, str) else MODELED_COLOR for s in strategies[column].reindex(table.index)
        ]
        ax.bar(offset, table[column], width, color=colours, edgecolor="white", label=column)
        ax.scatter(offset, table[column], **{"zorder": 5, **marks[column], "label": None})
    ax.set_xticks(x, [str(n) for n in table.index])
    ax.set(xlabel="next_n", ylabel="kernel time per decode step (µs)")
    handles, labels = [], []
    for column in measured:
        mark = {k: v for k, v in marks[column].items() if k in ("marker", "color")}
        face = "none" if marks[column].get("facecolors") == "none" else mark.get("color")
        handles.append(
            plt.Line2D([], [], linestyle="none", markersize=8, markerfacecolor=face, markeredgecolor="black", **mark)
        )
        labels.append(f"{column} (bar colour: the strategy it ran)")
    used = [s for s in STRATEGY_ORDER if any(s in set(v.dropna()) for v in strategies.values())]
    more, more_labels = style_handles(used, [])
    handles += more
    labels += [f"strategy: {label}" for label in more_labels]
    handles += [plt.Rectangle((0, 0), 1, 1, facecolor=greys[c], hatch=MODELED_HATCH, edgecolor="0.25") for c in modeled]
    labels += modeled
    legend_outside(ax, handles, labels)
    kind = "measured vs SM100 " if measured else ""
    title = f"{chart_text(device)} {kind}{MODELED_LABEL if modeled else 'measured'}: batch={batch}, context={context_title(context)}"
    return _finish(fig, title, provenance_line)
