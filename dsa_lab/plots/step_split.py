"""The whole decode step as people look at it (issue 26): each option's step stacked as its logits and its top-k
per batch size, and ragged verification's replayed steps per acceptance curve. Drawing only: the frames come
from `analysis.step_split` and the run's rows."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dsa_lab.analysis.labels import axis_value_title
from dsa_lab.plots.style import FOOTER_STYLE, option_color
from dsa_lab.topk.registry import label_of

TOPK_HATCH = "///"  # the top-k's part of a bar: the option's colour, hatched
WRONG_HATCH = "xx"  # a replayed option some replay of which was wrong: its time is no option's to take


def _options(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(strategy, backend) pairs in a stable order: vLLM's route first as the data orders it, then by name."""
    return list(dict.fromkeys(zip(frame["strategy"], frame["backend"])))


def plot_step_split(split: pd.DataFrame, footer: str = "") -> Figure:
    """One panel per next_n: at each batch size a bar per option, its logits below and its top-k above (hatched),
    as shares of the step vLLM runs there (1.0: vLLM's own step; its time in µs under the batch). `split`: one
    context, timer and top-k, with `analysis.step_split.against_route`'s columns."""
    panels = sorted(split["next_n"].unique())
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels) + 0.6, 3.6), squeeze=False, sharey=True)
    options = _options(split.sort_values(["strategy", "backend"]))
    width = 0.8 / max(1, len(options))
    for ax, next_n in zip(axes[0], panels):
        panel = split[split["next_n"] == next_n]
        batches = sorted(panel["batch"].unique())
        for i, (strategy, backend) in enumerate(options):
            rows = panel[(panel["strategy"] == strategy) & (panel["backend"] == backend)].set_index("batch")
            present = [b for b in batches if b in rows.index]
            if not present:
                continue
            xs = [batches.index(b) + (i - (len(options) - 1) / 2) * width for b in present]
            logits, topk = rows.loc[present, "logits_rel"].to_numpy(), rows.loc[present, "topk_rel"].to_numpy()
            color = option_color(strategy, backend)
            ax.bar(xs, logits, width * 0.92, color=color, edgecolor="white", linewidth=0.4)
            ax.bar(xs, topk, width * 0.92, bottom=logits, color=color, alpha=0.45, hatch=TOPK_HATCH, edgecolor="white")
            for x, total in zip(xs, logits + topk):  # upright, so the labels of narrow bars never overlap
                ax.text(x, total + 0.03, f"{total:.2f}", ha="center", va="bottom", fontsize=7, rotation=90)
        route = panel.drop_duplicates("batch").set_index("batch")["route_us"]
        ax.set_xticks(range(len(batches)), [f"{b}\n{route[b]:.0f} µs" for b in batches], fontsize=8)
        ax.axhline(1.0, color="0.3", linewidth=0.8, linestyle=":")
        ax.set_xlabel("B (vLLM's step)")
        ax.set_title(f"next_n = {next_n}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("step time / vLLM's step")
    handles = [Patch(color=option_color(s, b), label=f"{s} ({b}): logits") for s, b in options]
    handles += [Patch(facecolor="white", edgecolor="0.3", hatch=TOPK_HATCH, label="+ its top-k")]
    fig.legend(handles=handles, loc="upper center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
    first = split.iloc[0]
    where = f"{axis_value_title('context', first['context'])}; {label_of(first['topk_impl'])}; timer {first['timer']}"
    fig.text(0.01, 0.01, where, fontsize=8, va="bottom")
    if footer:
        fig.text(0.99, 0.01, footer, ha="right", va="bottom", **FOOTER_STYLE)
    fig.tight_layout(rect=(0, 0.04, 1, 0.92))
    return fig


def plot_ragged_verification(rows: pd.DataFrame, footer: str = "") -> Figure:
    """Per acceptance curve, each option's replayed step (median over the replays, the bar; p25-p75, the whisker),
    natively and by vLLM's route; an option wrong on any replay is drawn hollow and cross-hatched, its wrong
    replays written over it: a time no one may take."""
    curves = list(dict.fromkeys(rows["acceptance"]))
    options = _options(rows.sort_values(["strategy", "backend"]))
    width = 0.8 / max(1, len(options))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(curves) + 2), 3.8))
    for i, (strategy, backend) in enumerate(options):
        mine = rows[(rows["strategy"] == strategy) & (rows["backend"] == backend)].set_index("acceptance")
        present = [c for c in curves if c in mine.index]
        xs = np.array([curves.index(c) for c in present]) + (i - (len(options) - 1) / 2) * width
        median = mine.loc[present, "median_ms"].to_numpy() * 1e3
        low = median - mine.loc[present, "p25_ms"].to_numpy() * 1e3
        high = mine.loc[present, "p75_ms"].to_numpy() * 1e3 - median
        wrong = mine.loc[present, "replays_wrong"].to_numpy() > 0
        color = option_color(strategy, backend)
        faces = ["white" if w else color for w in wrong]
        ax.bar(
            xs, median, width * 0.92, yerr=[low, high], color=faces, edgecolor=color,
            hatch=[WRONG_HATCH if w else "" for w in wrong], label=f"{strategy} ({backend})",
        )  # fmt: skip
        for x, top, curve, is_wrong in zip(xs, median + high, present, wrong):
            if is_wrong:
                bad, replays = int(mine.loc[curve, "replays_wrong"]), int(mine.loc[curve, "replays"])
                ax.text(x, top * 1.02, f"wrong on\n{bad} of {replays}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(
        range(len(curves)), [f"{c}\nnext_n {rows[rows['acceptance'] == c]['next_n'].iloc[0]}" for c in curves]
    )
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("replayed step, µs (median, p25-p75)")
    ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color=option_color(s, b), label=f"{s} ({b})") for s, b in options]
    handles += [Patch(facecolor="white", edgecolor="0.3", hatch=WRONG_HATCH, label="wrong on some replays")]
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper left")
    if footer:
        fig.text(0.99, 0.01, footer, ha="right", **FOOTER_STYLE)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig
