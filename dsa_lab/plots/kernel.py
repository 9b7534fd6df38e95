"""Our Triton kernel against DeepGEMM: the charts, tables and reading of notebook 03.

Input is a run's results frame (`dsa_lab.store.load_run(...).results`), one shape (heads,
head_dim, cache dtype) at a time; only rows with status 'ok' count. The comparison sets a
*candidate* (backend, strategy), by default Triton native, against a *baseline* backend,
by default DeepGEMM, in two ways per point: vLLM 0.33's path on SM90 + DeepGEMM
(`dsa_lab.policy`, via `latency.vllm_choice`) and the best baseline option (the fastest
of its strategies that ran). Modeled rows (roofline times, `analysis.modeled.modeled_native_rows`) are
never part of a comparison; charts draw them grey, dashed or hatched and say
'modeled (roofline, not measured)'. Nothing here times anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from dsa_lab.plots.latency import STRATEGY_ORDER, _sources_label
from dsa_lab.plots.profiles import provenance_caption
from dsa_lab.policy import Platform
from dsa_lab.roofline import GpuSpec
from dsa_lab.workload import ContextSpec

MODELED_LABEL = "modeled (roofline, not measured)"
CANDIDATE = ("triton", "native")
BACKEND_PALETTES = {"triton": "Blues_r", "deepgemm": "Oranges_r", "reference": "Greens_r"}
VERSION_KEYS = ("torch", "triton", "vllm", "deep_gemm", "cuda")


# ---------------------------------------------------------------- tables


def caption(provenance: Mapping[str, Any]) -> str:
    """Provenance line for a figure: source, GPU, run id, date, git (`profiles.provenance_caption`) and versions."""
    env = provenance.get("environment") or {}
    versions = ", ".join(f"{k} {env[k]}" for k in VERSION_KEYS if env.get(k))
    return provenance_caption(provenance) + (f" | {versions}" if versions else "")


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
        columns[f"vLLM 0.33 path ({baseline}), measured"] = comp["vllm_ms"] * 1e3
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


def _palette(series: Sequence[str]) -> dict[str, Any]:
    """One hue family per backend (Triton blues, DeepGEMM oranges...), a shade per strategy; modeled greys."""
    colours: dict[str, Any] = {}
    measured = [s for s in series if "model (" not in s]
    for backend in dict.fromkeys(s.split("(")[-1].rstrip(")") for s in measured):
        mine = sorted((s for s in measured if s.endswith(f"({backend})")), key=_series_key)
        shades = sns.color_palette(BACKEND_PALETTES.get(backend, "Purples_r"), len(mine) + 2)
        colours.update(zip(mine, shades))
    modeled = [s for s in series if "model (" in s]
    colours.update(zip(modeled, sns.color_palette("Greys_r", len(modeled) + 2)))
    return colours


def _finish(fig: Figure, title: str, provenance_line: str | None) -> Figure:
    fig.suptitle(title)
    if provenance_line:
        fig.supxlabel(provenance_line, fontsize=7.5, color="0.35")
    return fig


def plot_backend_latency(
    frame: pd.DataFrame, batch: int, context: str, device: str, provenance_line: str | None = None,
    baseline: str = BASELINE, platform: Platform = SM90_DEEPGEMM,
) -> Figure:  # fmt: skip
    """Kernel time vs next_n at one (batch, context): a line per backend + strategy (IQR as error
    bars), the best `baseline` option ringed, vLLM 0.33's path marked; modeled rows dashed grey."""
    data = ok_rows(frame)
    data = data[(data["batch"] == batch) & (data["context"] == context)]
    if data.empty:
        raise ValueError(f"frame: no timed rows at batch={batch}, context={context}")
    series = sorted(data["series"].unique(), key=_series_key)
    colours = _palette(series)
    fig, ax = plt.subplots(figsize=(10, 6.5), constrained_layout=True)
    for name in series:
        part = data[data["series"] == name].sort_values("next_n")
        modeled = (part["source"] == "modeled").all()
        err = np.vstack([part["kernel_us"] - part["p25_ms"] * 1e3, part["p75_ms"] * 1e3 - part["kernel_us"]])
        ax.errorbar(part["next_n"], part["kernel_us"], yerr=None if modeled else err, color=colours[name],
                    linestyle="--" if modeled else "-", marker="X" if modeled else "o", capsize=3,
                    label=f"{part['strategy'].iloc[0]} on {modeled_gpu(part['backend'].iloc[0])}: {MODELED_LABEL}"
                    if modeled else f"{name}, measured")  # fmt: skip
    best = best_option(data, baseline)
    if not best.empty:
        ax.scatter(best["next_n"], best["best_ms"] * 1e3, s=260, facecolors="none", edgecolors="black", linewidths=1.5,
                   zorder=5, label=f"best {baseline} option (fastest of its strategies)")  # fmt: skip
    path = vllm_path(data, baseline, platform).dropna(subset=["vllm_ms"])
    if not path.empty:
        native = sorted(int(n) for n in path.loc[path["vllm_strategy"] == "native", "next_n"])
        ax.scatter(path["next_n"], path["vllm_ms"] * 1e3, s=90, marker="D", facecolors="none", edgecolors="crimson",
                   linewidths=1.8, zorder=6,
                   label=f"vLLM 0.33 path on {_platform_label(platform)} ({baseline}): "
                   f"native for next_n in {native}, else flatten")  # fmt: skip
    ax.set_xticks(sorted(data["next_n"].unique()))
    ax.set(xlabel="next_n (query rows per request)", ylabel="kernel time per decode step (µs, median)", ylim=(0, None))
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    backends = " vs ".join(dict.fromkeys(data.loc[data["source"] == "measured", "backend"])) or "modeled"
    title = f"Kernel time, {backends}, on {device} ({_sources_label(data)}): batch={batch}, context={context}"
    return _finish(fig, title, provenance_line)


def plot_speedup_heatmaps(
    comparison: pd.DataFrame, device: str, provenance_line: str | None = None,
    candidate: tuple[str, str] = CANDIDATE, baseline: str = BASELINE,
) -> Figure:  # fmt: skip
    """Candidate speedup over vLLM's path (left) and over the best baseline option (right):
    rows batch x context, columns next_n; blue = the candidate is faster, red = slower."""
    panels = [
        ("speedup_vs_vllm", f"over vLLM 0.33's path ({baseline})"),
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
        grid.index = [f"B={b}, {c}" for b, c in grid.index]
        sns.heatmap(grid, annot=True, fmt=".2f", cmap="RdBu", norm=norm, ax=ax, cbar=False,
                    linewidths=0.5, linecolor="white")  # fmt: skip
        ax.set(title=title, xlabel="next_n", ylabel="batch, context")
    fig.colorbar(axes[0].collections[0], ax=axes, label="speedup (×): other time / candidate time", shrink=0.8)
    title = f"{candidate[0]} {candidate[1]} speedup on {device} (measured); empty cell: the other side was not timed"
    return _finish(fig, title, provenance_line)


def plot_roofline_intensity(
    frame: pd.DataFrame, gpu: GpuSpec, device: str, provenance_line: str | None = None
) -> Figure:
    """Achieved TFLOP/s against useful FLOPs per unique byte (log-log) under `gpu`'s ceilings:
    the HBM slope and the FP8 roof. Intensity depends on next_n alone (top axis), so a kernel
    that reads KV once moves right with next_n until the FP8 MMA, not HBM, bounds it."""
    data = ok_rows(frame).dropna(subset=["flops", "unique_bytes"])
    if data.empty:
        raise ValueError("frame: no timed rows with roofline columns (flops, unique_bytes)")
    data = data.assign(intensity=data["flops"] / data["unique_bytes"], tflops=data["flops"] / (data["median_ms"] * 1e9))
    data["label"] = data["series"].where(data["source"] == "measured", data["series"] + ": " + MODELED_LABEL)
    fig, ax = plt.subplots(figsize=(10, 5.5), constrained_layout=True)
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
    labels = sorted(data["label"].unique(), key=lambda label: _series_key(label.split(": ")[0]))
    colours = _palette(list(data["series"].unique()))
    sns.scatterplot(data=data, x="intensity", y="tflops", hue="label", hue_order=labels,
                    palette={lab: colours[lab.split(": ")[0]] for lab in labels}, style="source",
                    markers={"measured": "o", "modeled": "X"}, size="batch", sizes=(20, 120), alpha=0.8, ax=ax)  # fmt: skip
    ax.set(xscale="log", yscale="log", xlim=(low, high), xlabel="arithmetic intensity (useful FLOPs / unique bytes)",
           ylabel="achieved TFLOP/s (useful FLOPs / median time)")  # fmt: skip
    ticks = data.groupby("next_n")["intensity"].median()
    top = ax.secondary_xaxis("top")
    top.set_xticks(ticks.to_numpy(), [str(n) for n in ticks.index], fontsize=8)
    top.minorticks_off()
    top.set_xlabel("next_n (at its median intensity)", fontsize=9)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ceilings = "measured" if gpu.measured else "datasheet"
    title = f"Roofline on {device} ({_sources_label(data)} points); ceilings: {gpu.name} ({ceilings} ceilings)"
    return _finish(fig, title, provenance_line)


def plot_modeled_sm100(
    frame: pd.DataFrame, batch: int, context: str, device: str, provenance_line: str | None = None,
    candidate: tuple[str, str] = CANDIDATE, baseline: str = BASELINE,
) -> Figure:  # fmt: skip
    """Bars per next_n: measured times on `device` (solid) beside modeled native times on other
    GPUs (grey, hatched), from `modeled_vs_measured`."""
    table = modeled_vs_measured(frame, batch, context, candidate, baseline)
    measured = [c for c in table.columns if not c.endswith(MODELED_LABEL)]
    modeled = [c for c in table.columns if c.endswith(MODELED_LABEL)]
    deep = sns.color_palette("deep")
    colours = dict(zip(measured, (deep[0], deep[1], deep[3])))
    colours.update(zip(modeled, sns.color_palette("Greys", len(modeled) + 1)[1:]))
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(table)), 5), constrained_layout=True)
    width = 0.8 / len(table.columns)
    for i, column in enumerate(table.columns):
        is_modeled = column in modeled
        ax.bar(np.arange(len(table)) + (i - (len(table.columns) - 1) / 2) * width, table[column], width,
               color=colours[column], hatch="//" if is_modeled else None, edgecolor="0.25" if is_modeled else "white",
               linestyle="--" if is_modeled else "-", label=column)  # fmt: skip
    ax.set_xticks(np.arange(len(table)), [str(n) for n in table.index])
    ax.set(xlabel="next_n", ylabel="kernel time per decode step (µs)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    kind = "measured vs SM100 " if measured else ""
    title = f"{device} {kind}{MODELED_LABEL if modeled else 'measured'}: batch={batch}, context={context}"
    return _finish(fig, title, provenance_line)


# ---------------------------------------------------------------- reading


def reading(comparison: pd.DataFrame, batch: int, context: str, device: str,
            candidate: tuple[str, str] = CANDIDATE, baseline: str = BASELINE) -> str:  # fmt: skip
    """Markdown: per next_n at (batch, context) the candidate's time, its speedups and share of the
    floor; then the whole run in one line. Every number comes from `comparison`."""
    name = f"{candidate[0]} {candidate[1]}"
    here = comparison[(comparison["batch"] == batch) & (comparison["context"] == context)]
    lines = [f"**{name} on {device}, batch={batch}, context={context} (measured):**", ""]
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
        )  # fmt: skip
        .background_gradient(subset=speedups, cmap="RdBu", vmin=0.5, vmax=1.5)
        .hide(axis="index")
    )
