"""Kernel latency against next_n: the charts and the decision table of notebook 02.

Input is a run's results frame (`dsa_lab.store.load_run(...).results`); only rows with
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
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator, NullLocator
from pandas.io.formats.style import Styler

from dsa_lab.analysis.frames import SM90_DEEPGEMM, context_order, ok_rows, speedup_over_vllm, vllm_choice
from dsa_lab.markup import md_text
from dsa_lab.plots.style import (
    MODELED,
    MODELED_HATCH,
    STRATEGY_ORDER,
    VLLM_RELEASE,
    add_footer,
    chart_text,
    legend_outside,
    series_label,
    series_style,
    strategy_color,
)
from dsa_lab.policy import Platform
from dsa_lab.workload import ContextSpec

_context_order = context_order  # the name explorers import
__all__ = ["SM90_DEEPGEMM", "STRATEGY_ORDER", "ok_rows", "vllm_choice"]  # re-exported for the explorers
SPEEDUP_TICKS = (0.25, 0.33, 0.5, 0.67, 1.0, 1.5, 2.0, 3.0, 4.0)


def _sources_label(frame: pd.DataFrame) -> str:
    return " + ".join(s for s in ("measured", "modeled") if s in set(frame["source"]))


def context_title(label: str) -> str:
    """'65536' -> '64K'; 'mixed:1024-65536' -> 'mixed 1K-64K' (tokens cached per request)."""
    return ContextSpec.parse(label).short


def few_contexts(labels: Sequence[str], focus: str | None = None) -> list[str]:
    """The columns of the small multiples: the shortest uniform context, `focus` (else the
    longest uniform one) and every mixed one."""
    ordered = _context_order(labels)
    uniform = [c for c in ordered if not ContextSpec.parse(c).mixed]
    focus = ContextSpec.parse(focus).label if focus else None
    chosen = [uniform[0], focus if focus in uniform else uniform[-1]] if uniform else []
    return list(dict.fromkeys([*chosen, *(c for c in ordered if ContextSpec.parse(c).mixed)]))


def plot_vs_vllm(
    frame: pd.DataFrame, device: str, provenance_line: str | None = None, backend: str = "deepgemm",
    contexts: Sequence[str] | None = None, platform: Platform = SM90_DEEPGEMM,
) -> Figure:  # fmt: skip
    """Small multiples (rows: batch, columns: `contexts`) of every measured series' speedup
    over what vLLM 0.33 runs at the same point (its strategy, timed on `backend`), on one
    shared log scale: above 1 the series is faster than vLLM's choice, below it slower."""
    data = speedup_over_vllm(frame, backend, platform).dropna(subset=["speedup"])
    if data.empty:
        raise ValueError(f"frame: no measured point has vLLM's strategy timed on backend={backend!r}")
    contexts = list(contexts) if contexts else _context_order(data["context"])
    data = data[data["context"].isin(contexts)]
    batches = sorted(int(b) for b in data["batch"].unique())
    fig, axes = plt.subplots(len(batches), len(contexts), figsize=(3.3 * len(contexts) + 2.6, max(4.5, 2.3 * len(batches) + 1)),
                             sharex=True, sharey=True, squeeze=False, constrained_layout=True)  # fmt: skip
    series = sorted(data.groupby(["strategy", "backend"]).groups, key=lambda k: (k[1], STRATEGY_ORDER.index(k[0])))
    for (i, batch), (j, context) in ((r, c) for r in enumerate(batches) for c in enumerate(contexts)):
        ax = axes[i, j]
        part = data[(data["batch"] == batch) & (data["context"] == context)]
        ax.axhline(1.0, color="black", linewidth=1.2, zorder=1)
        for strategy, name in series:
            rows = part[(part["strategy"] == strategy) & (part["backend"] == name)].sort_values("next_n")
            ax.plot(rows["next_n"], rows["speedup"], markersize=4.5, linewidth=1.6, label=series_label(strategy, name),
                    **series_style(strategy, name))  # fmt: skip
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
    fig.suptitle(f"Speedup over what {VLLM_RELEASE} runs, measured on {chart_text(device)}\n"
                 "one y scale for every panel; above the black line: faster")  # fmt: skip
    return add_footer(fig, provenance_line)


def speedup_table(frame: pd.DataFrame, baseline: str = "flatten") -> pd.DataFrame:
    """Per backend and point: `baseline` time / strategy time (> 1: the strategy is faster)."""
    data = ok_rows(frame)
    keys = ["source", "backend", "batch", "context", "next_n"]
    base = data[data["strategy"] == baseline].set_index(keys)["median_ms"].rename("baseline_ms")
    others = data[data["strategy"] != baseline].join(base, on=keys, how="inner")
    others["speedup"] = others["baseline_ms"] / others["median_ms"]
    return others[[*keys, "strategy", "median_ms", "baseline_ms", "speedup"]].reset_index(drop=True)


def plot_speedup(
    frame: pd.DataFrame, device: str, baseline: str = "flatten", provenance_line: str | None = None,
    source: str = "measured",
) -> Figure:  # fmt: skip
    """Heatmaps of the speedup over `baseline` for one `source` (measured or modeled: never on
    one colour scale), a panel per (backend, strategy): rows batch x context, columns next_n;
    blue = faster than `baseline`, red = slower."""
    table = speedup_table(frame, baseline)
    table = table[table["source"] == source]
    if table.empty:
        raise ValueError(f"frame: no {source} point has both '{baseline}' and another strategy timed ok")
    panels = list(table.groupby(["backend", "strategy"], sort=True))
    panels.sort(key=lambda kv: (kv[0][0], STRATEGY_ORDER.index(kv[0][1])))
    lo, hi = float(table["speedup"].min()), float(table["speedup"].max())
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.95), vmax=max(hi, 1.05))
    contexts = _context_order(table["context"])
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    width = columns * (3.2 + 0.5 * table["next_n"].nunique()) + 1.5
    height = max(3.8, rows * (1.6 + 0.3 * table.groupby(["batch", "context"]).ngroups))
    fig, axes = plt.subplots(rows, columns, figsize=(width, height), squeeze=False, constrained_layout=True)
    for index, (ax, ((backend, strategy), part)) in enumerate(zip(axes.flat, panels)):
        grid = part.pivot_table(index=["batch", "context"], columns="next_n", values="speedup")
        order = [(b, c) for b in sorted(part["batch"].unique()) for c in contexts if (b, c) in grid.index]
        grid = grid.reindex(order)
        grid.index = [f"B={b}, {context_title(c)}" for b, c in grid.index]
        sns.heatmap(grid, annot=True, fmt=".2f", cmap="RdBu", norm=norm, ax=ax, linewidths=0.5, linecolor="white",
                    cbar=False, annot_kws={"fontsize": 8}, yticklabels=index % columns == 0)  # fmt: skip
        label = series_label(strategy, backend, source)
        ax.set_title(f"{label}\nvs {baseline}", color=strategy_color(strategy), fontsize=10)
        ax.set_xlabel("next_n")
        ax.set_ylabel("batch, context" if index % columns == 0 else "")
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    what = f"{source} speedup over {baseline} (×)" + (" — roofline model, not measured" if source == MODELED else "")
    fig.colorbar(axes.flat[0].collections[0], ax=axes, label=what, shrink=0.8)
    title = (f"Speedup over {baseline} on {chart_text(device)}, {source}" + (" (roofline at the run's ceilings; its own colour "
             "scale)" if source == MODELED else "") + "; empty cells: not run or skipped")  # fmt: skip
    fig.suptitle(title)
    return add_footer(fig, provenance_line)


def plot_modeled_speedup(frame: pd.DataFrame, device: str, baseline: str = "flatten") -> Figure:
    """The roofline model's speedup over `baseline` on a colour scale of its own, cells hatched:
    a row per (model, strategy), columns next_n, each cell the median over the batch x context
    points modeled (the title gives the largest spread among them)."""
    table = speedup_table(frame, baseline)
    table = table[table["source"] == MODELED]
    if table.empty:
        raise ValueError(f"frame: no modeled point has both '{baseline}' and another strategy")
    keys = ["backend", "strategy", "next_n"]
    spread = float(table.groupby(keys)["speedup"].agg(lambda s: s.max() - s.min()).max())
    grid = table.pivot_table(index=["backend", "strategy"], columns="next_n", values="speedup", aggfunc="median")
    grid = grid.reindex(sorted(grid.index, key=lambda k: (k[0], STRATEGY_ORDER.index(k[1]))))
    rows = list(grid.index)
    names = [backend.removeprefix("model (").removesuffix(")") for backend, _ in rows]  # 'B200, deepgemm'
    grid.index = [f"{strategy} · {name} ({MODELED})" for (_, strategy), name in zip(rows, names)]
    fig, ax = plt.subplots(figsize=(4.5 + 0.8 * grid.shape[1], 1.9 + 0.55 * len(grid)), constrained_layout=True)
    sns.heatmap(grid, annot=True, fmt=".2f", cmap="Purples", vmin=1.0, ax=ax, linewidths=0.5, linecolor="white",
                cbar_kws={"label": f"{MODELED} speedup (×)"})  # fmt: skip
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
    ax.set_title(f"Speedup over {baseline}, {MODELED} at {gpus} ceilings, not measured\n"
                 f"median over the {points} batch × context points of {chart_text(device)} (they differ by ≤ {spread:.2f})",
                 fontsize=10)  # fmt: skip
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
        return f"No point on {md_text(device)} has a timed decision for backend {md_text(backend)}."
    known = table.dropna(subset=["vllm_us"])
    agree = known[known["recommended"] == known["vllm_0_33"]]
    worse = known[(known["recommended"] != known["vllm_0_33"])].sort_values("vllm_slowdown", ascending=False)
    sources = " + ".join(sorted(table["source"].unique()))
    measured = worse[worse["source"] == "measured"]
    spread = f" ({int(measured['significant'].sum())} of them beyond the measured spread)" if len(measured) else ""
    lines = [
        f"**{md_text(backend)} on {md_text(device)} ({sources})**: {_points(len(table))} (next_n x batch x context). "
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
        table.style.format(
            {"recommended_us": "{:.1f}", "vllm_us": "{:.1f}", "vllm_slowdown": "{:.2f}x"}, na_rep="—", escape="html"
        )
        .background_gradient(subset=["vllm_slowdown"], cmap="Reds", vmin=1.0)
        .hide(axis="index")
    )


def plot_run_to_run(
    comparison: pd.DataFrame, device: str, label_a: str, label_b: str, provenance_line: str | None = None
) -> Figure:
    """Distribution of the second run's median over the first's, per backend: the noise floor of every ratio."""
    data = comparison.assign(change_pct=(comparison["ratio"] - 1.0) * 100.0)
    backends = sorted(data["backend"].unique())
    greys = dict(zip(backends, sns.color_palette("Greys_r", len(backends) + 2)))
    fig, ax = plt.subplots(figsize=(10, 3.8), constrained_layout=True)
    sns.histplot(data=data, x="change_pct", hue="backend", hue_order=backends, palette=greys, multiple="stack",
                 bins=40, ax=ax, legend=False, alpha=1.0)  # fmt: skip
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
