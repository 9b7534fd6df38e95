"""Our Triton kernel against DeepGEMM: the charts, tables and reading of notebook 03.

Input is a run's results frame (`dsa_lab.store.load_run(...).results`), one shape (heads,
head_dim, cache dtype) at a time; only rows with status 'ok' count. The comparison sets a
*candidate* (backend, strategy), by default Triton native, against a *baseline* backend,
by default DeepGEMM, in two ways per point: vLLM 0.33's path on SM90 + DeepGEMM
(`dsa_lab.policy`, via `latency.vllm_choice`) and the best baseline option (the fastest
of its strategies that ran). Modeled rows (roofline times, `analysis.modeled.modeled_native_rows`) are
never part of a comparison; charts draw them grey, dashed or hatched and say
'modeled (roofline, not measured)'. Colours, markers and footers are the project's
(`plots.style`). Nothing here times anything.

Issue 13's goals for the Gluon kernel are read by `analysis.goals`; here they are drawn
(`plot_goal_ratio_heatmap`: the candidate against the best option over every DeepGEMM
backend) and styled for display (`style_goal_points`, `style_goal_summary`, `style_ncu_comparison`);
`plot_cta_phases` draws round 10's timelines inside one CTA (`analysis.timelines`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from dsa_lab.analysis.frames import (
    BASELINE,
    POINT,
    SM90_DEEPGEMM,
    best_option,
    by_point,
    measured_ok,
    ok_rows,
    vllm_path,
)
from dsa_lab.analysis.frames import context_order as _context_order
from dsa_lab.analysis.goals import CANDIDATE as GOAL_CANDIDATE
from dsa_lab.analysis.goals import GOAL_COLUMNS
from dsa_lab.markup import html_text, md_text
from dsa_lab.plots.latency import _sources_label, context_title
from dsa_lab.plots.style import (
    BEST_MARKER,
    MODELED_COLOR,
    MODELED_HATCH,
    MODELED_LINESTYLE,
    MODELED_MARKER,
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
    strategy_color,
    style_handles,
)
from dsa_lab.policy import Platform
from dsa_lab.roofline import GpuSpec
from dsa_lab.workload import ContextSpec

MODELED_LABEL = "modeled (roofline, not measured)"
CANDIDATE = ("triton", "native")


# ---------------------------------------------------------------- tables


def caption(provenance: Mapping[str, Any]) -> str:
    """Provenance line for a figure: source, GPU, run id, date, git and versions (`style.provenance_line`)."""
    return provenance_line(provenance)


def kernel_comparison(
    frame: pd.DataFrame,
    candidate: tuple[str, str] = CANDIDATE,
    baseline: str = BASELINE,
    platform: Platform = SM90_DEEPGEMM,
) -> pd.DataFrame:
    """Per point where the candidate ran: its time and share of the floor, vLLM's path and the best
    baseline option, and the speedups (baseline time / candidate time, > 1: the candidate wins).

    `beyond_spread_*` is True when the candidate's 75th percentile lies below the other's 25th.
    """
    data = measured_ok(frame)
    backend, strategy = candidate
    mine = data[(data["backend"] == backend) & (data["strategy"] == strategy)]
    if mine.empty:
        timed = sorted(set(data["backend"] + "/" + data["strategy"]))
        raise ValueError(f"candidate={candidate!r}: no measured timed rows; timed (backend/strategy): {timed}")
    floor_pct = 100 * mine["floor_ms"] / mine["median_ms"] if "floor_ms" in mine else np.nan
    table = mine[POINT].assign(
        candidate_ms=mine["median_ms"], candidate_p25_ms=mine["p25_ms"], candidate_p75_ms=mine["p75_ms"],
        floor_pct=pd.to_numeric(floor_pct, errors="coerce"),
        floor_bound=mine["floor_bound"] if "floor_bound" in mine else None,
    )  # fmt: skip
    table = table.merge(vllm_path(frame, baseline, platform), on=POINT, how="left")
    table = table.merge(best_option(frame, baseline), on=POINT, how="left")
    table["speedup_vs_vllm"] = table["vllm_ms"] / table["candidate_ms"]
    table["speedup_vs_best"] = table["best_ms"] / table["candidate_ms"]
    table["beyond_spread_vs_vllm"] = table["candidate_p75_ms"] < table["vllm_p25_ms"]
    table["beyond_spread_vs_best"] = table["candidate_p75_ms"] < table["best_p25_ms"]
    return by_point(table)


def pick_point(frame: pd.DataFrame, batch: int, context: str | int) -> tuple[int, str, str]:
    """The (batch, context label) to draw: the one asked for if measured, else the largest
    measured batch and longest uniform context; and a note saying which and why."""
    data = measured_ok(frame)
    if data.empty:
        raise ValueError("frame: no measured rows with status 'ok'")
    label = ContextSpec.parse(context).label
    pairs = set(zip(data["batch"], data["context"]))
    if (batch, label) in pairs:
        return batch, label, ""
    contexts = _context_order(data["context"])
    uniform = [c for c in contexts if not c.startswith("mixed")] or contexts
    chosen_context = uniform[-1]
    chosen_batch = int(data.loc[data["context"] == chosen_context, "batch"].max())
    note = (f"batch={batch}, context={label} was not measured in this run; showing batch={chosen_batch}, "
            f"context={chosen_context} (the largest batch at the longest uniform context measured).")  # fmt: skip
    return chosen_batch, chosen_context, note


def modeled_gpu(backend: str) -> str:
    """'model (B200)' -> 'B200'; the table's measured-ceilings row reads 'H200 (measured ceilings)'."""
    name = backend.removeprefix("model (").removesuffix(")")
    return name.replace("-measured", " (measured ceilings)")


def modeled_vs_measured(
    frame: pd.DataFrame, batch: int, context: str, candidate: tuple[str, str] = CANDIDATE, baseline: str = BASELINE
) -> pd.DataFrame:
    """µs per next_n (rows) at one (batch, context): the candidate, best baseline option and vLLM's
    path as measured, then every modeled backend's native time (columns say which is which)."""
    columns: dict[str, pd.Series] = {}
    measured = measured_ok(frame)
    if ((measured["backend"] == candidate[0]) & (measured["strategy"] == candidate[1])).any():
        comp = kernel_comparison(frame, candidate, baseline)
        comp = comp[(comp["batch"] == batch) & (comp["context"] == context)].set_index("next_n")
        columns[f"{candidate[1]} ({candidate[0]}), measured"] = comp["candidate_ms"] * 1e3
        columns[f"best {baseline} option, measured"] = comp["best_ms"] * 1e3
        columns[f"{VLLM_RELEASE} path ({baseline}), measured"] = comp["vllm_ms"] * 1e3
    modeled = ok_rows(frame)
    modeled = modeled[(modeled["source"] == "modeled") & (modeled["strategy"] == "native")]
    modeled = modeled[(modeled["batch"] == batch) & (modeled["context"] == context)]
    for backend, part in modeled.groupby("backend", sort=False):
        columns[f"{modeled_gpu(backend)} native: {MODELED_LABEL}"] = part.set_index("next_n")["kernel_us"]
    if not columns:
        raise ValueError(f"frame: nothing to show at batch={batch}, context={context}")
    table = pd.DataFrame(columns).sort_index()
    table.index.name = "next_n"
    return table


# ---------------------------------------------------------------- charts


def _platform_label(platform: Platform) -> str:
    return platform.family.upper() + (" + DeepGEMM" if platform.has_deep_gemm else "")


def _series_key(series: str) -> tuple[bool, str, int]:
    """'strategy (backend)' labels: measured before modeled, then by backend, then native, atom, flatten."""
    return "model (" in series, series.split("(")[-1], STRATEGY_ORDER.index(series.split(" ")[0])


def _finish(fig: Figure, title: str, provenance_line: str | None) -> Figure:
    fig.suptitle(title)
    return add_footer(fig, provenance_line)


def plot_backend_latency(
    frame: pd.DataFrame, batch: int, context: str, device: str, provenance_line: str | None = None,
    baseline: str = BASELINE, platform: Platform = SM90_DEEPGEMM,
) -> Figure:  # fmt: skip
    """Kernel time vs next_n at one (batch, context): a line per backend + strategy (IQR as error
    bars), the best `baseline` option ringed, vLLM 0.33's path as black diamonds; modeled rows
    dashed grey and labelled."""
    data = ok_rows(frame)
    data = data[(data["batch"] == batch) & (data["context"] == context)]
    if data.empty:
        raise ValueError(f"frame: no timed rows at batch={batch}, context={context}")
    series = sorted(data["series"].unique(), key=_series_key)
    fig, ax = plt.subplots(figsize=(11.5, 5.6), constrained_layout=True)
    modeled_greys = iter(sns.color_palette("Greys_r", 4))
    for name in series:
        part = data[data["series"] == name].sort_values("next_n")
        strategy, backend = part["strategy"].iloc[0], part["backend"].iloc[0]
        if (part["source"] == "modeled").all():
            ax.plot(part["next_n"], part["kernel_us"], color=next(modeled_greys), linestyle=MODELED_LINESTYLE,
                    marker=MODELED_MARKER, markerfacecolor="none",
                    label=f"{strategy} on {modeled_gpu(backend)}: {MODELED_LABEL}")  # fmt: skip
            continue
        err = np.vstack([part["kernel_us"] - part["p25_ms"] * 1e3, part["p75_ms"] * 1e3 - part["kernel_us"]])
        ax.errorbar(part["next_n"], part["kernel_us"], yerr=err, capsize=3, linewidth=1.8,
                    label=f"{series_label(strategy, backend)}, measured", **series_style(strategy, backend))  # fmt: skip
    best = best_option(data, baseline)
    if not best.empty:
        ax.scatter(best["next_n"], best["best_ms"] * 1e3, label=f"best {baseline} option (fastest of its strategies)",
                   **BEST_MARKER)  # fmt: skip
    path = vllm_path(data, baseline, platform).dropna(subset=["vllm_ms"])
    if not path.empty:
        native = sorted(int(n) for n in path.loc[path["vllm_strategy"] == "native", "next_n"])
        ax.scatter(path["next_n"], path["vllm_ms"] * 1e3, **VLLM_MARKER,
                   label=f"{VLLM_RELEASE} path on {_platform_label(platform)} ({baseline}):\n"
                   f"native for next_n in {native}, else flatten")  # fmt: skip
    ax.set_xticks(sorted(data["next_n"].unique()))
    ax.set(xlabel="next_n (query rows per request)", ylabel="kernel time per decode step (µs, median)", ylim=(0, None))
    legend_outside(ax)
    backends = " vs ".join(dict.fromkeys(data.loc[data["source"] == "measured", "backend"])) or "modeled"
    title = (f"Kernel time, {backends}, on {chart_text(device)} ({_sources_label(data)}): batch={batch}, "
             f"context={context_title(context)}")  # fmt: skip
    return _finish(fig, title, provenance_line)


def plot_speedup_heatmaps(
    comparison: pd.DataFrame, device: str, provenance_line: str | None = None,
    candidate: tuple[str, str] = CANDIDATE, baseline: str = BASELINE,
) -> Figure:  # fmt: skip
    """Candidate speedup over vLLM's path (left) and over the best baseline option (right):
    rows batch x context, columns next_n; blue = the candidate is faster, red = slower."""
    panels = [
        ("speedup_vs_vllm", f"over {VLLM_RELEASE}'s path ({baseline})"),
        ("speedup_vs_best", f"over the best {baseline} option"),
    ]
    values = comparison[[c for c, _ in panels]].to_numpy(dtype=float)
    if np.isnan(values).all():
        raise ValueError("comparison: no point has a baseline time to compare with")
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(np.nanmin(values), 0.95), vmax=max(np.nanmax(values), 1.05))
    contexts = _context_order(comparison["context"])
    groups = comparison.groupby(["batch", "context"]).ngroups
    width = 2 * (3.5 + 0.6 * comparison["next_n"].nunique())
    fig, axes = plt.subplots(1, 2, figsize=(width, max(3.5, 1.6 + 0.4 * groups)), constrained_layout=True)
    for ax, (column, title) in zip(axes, panels):
        grid = comparison.pivot_table(index=["batch", "context"], columns="next_n", values=column)
        order = [(b, c) for b in sorted(comparison["batch"].unique()) for c in contexts if (b, c) in grid.index]
        grid = grid.reindex(order)
        grid.index = [f"B={b}, {context_title(c)}" for b, c in grid.index]
        sns.heatmap(grid, annot=True, fmt=".2f", cmap="RdBu", norm=norm, ax=ax, cbar=False,
                    linewidths=0.5, linecolor="white")  # fmt: skip
        ax.set(title=title, xlabel="next_n", ylabel="batch, context")
    fig.colorbar(axes[0].collections[0], ax=axes, label="speedup (×): other time / candidate time", shrink=0.8)
    title = f"{candidate[0]} {candidate[1]} speedup on {chart_text(device)} (measured); empty cell: the other side was not timed"
    return _finish(fig, title, provenance_line)


def _ratio_norm(values: np.ndarray) -> TwoSlopeNorm:
    """Diverging at 1.0, symmetric, so that equal distances from 1 get equal colours."""
    span = max(np.nanmax(np.abs(values - 1.0)), 0.05)
    return TwoSlopeNorm(vcenter=1.0, vmin=1.0 - span, vmax=1.0 + span)


def plot_goal_ratio_heatmap(
    points: pd.DataFrame, device: str, provenance_line: str | None = None, candidate: str = GOAL_CANDIDATE
) -> Figure:
    """The candidate's native time / the best DeepGEMM option's at every point (`analysis.goals.goal_points`):
    rows batch x context, columns next_n, diverging colours centred at 1.0 (blue: the candidate faster).
    Each cell names the option it is held to: its strategy, and its backend when more than one wins somewhere."""
    shown = points.dropna(subset=["ratio"])
    if shown.empty:
        raise ValueError("points: no point has both a candidate and a DeepGEMM time (column 'ratio' all NaN)")
    several = shown["best_backend"].nunique() > 1
    text = [f"{r.ratio:.3f}\n{r.best_strategy}" + (f"\n{r.best_backend}" if several else "")
            for r in shown.itertuples()]  # fmt: skip
    keys = ["batch", "context"]
    grid = shown.pivot_table(index=keys, columns="next_n", values="ratio")
    notes = shown.assign(text=text).pivot(index=keys, columns="next_n", values="text")
    contexts = _context_order(shown["context"])
    order = [(b, c) for b in sorted(shown["batch"].unique()) for c in contexts if (b, c) in grid.index]
    grid, notes = grid.reindex(order), notes.reindex(index=order, columns=grid.columns).fillna("")
    grid.index = [f"B={b}, L={context_title(c)}" for b, c in grid.index]
    rows, columns = grid.shape
    fig, ax = plt.subplots(figsize=(3.5 + 1.0 * columns, 1.6 + (0.75 if several else 0.55) * rows),
                           constrained_layout=True)  # fmt: skip
    sns.heatmap(grid, annot=notes.to_numpy(), fmt="", annot_kws={"fontsize": 8}, cmap="RdBu_r",
                norm=_ratio_norm(grid.to_numpy(dtype=float)), ax=ax, linewidths=0.5, linecolor="white",
                cbar_kws={"label": f"{candidate} native / best DeepGEMM option (×)"})  # fmt: skip
    ax.set(xlabel="next_n", ylabel="batch, context")
    ax.tick_params(axis="y", rotation=0)
    title = (f"{candidate} native / the best DeepGEMM option on {chart_text(device)} (measured; the fastest strategy over "
             f"every DeepGEMM backend timed)\nbelow 1 (blue): {candidate} faster. Each cell: the ratio and the "
             "option it is held to; empty: a side was not timed")  # fmt: skip
    return _finish(fig, title, provenance_line)


def plot_cta_phases(phases: pd.DataFrame, device: str, provenance_line: str | None = None) -> Figure:
    """What one CTA of the Gluon kernel waits for at B = 1 (`analysis.timelines.cta_phases`): a bar
    per case, its consecutive phases from the loader's start, Q's arrival marked."""
    if phases.empty:
        raise ValueError("phases: no traced case to draw")
    cases = list(dict.fromkeys(phases["case"]))
    names = list(dict.fromkeys(phases["phase"]))
    colors = dict(zip(names, sns.color_palette("deep", len(names))))
    fig, ax = plt.subplots(figsize=(11.5, 1.4 + 0.5 * len(cases)), constrained_layout=True)
    for phase in names:
        part = phases[phases["phase"] == phase].set_index("case").reindex(cases)
        ax.barh(cases, part["end_ns"] - part["start_ns"], left=part["start_ns"], color=colors[phase], label=phase,
                edgecolor="white", linewidth=0.6)  # fmt: skip
    arrived = phases.drop_duplicates("case").set_index("case").reindex(cases)["q_arrived_ns"]
    ax.scatter(arrived, cases, marker="|", s=300, color="black", linewidths=2, zorder=3, label="Q arrived")
    ax.invert_yaxis()
    ax.set(xlabel="ns after the CTA's loader starts (median over CTAs and launches)", ylabel="")
    legend_outside(ax)
    title = (f"Inside one CTA of the gluon kernel at B = 1 on {chart_text(device)} (measured, instrumented copy): "
             "what the first tiles wait for")  # fmt: skip
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
    ax.plot(span, span * gpu.hbm_tbps, color="black", linestyle=":", linewidth=1,
            label=f"HBM slope {gpu.hbm_tbps:g} TB/s ({gpu.name})")  # fmt: skip
    ax.axhline(gpu.fp8_tflops, color="black", linestyle="--", linewidth=1,
               label=f"FP8 roof {gpu.fp8_tflops:g} TFLOP/s ({gpu.name})")  # fmt: skip
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
            ax.scatter(x, part["tflops"], s=part["batch"].map(sizes), marker=MODELED_MARKER, facecolors="none",
                       edgecolors=MODELED_COLOR, linewidths=1.0, alpha=0.9)  # fmt: skip
        else:
            ax.scatter(x, part["tflops"], s=part["batch"].map(sizes), marker=backend_marker(backend),
                       color=strategy_color(strategy), alpha=0.75, edgecolors="white", linewidths=0.4)  # fmt: skip
    ax.set(xscale="log", yscale="log", xlim=(low, high), xlabel="arithmetic intensity (useful FLOPs / unique bytes)",
           ylabel="achieved TFLOP/s (useful FLOPs / median time)")  # fmt: skip
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
        handles.append(plt.Line2D([], [], marker=MODELED_MARKER, linestyle="none", color=MODELED_COLOR,
                                  markerfacecolor="none"))  # fmt: skip
        labels.append(f"native on {gpus}: {MODELED_LABEL}")
    legend_outside(ax, handles, labels, fontsize=7.5)
    ceilings = "measured" if gpu.measured else "datasheet"
    title = (
        f"Roofline on {chart_text(device)} ({_sources_label(data)} points); ceilings: {gpu.name} ({ceilings} ceilings)"
    )
    return _finish(fig, title, provenance_line)


def plot_modeled_sm100(
    frame: pd.DataFrame, batch: int, context: str, device: str, provenance_line: str | None = None,
    candidate: tuple[str, str] = CANDIDATE, baseline: str = BASELINE,
) -> Figure:  # fmt: skip
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
        strategies = {first: pd.Series(candidate[1], index=table.index), second: comp["best_strategy"],
                      third: comp["vllm_strategy"]}  # fmt: skip
        marks = {first: {"marker": backend_marker(candidate[0]), "color": "black", "s": 30},
                 second: {**BEST_MARKER, "s": 60}, third: {**VLLM_MARKER, "s": 40}}  # fmt: skip
    greys = dict(zip(modeled, (str(g) for g in np.linspace(0.85, 0.5, max(len(modeled), 2)))))
    fig, ax = plt.subplots(figsize=(max(11, 1.5 * len(table) + 4), 5.2), constrained_layout=True)
    width = 0.8 / len(table.columns)
    x = np.arange(len(table))
    for i, column in enumerate(table.columns):
        offset = x + (i - (len(table.columns) - 1) / 2) * width
        if column in modeled:
            ax.bar(offset, table[column], width, color=greys[column], hatch=MODELED_HATCH, edgecolor="0.25",
                   label=column)  # fmt: skip
            continue
        colours = [strategy_color(s) if isinstance(s, str) else MODELED_COLOR
                   for s in strategies[column].reindex(table.index)]  # fmt: skip
        ax.bar(offset, table[column], width, color=colours, edgecolor="white", label=column)
        ax.scatter(offset, table[column], **{"zorder": 5, **marks[column], "label": None})
    ax.set_xticks(x, [str(n) for n in table.index])
    ax.set(xlabel="next_n", ylabel="kernel time per decode step (µs)")
    handles, labels = [], []
    for column in measured:
        mark = {k: v for k, v in marks[column].items() if k in ("marker", "color")}
        face = "none" if marks[column].get("facecolors") == "none" else mark.get("color")
        handles.append(plt.Line2D([], [], linestyle="none", markersize=8, markerfacecolor=face,
                                  markeredgecolor="black", **mark))  # fmt: skip
        labels.append(f"{column} (bar colour: the strategy it ran)")
    used = [s for s in STRATEGY_ORDER if any(s in set(v.dropna()) for v in strategies.values())]
    more, more_labels = style_handles(used, [])
    handles += more
    labels += [f"strategy: {label}" for label in more_labels]
    handles += [plt.Rectangle((0, 0), 1, 1, facecolor=greys[c], hatch=MODELED_HATCH, edgecolor="0.25") for c in modeled]
    labels += modeled
    legend_outside(ax, handles, labels)
    kind = "measured vs SM100 " if measured else ""
    title = (f"{chart_text(device)} {kind}{MODELED_LABEL if modeled else 'measured'}: batch={batch}, "
             f"context={context_title(context)}")  # fmt: skip
    return _finish(fig, title, provenance_line)


# ---------------------------------------------------------------- reading


def reading(comparison: pd.DataFrame, batch: int, context: str, device: str,
            candidate: tuple[str, str] = CANDIDATE, baseline: str = BASELINE) -> str:  # fmt: skip
    """Markdown: per next_n at (batch, context) the candidate's time, its speedups and share of the
    floor; then the whole run in one line. Every number comes from `comparison`."""
    name = f"{candidate[0]} {candidate[1]}"
    here = comparison[(comparison["batch"] == batch) & (comparison["context"] == context)]
    lines = [f"**{name} on {md_text(device)}, batch={batch}, context={context} (measured):**", ""]
    for row in here.itertuples():
        parts = [f"- next_n={row.next_n}: {row.candidate_ms * 1e3:.1f} µs"]
        if pd.notna(row.vllm_ms):
            parts.append(f"{row.speedup_vs_vllm:.2f}x vs vLLM's path ({row.vllm_strategy}, {row.vllm_ms * 1e3:.1f} µs)")
        else:
            parts.append(f"vLLM's path ({row.vllm_strategy}) not timed on {baseline}")
        if pd.notna(row.best_ms):
            parts.append(f"{row.speedup_vs_best:.2f}x vs the best {baseline} option "
                         f"({row.best_strategy}, {row.best_ms * 1e3:.1f} µs)")  # fmt: skip
        if pd.notna(row.floor_pct):
            parts.append(f"{row.floor_pct:.0f}% of the floor ({row.floor_bound}-bound)")
        lines.append("; ".join(parts) + ".")
    both = comparison.dropna(subset=["best_ms"])
    if both.empty:
        lines.append(f"\nNo point has a timed {baseline} row, so no speedup over it can be read from this run.")
    else:
        wins = int((both["speedup_vs_best"] > 1).sum())
        clear = int(both["beyond_spread_vs_best"].sum())
        lines.append(
            f"\nOver the whole run ({len(both)} points with both): {name} is faster than the best {baseline} option in "
            f"{wins} ({clear} beyond the measured spread); speedup median {both['speedup_vs_best'].median():.2f}x, "
            f"range {both['speedup_vs_best'].min():.2f}x to {both['speedup_vs_best'].max():.2f}x."
        )
    return "\n".join(lines)


def _range(span: tuple[float, float], digits: int = 2) -> str:
    low, high = span
    return f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else f"{low:.{digits}f}–{high:.{digits}f}"


def mixed_context_reading(
    gap: pd.DataFrame, device: str, candidate: tuple[str, str] = CANDIDATE, baseline: str = BASELINE
) -> str:
    """Markdown: why the candidate falls behind on a mixed-length batch, every number from
    `analysis.frames.mixed_context_gap` (the batch where it falls furthest behind first)."""
    if gap.empty:
        return ""
    worst = gap.loc[gap["vs_best"].map(lambda span: span[0]).idxmin()]
    name = f"{candidate[0]} {candidate[1]}"
    k = lambda n: f"{n / 1024:.1f}K"  # noqa: E731
    text = (
        f"**Why {name} falls behind at B = {worst.batch} with {context_title(worst.mixed)} contexts "
        f"({_range(worst.vs_best)}× the best {baseline} option, measured on {md_text(device)}).** The batch's requests hold "
        f"{k(worst['mean'])} tokens on average and {k(worst.longest)} at most: {100 * worst.token_share:.0f} % of "
        f"the tokens of a uniform {context_title(worst.uniform)} batch. The best {baseline} option's time falls "
        f"with the tokens ({_range(worst.baseline_scale)}× its uniform-{context_title(worst.uniform)} time over "
        f"next_n); {name}'s falls only to {_range(worst.candidate_scale)}×."
    )
    if pd.notna(worst.busy_programs):
        idle = int(worst.num_sms - worst.busy_programs)
        text += (
            f" Our Triton kernel launches one program per request and range of {int(worst.blocks_per_program)} KV "
            f"blocks ({64 * int(worst.blocks_per_program)} tokens), the range sized from the batch and its longest "
            f"request (`kernels.triton_native.blocks_per_program`): here only {int(worst.busy_programs)} of its "
            f"{int(worst.programs)} programs hold any cached token"
            + (f", so at least {idle} of the H200's {int(worst.num_sms)} SMs get no work at all" if idle > 0 else "")
            + " and the step lasts as long as its fullest program: a load imbalance between programs, not slower "
            "arithmetic. DeepGEMM's schedule metadata instead divides the batch's KV, in segments of 256 tokens, "
            "evenly over the SMs."
        )
    others = gap[gap["batch"] != worst.batch]
    if not others.empty:
        parts = [
            f"B = {row.batch}: {_range(row.vs_best)}×"
            + (f" ({int(row.busy_programs)} busy programs)" if pd.notna(row.busy_programs) else "")
            for row in others.itertuples()
        ]
        text += (
            f" At the other batch sizes ({context_title(worst.mixed)}, against the best option): "
            + "; ".join(parts)
            + "."
        )
    return text


def roofline_reading(comparison: pd.DataFrame, frame: pd.DataFrame, gpu: GpuSpec) -> str:
    """Where the ridge falls in next_n, and which term bounds the candidate's floor per next_n."""
    data = measured_ok(frame).dropna(subset=["flops", "unique_bytes"])
    intensity = (data["flops"] / data["unique_bytes"]).groupby(data["next_n"]).median()
    ridge = gpu.fp8_tflops / gpu.hbm_tbps
    right = [int(n) for n, value in intensity.items() if value >= ridge]
    text = (f"The ridge of {gpu.name} lies at {ridge:.0f} FLOP/B. Median intensity per next_n: "
            + ", ".join(f"n={n}: {v:.0f}" for n, v in intensity.items()) + ". ")  # fmt: skip
    text += (f"From next_n = {min(right)} the points lie right of the ridge: the FP8 MMA, not HBM, bounds a kernel "
             "that reads KV once." if right else "No point reaches the ridge: HBM bounds every one.")  # fmt: skip
    bounded = comparison.dropna(subset=["floor_bound"])
    bounds = bounded.groupby("next_n")["floor_bound"].agg(lambda s: "/".join(sorted(set(s))))
    if not bounds.empty:
        text += " The candidate's floor is " + ", ".join(f"{b} at n={n}" for n, b in bounds.items()) + "."
    return text


def style_comparison(table: pd.DataFrame) -> Any:
    """The comparison for display: times in µs, speedups shaded (blue: the candidate wins)."""
    shown = table[[*POINT, "candidate_ms", "floor_pct", "vllm_strategy", "vllm_ms", "speedup_vs_vllm",
                   "best_strategy", "best_ms", "speedup_vs_best"]].copy()  # fmt: skip
    for column in ("candidate_ms", "vllm_ms", "best_ms"):
        shown[column.replace("_ms", "_us")] = shown.pop(column) * 1e3
    shown = shown[[*POINT, "candidate_us", "floor_pct", "vllm_strategy", "vllm_us", "speedup_vs_vllm",
                   "best_strategy", "best_us", "speedup_vs_best"]]  # fmt: skip
    speedups = ["speedup_vs_vllm", "speedup_vs_best"]
    return (
        shown.style.format(
            {
                "candidate_us": "{:.1f}",
                "vllm_us": "{:.1f}",
                "best_us": "{:.1f}",
                "floor_pct": "{:.0f}%",
                "speedup_vs_vllm": "{:.2f}x",
                "speedup_vs_best": "{:.2f}x",
            },
            na_rep="—",
            escape="html",
        )  # fmt: skip
        .background_gradient(subset=speedups, cmap="RdBu", vmin=0.5, vmax=1.5)
        .hide(axis="index")
    )


def style_goal_points(points: pd.DataFrame) -> Any:
    """`analysis.goals.goal_points` for display: µs, ratios shaded around 1 (blue: the candidate wins),
    the floor's share in %, verdicts as met / missed ('—': the goal does not apply, or a side was not timed)."""
    shown = points[[*POINT, "candidate_us", "best_us", "best_strategy", "best_backend", "ratio", "flatten_atom_us",
                    "flatten_atom_ratio", "floor_us", "floor_share", *GOAL_COLUMNS]]  # fmt: skip
    verdict = lambda v: "met" if v else "missed"  # noqa: E731
    colour = lambda v: "" if pd.isna(v) else f"color: {'#1a7f37' if v else '#cf222e'}; font-weight: bold"  # noqa: E731
    return (
        shown.style.format(
            {
                "candidate_us": "{:.1f}",
                "best_us": "{:.1f}",
                "flatten_atom_us": "{:.1f}",
                "floor_us": "{:.1f}",
                "ratio": "{:.3f}",
                "flatten_atom_ratio": "{:.3f}",
                "floor_share": "{:.1%}",
                **dict.fromkeys(GOAL_COLUMNS, verdict),
            },
            na_rep="—",
            escape="html",
        )  # fmt: skip
        .background_gradient(subset=["ratio", "flatten_atom_ratio"], cmap="RdBu_r", vmin=0.8, vmax=1.2)
        .map(colour, subset=list(GOAL_COLUMNS))
        .hide(axis="index")
    )


def style_goal_summary(summary: pd.DataFrame) -> Any:
    """`analysis.goals.goal_summary` for display: the min and max ratio per next_n shaded around 1."""
    return (
        summary.style.format({"ratio_min": "{:.3f}", "ratio_max": "{:.3f}"}, na_rep="—", escape="html")
        .background_gradient(subset=["ratio_min", "ratio_max"], cmap="RdBu_r", vmin=0.8, vmax=1.2)
        .hide(axis="index")
    )


def style_ncu_comparison(table: pd.DataFrame) -> Any:
    """`analysis.goals.ncu_comparison` for display, its caption naming ncu's tensor-pipe counter."""
    counter = table.attrs.get("tensor_counter", "?")
    return (
        table.style.format(
            {
                "us": "{:.1f}",
                "dram_read_per_unique": "{:.3f}",
                "l2_hit_pct": "{:.1f}",
                "occupancy_pct": "{:.2f}",
                "tensor_pipe_pct": "{:.1f}",
                "useful_tflops": "{:.0f}",
            },
            na_rep="—",
            escape="html",
        )  # fmt: skip
        .set_caption(
            f"Nsight Compute (kernel replay, caches flushed); tensor pipe busy: ncu counter {html_text(counter)}"
        )
        .hide(axis="index")
    )
