"""Notebook 05's charts: the indexer's share of a decode step, MTP throughput per strategy,
and the performance model against measurements. Drawing only: frames come from
`dsa_lab.analysis.e2e` and `dsa_lab.model.calibration`.

Modeled numbers say 'modeled' in every title; where the indexer's own time was measured
(H200 sweep) its marker is filled, where it was modeled it is hollow.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter
from pandas.io.formats.style import Styler

from dsa_lab.plots.style import STRATEGY_COLORS, VLLM_MARKER, backend_marker
from dsa_lab.plots.tables import FoldedTable, folded

LABEL_COLORS = {**STRATEGY_COLORS, "dsa_lab kernel": "#9467bd", "vLLM 0.33": "black"}
LABEL_LINES = {"vLLM 0.33": ":", "dsa_lab kernel": "--"}
COMPONENT_COLORS = {  # no strategy's colour: a part of the step is never read as native, atom or flatten
    "indexer logits": "#ff7f0e",
    "indexer (MTP drafts)": "#ffbb78",
    "indexer top-k": "#e6ab02",
    "sparse MLA": "#9467bd",
    "attention weights": "#c5b0d5",
    "MoE experts": "#8c564b",
    "MoE all-to-all": "#c49c94",
    "dense MLP": "#bcbd22",
    "LM head": "#7f7f7f",
    "MTP draft layers + LM head": "#c7c7c7",
}


def _context_axis(ax: plt.Axes, contexts: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(contexts), [f"{c // 1024}K" for c in contexts])
    ax.minorticks_off()
    ax.set_xlabel("context (cached tokens a request)")


def _marker_faces(frame: pd.DataFrame, color: str) -> list[str]:
    return [color if s == "measured" else "white" for s in frame["indexer_source"]]


def plot_indexer_share(shares: pd.DataFrame) -> Figure:
    """One panel per GPU: the indexer's share of a modeled decode step against context, a line per batch."""
    gpus = list(dict.fromkeys(shares["gpu"]))
    fig, axes = plt.subplots(1, len(gpus), figsize=(5.2 * len(gpus), 4.2), sharey=True, constrained_layout=True)
    axes = np.atleast_1d(axes)
    batches = sorted(shares["batch"].unique())
    colours = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(batches)))
    for ax, gpu in zip(axes, gpus):
        part = shares[shares["gpu"] == gpu]
        for colour, batch in zip(colours, batches):
            line = part[part["batch"] == batch].sort_values("context")
            ax.plot(line["context"], 100 * line["indexer_share"], color=colour, label=f"B = {batch}")
            ax.scatter(
                line["context"],
                100 * line["indexer_share"],
                s=36,
                zorder=3,
                edgecolors=colour,
                facecolors=_marker_faces(line, colour),
            )
        _context_axis(ax, sorted(part["context"].unique()))
        measured = (part["indexer_source"] == "measured").any()
        ax.set_title(f"{gpu}: step modeled, indexer {'measured (filled) / ' if measured else ''}modeled")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("indexer share of the decode step (%)")
    axes[-1].legend(title="requests a GPU", loc="upper left")
    fig.suptitle("How much of a DeepSeek-V3.2 decode step is the indexer (modeled, next_n = 1)")
    return fig


def plot_step_breakdown(steps: pd.DataFrame, components: Sequence[str]) -> Figure:
    """Stacked bars: where a modeled decode step's time goes, one bar per (GPU, context)."""
    present = [c for c in components if c in steps.columns and steps[c].fillna(0).gt(0).any()]
    labels = [f"{r.gpu}\n{r.context // 1024}K" for r in steps.itertuples()]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(steps) + 3.5), 4.4), constrained_layout=True)
    bottom = np.zeros(len(steps))
    for name in present:
        values = steps[name].fillna(0).to_numpy() / 1e3
        ax.bar(labels, values, bottom=bottom, color=COMPONENT_COLORS.get(name, "#17becf"), label=name)
        bottom += values
    for x, (total, share) in enumerate(zip(bottom, steps["indexer_share"])):
        ax.annotate(f"{share:.0%}", (x, total), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    ax.set_ylabel("ms a step (modeled)")
    batch, next_n = int(steps["batch"].iloc[0]), int(steps["next_n"].iloc[0])
    ax.set_title(f"Where a decode step goes, B = {batch}, next_n = {next_n} (modeled; % = indexer)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def plot_tokens_per_second(throughput: pd.DataFrame, contexts: Sequence[int]) -> Figure:
    """Tokens per second against next_n, one panel per context, a line per strategy."""
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.5), constrained_layout=True)
    axes = np.atleast_1d(axes)
    for ax, context in zip(axes, contexts):
        part = throughput[throughput["context"] == context]
        for label, line in part.groupby("strategy", sort=False):
            line = line.sort_values("next_n")  # a missing launch (SM90 native n = 3) stays a gap in the line
            colour = LABEL_COLORS.get(label, "#17becf")
            ax.plot(
                line["next_n"],
                line["tokens_per_s"],
                color=colour,
                linestyle=LABEL_LINES.get(label, "-"),
                label=label,
                zorder=5 if label == "vLLM 0.33" else 2,
            )
            timed = line.dropna(subset=["tokens_per_s"])
            ax.scatter(
                timed["next_n"],
                timed["tokens_per_s"],
                s=28,
                edgecolors=colour,
                facecolors=_marker_faces(timed, colour),
                zorder=6,
            )
        ax.set_title(f"{context // 1024}K tokens")
        ax.set_xlabel("next_n (1 + drafts)")
        ax.set_xticks(sorted(part["next_n"].unique()))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens / s a GPU (modeled)")
    axes[-1].legend(fontsize=8)
    row = throughput.iloc[0]
    fig.suptitle(
        f"MTP throughput, {row.gpu}, B = {row.batch}, acceptance '{row.preset}' "
        "(modeled step; filled: indexer measured)"
    )
    return fig


def plot_best_next_n(best: pd.DataFrame) -> Figure:
    """Strategy x context: the best next_n (number) and its gain over no MTP (colour)."""
    grid = best.pivot(index="strategy", columns="context", values="gain_over_no_mtp")
    numbers = best.pivot(index="strategy", columns="context", values="next_n")
    fig, ax = plt.subplots(figsize=(1.0 * grid.shape[1] + 3, 0.55 * grid.shape[0] + 1.6), constrained_layout=True)
    values = grid.to_numpy()
    image = ax.imshow(values, cmap="Greens", aspect="auto")
    middle = (np.nanmin(values) + np.nanmax(values)) / 2
    for (i, j), n in np.ndenumerate(numbers.to_numpy()):
        ax.text(
            j,
            i,
            f"{int(n)}",
            ha="center",
            va="center",
            fontsize=11,
            color="white" if values[i, j] > middle else "black",
        )
    ax.grid(False)
    ax.set_xticks(range(grid.shape[1]), [f"{c // 1024}K" for c in grid.columns])
    ax.set_yticks(range(grid.shape[0]), grid.index)
    fig.colorbar(image, ax=ax, label="tokens/s over next_n = 1")
    row = best.iloc[0]
    ax.set_title(f"Best next_n per context, {row.gpu}, '{row.preset}' (modeled)")
    return fig


def plot_model_vs_measured(errors: pd.DataFrame, published: pd.DataFrame) -> Figure:
    """Left: modeled against measured for every H200 point. Right: modeled DeepGEMM against
    TensorRT-LLM #13219's published SM100 times (and their CuTe kernel)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), constrained_layout=True)
    for (backend, strategy), part in errors.groupby(["backend", "strategy"]):
        left.scatter(
            part["measured_us"],
            part["modeled_us"],
            s=14,
            alpha=0.7,
            color=STRATEGY_COLORS.get(strategy),
            marker=backend_marker(backend),
            label=f"{strategy} ({backend})",
        )
    low, high = errors["measured_us"].min() * 0.8, errors["measured_us"].max() * 1.25
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
    left.plot([low, high], [low, high], color="black", linewidth=0.8)
    median, worst = errors["error"].abs().median(), errors["error"].abs().max()
    left.set_title(f"H200: modeled vs measured, {len(errors)} points\n|error| median {median:.1%}, worst {worst:.0%}")
    left.set_xlabel("measured µs (H200 sweep)")
    left.set_ylabel("modeled µs")
    left.legend(fontsize=7)
    right.scatter(
        published["published_deepgemm_us"],
        published["modeled_deepgemm_us"],
        color="#8c564b",
        label="DeepGEMM: modeled vs published",
    )
    right.scatter(
        published["published_deepgemm_us"],
        published["published_cute_us"],
        color="#ff7f0e",
        marker="x",
        label="CuTe DSL (published) vs DeepGEMM (published)",
    )
    headline = published[(published["batch"] == 32) & (published["context"] == 16384)].iloc[0]
    right.scatter(
        [headline.published_deepgemm_us],
        [headline.modeled_deepgemm_us],
        **{**VLLM_MARKER, "s": 60, "facecolors": "black"},
        label=f"B=32, 16K: {headline.modeled_deepgemm_us:.1f} modeled vs {headline.published_deepgemm_us} µs",
    )
    lo, hi = 3, max(published["modeled_deepgemm_us"].max(), published["published_deepgemm_us"].max()) * 1.2
    right.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
    right.set_title("SM100: model (B200) vs TensorRT-LLM #13219, next_n = 3")
    for axis in (right.xaxis, right.yaxis):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    right.set_xticks([4, 6, 10, 20])
    right.set_yticks([4, 6, 10, 20])
    right.set_xlabel("published DeepGEMM µs")
    right.set_ylabel("µs")
    right.legend(fontsize=7)
    return fig


def style_error_summary(summary: pd.DataFrame) -> Styler:
    """`calibration.error_summary` for display: errors as percentages, no index."""
    formats = {"median_abs_error": "{:.1%}", "worst_abs_error": "{:.1%}"}
    return summary.style.format(formats, escape="html").hide(axis="index")


def style_ceilings(table: pd.DataFrame) -> FoldedTable:
    """`analysis.e2e.ceilings_table` for display: one row per GPU (each ceiling with its unit, this project's
    measurement beside the spec where there is one), every ceiling with its source folded below."""
    names = {"sms": "SMs", "l2_mb": "L2", "hbm_tbps": "HBM", "fp8_tflops": "FP8", "fp32_tflops": "FP32",
             "nvlink_gbs": "NVLink each way", "fp4_tflops": "FP4"}  # fmt: skip
    header = table["ceiling"].map(lambda c: names.get(c, c)) + ", " + table["unit"]
    header = header.where(table["ceiling"] != "sms", "SMs")
    value = table["value"].map("{:g}".format) + table["measured"].map(
        lambda m: "" if pd.isna(m) else f" (measured {m:g})"
    )
    overview = (
        table.assign(value=value, header=header)
        .pivot(index="gpu", columns="header", values="value")
        .reindex(index=list(dict.fromkeys(table["gpu"])), columns=list(dict.fromkeys(header)))
        .reset_index()
        .rename(columns={"gpu": "GPU"})
    )

    def overview_style(rows: pd.DataFrame) -> Styler:
        return rows.style.format(na_rep="—", escape="html").hide(axis="index")

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format({"value": "{:g}", "measured": "{:g}"}, na_rep="", escape="html").hide(axis="index")

    return FoldedTable(overview, table, style, "The ceilings per GPU, each with its source", overview_style)


def style_fits(fits: pd.DataFrame) -> FoldedTable:
    """`model.calibration.fits_table` for display, folded: the efficiencies the model fitted on the H200 sweep."""
    names = {"bw": "bandwidth share", "compute": "compute share", "launch_us": "launch µs", "serial": "serial share"}

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format(precision=3, escape="html").hide(axis="index")

    what = "Fitted efficiencies per backend and strategy (shares of the spec ceilings; serial: of one SM's)"
    return folded(fits.rename(columns=names), style, what)


def style_bounds(native: pd.DataFrame) -> FoldedTable:
    """The modeled native times of `analysis.e2e.headline_predictions` with the ceiling that bounds each, folded."""
    shown = native[["gpu", "next_n", "time_us", "source", "modeled_bound"]].rename(
        columns={"gpu": "GPU", "time_us": "µs", "modeled_bound": "bound by"}
    )

    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format({"µs": "{:.0f}"}, escape="html").hide(axis="index")

    return folded(shown, style, "What bounds each modeled native time")
