"""Kernel latency against next_n: the charts and the decision table of notebook 02.

Input is a run's results frame (`dsa_lab.store.load_run(...).results`); only rows with
status 'ok' are drawn, and one shape (heads, head_dim, cache dtype) at a time. Rows carry
`source`: measured rows are solid with round markers, modeled rows (roofline times at a
GPU's ceilings, built by `dsa_lab.analysis.modeled`) are dashed with X markers, and both
legend and title say which is which. The frames come from `dsa_lab.analysis.frames`;
nothing here times or models anything.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from pandas.io.formats.style import Styler

from dsa_lab.analysis.frames import SM90_DEEPGEMM, context_order, ok_rows, vllm_choice
from dsa_lab.policy import Platform
from dsa_lab.roofline import GpuSpec

STRATEGY_ORDER = ("native", "atom", "flatten")
SOURCE_DASHES = {"measured": "", "modeled": (4, 2)}
_context_order = context_order  # the name explorers import
__all__ = ["SM90_DEEPGEMM", "STRATEGY_ORDER", "ok_rows", "vllm_choice"]  # re-exported for the explorers


def _series_palette(data: pd.DataFrame) -> tuple[list[str], dict[str, tuple[float, float, float]]]:
    """Series ordered by strategy then backend, with one colour each (stable across charts)."""
    series = sorted(data["series"].unique(), key=lambda s: (STRATEGY_ORDER.index(s.split(" ")[0]), s))
    return series, dict(zip(series, sns.color_palette("tab10", len(series))))


def _sources_label(frame: pd.DataFrame) -> str:
    return " + ".join(s for s in ("measured", "modeled") if s in set(frame["source"]))


def plot_latency(frame: pd.DataFrame, device: str) -> sns.FacetGrid:
    """Median kernel time vs next_n: hue = strategy (backend), facets = batch x context.

    The shaded band is the interquartile range of the samples; modeled rows are dashed.
    """
    data = ok_rows(frame)
    if data.empty:
        raise ValueError("frame: no rows with status 'ok' to draw")
    contexts = _context_order(data["context"])
    series, palette = _series_palette(data)
    grid = sns.relplot(
        data=data, x="next_n", y="kernel_us", hue="series", hue_order=series, palette=palette,
        style="source", dashes=SOURCE_DASHES, markers={"measured": "o", "modeled": "X"},
        row="batch", col="context", col_order=contexts, kind="line", height=2.6, aspect=1.25,
        facet_kws={"sharey": False, "margin_titles": True},
    )  # fmt: skip
    for (batch, context), ax in grid.axes_dict.items():
        part = data[(data["batch"] == batch) & (data["context"] == context) & data["p25_ms"].notna()]
        for name, rows in part.groupby("series"):
            rows = rows.sort_values("next_n")
            ax.fill_between(rows["next_n"], rows["p25_ms"] * 1e3, rows["p75_ms"] * 1e3,
                            color=palette[name], alpha=0.2, linewidth=0)  # fmt: skip
        ax.set_xticks(sorted(data["next_n"].unique()))
    grid.set_axis_labels("next_n", "kernel time (µs, median)")
    sns.move_legend(grid, "upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, title=None, frameon=False)
    grid.figure.suptitle(f"Paged MQA-logits kernel time vs next_n on {device} ({_sources_label(data)})", y=1.02)
    return grid


def speedup_table(frame: pd.DataFrame, baseline: str = "flatten") -> pd.DataFrame:
    """Per backend and point: `baseline` time / strategy time (> 1: the strategy is faster)."""
    data = ok_rows(frame)
    keys = ["source", "backend", "batch", "context", "next_n"]
    base = data[data["strategy"] == baseline].set_index(keys)["median_ms"].rename("baseline_ms")
    others = data[data["strategy"] != baseline].join(base, on=keys, how="inner")
    others["speedup"] = others["baseline_ms"] / others["median_ms"]
    return others[[*keys, "strategy", "median_ms", "baseline_ms", "speedup"]].reset_index(drop=True)


def plot_speedup(frame: pd.DataFrame, device: str, baseline: str = "flatten") -> Figure:
    """Heatmaps of the speedup over `baseline`, one per (source, backend, strategy): rows
    batch x context, columns next_n; blue = faster than flatten, red = slower."""
    table = speedup_table(frame, baseline)
    if table.empty:
        raise ValueError(f"frame: no point has both '{baseline}' and another strategy timed ok")
    panels = list(table.groupby(["source", "backend", "strategy"], sort=True))
    lo, hi = float(table["speedup"].min()), float(table["speedup"].max())
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.95), vmax=max(hi, 1.05))
    contexts = _context_order(table["context"])
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    width = columns * (4 + 0.55 * table["next_n"].nunique())
    height = rows * (1.2 + 0.38 * table.groupby(["batch", "context"]).ngroups)
    fig, axes = plt.subplots(rows, columns, figsize=(width, height), squeeze=False, constrained_layout=True)
    for ax, ((source, backend, strategy), part) in zip(axes.flat, panels):
        grid = part.pivot_table(index=["batch", "context"], columns="next_n", values="speedup")
        order = [(b, c) for b in sorted(part["batch"].unique()) for c in contexts if (b, c) in grid.index]
        grid = grid.reindex(order)
        grid.index = [f"B={b}, {c}" for b, c in grid.index]
        sns.heatmap(grid, annot=True, fmt=".2f", cmap="RdBu", norm=norm, ax=ax, linewidths=0.5,
                    linecolor="white", cbar=False)  # fmt: skip
        ax.set_title(f"{strategy} vs {baseline}\n{backend}, {source}")
        ax.set_xlabel("next_n")
        ax.set_ylabel("batch, context")
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    fig.colorbar(axes.flat[0].collections[0], ax=axes, label=f"speedup over {baseline} (×)", shrink=0.8)
    fig.suptitle(f"Speedup over {baseline} on {device} ({_sources_label(table)}); empty cells: not run or skipped")
    return fig


def plot_roofline(frame: pd.DataFrame, gpu: GpuSpec, device: str) -> Figure:
    """Left: achieved FP8 TFLOP/s against arithmetic intensity under `gpu`'s roofline.
    Right: the time floor (must-move bytes, no re-reads) as a % of the kernel's time."""
    data = ok_rows(frame).dropna(subset=["flops", "strategy_bytes"])
    if data.empty:
        raise ValueError("frame: no timed rows with roofline columns (flops, strategy_bytes)")
    data = data.assign(
        intensity=data["flops"] / data["strategy_bytes"],
        tflops=data["flops"] / (data["median_ms"] * 1e9),
        floor_pct=100 * data["floor_ms"] / data["median_ms"],
    )
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5), constrained_layout=True)
    ridge = gpu.fp8_tflops / gpu.hbm_tbps
    low, high = min(data["intensity"].min(), ridge) / 2, max(data["intensity"].max(), ridge) * 2
    span = np.logspace(np.log10(low), np.log10(high), 200)
    left.plot(span, np.minimum(gpu.fp8_tflops, span * gpu.hbm_tbps), color="black", linewidth=1.5,
              label=f"roofline {gpu.name}: {gpu.hbm_tbps:g} TB/s, {gpu.fp8_tflops:g} TFLOP/s")  # fmt: skip
    series, palette = _series_palette(data)
    style = dict(hue="series", hue_order=series, palette=palette, style="source")
    sns.scatterplot(data=data, x="intensity", y="tflops", size="batch", ax=left, alpha=0.8,
                    markers={"measured": "o", "modeled": "X"}, **style)  # fmt: skip
    left.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte the strategy reads)",
             ylabel="achieved TFLOP/s", title="roofline")  # fmt: skip
    left.legend(fontsize=7, loc="lower right")
    floor = data.dropna(subset=["floor_pct"])
    if floor.empty:
        right.text(0.5, 0.5, "no floor: no roofline row for this device", ha="center", transform=right.transAxes)
    else:
        sns.lineplot(data=floor, x="next_n", y="floor_pct", errorbar=("pi", 50), ax=right, dashes=SOURCE_DASHES,
                     markers={"measured": "o", "modeled": "X"}, **style)  # fmt: skip
        right.axhline(100, color="black", linestyle=":", label="at the floor")
        right.set_xticks(sorted(floor["next_n"].unique()))
        right.legend(fontsize=7)
    right.set(xlabel="next_n", ylabel="floor / kernel time (%)",
              title="floor (KV read once) as % of the time: median, IQR band over batch x context")  # fmt: skip
    fig.suptitle(f"Achieved rate against the roofline on {device} ({_sources_label(data)})")
    return fig


def decision_table(frame: pd.DataFrame, backend: str, platform: Platform = SM90_DEEPGEMM) -> pd.DataFrame:
    """Per (next_n, batch, context): the fastest strategy on `backend` beside vLLM 0.33's choice.

    `vllm_slowdown` = vLLM's time / the fastest; `significant` (measured rows only, else
    None) when vLLM's 25th percentile lies above the fastest one's 75th, i.e. the gap is
    larger than the measured spread.
    """
    data = ok_rows(frame)
    available = sorted(data["backend"].unique())
    if backend not in available:
        raise ValueError(f"backend={backend!r}: no timed rows; allowed values are {available}")
    data = data[data["backend"] == backend]
    rows = []
    for (n, batch, context), part in data.groupby(["next_n", "batch", "context"]):
        best = part.loc[part["median_ms"].idxmin()]
        choice = vllm_choice(int(n), platform)
        chosen = part[part["strategy"] == choice]
        vllm_us = float(chosen["median_ms"].iloc[0] * 1e3) if not chosen.empty else np.nan
        rows.append({
            "next_n": int(n), "batch": int(batch), "context": context, "source": best["source"],
            "recommended": best["strategy"], "recommended_us": best["median_ms"] * 1e3,
            "vllm_0_33": choice, "vllm_us": vllm_us, "vllm_slowdown": vllm_us / (best["median_ms"] * 1e3),
            "significant": (bool(not chosen.empty and chosen["p25_ms"].iloc[0] > best["p75_ms"])
                            if best["source"] == "measured" else None),
            "strategies_timed": ", ".join(sorted(part["strategy"])),
        })  # fmt: skip
    table = pd.DataFrame(rows)
    order = {c: i for i, c in enumerate(_context_order(table["context"]))}
    table = table.sort_values(["next_n", "batch", "context"], key=lambda s: s.map(order) if s.name == "context" else s)
    return table.reset_index(drop=True)


def _points(count: int) -> str:
    return f"{count} point{'' if count == 1 else 's'}"


def reading(table: pd.DataFrame, device: str, backend: str) -> str:
    """A short markdown reading of `decision_table`, every number taken from it."""
    if table.empty:
        return f"No point on {device} has a timed decision for backend {backend}."
    known = table.dropna(subset=["vllm_us"])
    agree = known[known["recommended"] == known["vllm_0_33"]]
    worse = known[(known["recommended"] != known["vllm_0_33"])].sort_values("vllm_slowdown", ascending=False)
    sources = " + ".join(sorted(table["source"].unique()))
    measured = worse[worse["source"] == "measured"]
    spread = f" ({int(measured['significant'].sum())} of them beyond the measured spread)" if len(measured) else ""
    lines = [
        f"**{backend} on {device} ({sources})**: {_points(len(table))} (next_n x batch x context). "
        f"vLLM 0.33's choice was timed in {len(known)}; it is the fastest strategy in {len(agree)} of them "
        f"and not in {len(worse)}{spread}."
    ]
    missing = table[table["vllm_us"].isna()]
    if not missing.empty:
        first = missing.iloc[0]
        lines.append(f"In {_points(len(missing))} vLLM's choice was not timed here (e.g. next_n={first['next_n']}: "
                     f"'{first['vllm_0_33']}', timed: {first['strategies_timed']}).")  # fmt: skip
    for row in worse.head(5).itertuples():
        within = pd.notna(row.significant) and not row.significant
        lines.append(
            f"- next_n={row.next_n}, batch={row.batch}, context={row.context}: vLLM takes **{row.vllm_0_33}** "
            f"({row.vllm_us:.1f} µs); **{row.recommended}** takes {row.recommended_us:.1f} µs, "
            f"{row.vllm_slowdown:.2f}x faster{' (within the measured spread)' if within else ''}."
        )
    if len(worse) > 5:
        lines.append(f"- ... and {len(worse) - 5} more (see the table below).")
    per_n = worse.groupby("next_n")["vllm_slowdown"].agg(["count", "max"])
    if not per_n.empty:
        parts = [f"next_n={n}: {_points(int(r['count']))}, up to {r['max']:.2f}x" for n, r in per_n.iterrows()]
        lines.append("By next_n, where vLLM's choice loses: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def style_decision_table(table: pd.DataFrame) -> Styler:
    """The decision table for display: times in µs, vLLM's slowdown shaded (white = it is the fastest)."""
    return (
        table.style.format({"recommended_us": "{:.1f}", "vllm_us": "{:.1f}", "vllm_slowdown": "{:.2f}x"}, na_rep="—")
        .background_gradient(subset=["vllm_slowdown"], cmap="Reds", vmin=1.0)
        .hide(axis="index")
    )


def plot_run_to_run(comparison: pd.DataFrame, device: str, label_a: str, label_b: str) -> Figure:
    """Distribution of the second run's median over the first's, per backend: the noise floor of every ratio."""
    data = comparison.assign(change_pct=(comparison["ratio"] - 1.0) * 100.0)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    sns.histplot(data=data, x="change_pct", hue="backend", multiple="stack", bins=40, ax=ax)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"median of {label_b} vs {label_a} (%; > 0: second call slower)")
    ax.set_ylabel("points")
    spread = data["change_pct"].abs()
    ax.set_title(
        f"{device}, measured: run-to-run spread over {len(data)} points "
        f"(median |change| {spread.median():.2f} %, max {spread.max():.2f} %)"
    )
    fig.tight_layout()
    return fig
