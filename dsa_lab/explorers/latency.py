"""Notebook 02's explorer: latency against next_n at one batch and context of a run,
with its spread, the speedup over what vLLM 0.33 picks, and the strategy to pick."""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from dsa_lab.explorers.base import dropdown, explore
from dsa_lab.plots.latency import STRATEGY_ORDER, _context_order, ok_rows, vllm_choice
from dsa_lab.plots.style import VLLM_MARKER, VLLM_RELEASE, add_footer, legend_outside, series_label, series_style

VLLM_BACKEND = "deepgemm"  # what vLLM 0.33 runs on SM90


def recommendations(point: pd.DataFrame) -> pd.DataFrame:
    """Per next_n at one (batch, context): the fastest shown series beside vLLM 0.33's choice."""
    rows = []
    for n, part in point.groupby("next_n"):
        best = part.loc[part["kernel_us"].idxmin()]
        choice = vllm_choice(int(n))
        chosen = part[(part["backend"] == VLLM_BACKEND) & (part["strategy"] == choice)]
        vllm_us = float(chosen["kernel_us"].iloc[0]) if not chosen.empty else float("nan")
        rows.append({"next_n": int(n), "recommended": f"{best['strategy']} ({best['backend']})",
                     "recommended µs": best["kernel_us"], "vLLM 0.33 takes": f"{choice} ({VLLM_BACKEND})",
                     "vLLM µs": vllm_us, "speedup over vLLM": vllm_us / best["kernel_us"]})  # fmt: skip
    return pd.DataFrame(rows).set_index("next_n")


def plot_point(point: pd.DataFrame, title: str, caption: str | None = None) -> None:
    """Left: median µs against next_n with IQR bars, vLLM's choice as hollow diamonds. Right: speedup
    over vLLM's choice. `caption`: the run's provenance, drawn under the figure."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    vllm = point[(point["backend"] == VLLM_BACKEND) & (point["strategy"] == point["next_n"].map(vllm_choice))]
    vllm_us = vllm.set_index("next_n")["kernel_us"]
    for (strategy, backend), part in sorted(
        point.groupby(["strategy", "backend"]), key=lambda kv: STRATEGY_ORDER.index(kv[0][0])
    ):
        part = part.sort_values("next_n")
        style = series_style(strategy, backend)
        spread = [part["kernel_us"] - part["p25_ms"] * 1e3, part["p75_ms"] * 1e3 - part["kernel_us"]]
        label = series_label(strategy, backend)
        left.errorbar(part["next_n"], part["kernel_us"], yerr=spread, capsize=3, label=label, **style)
        right.plot(part["next_n"], part["next_n"].map(vllm_us) / part["kernel_us"], label=label, **style)
    if not vllm.empty:
        left.scatter(vllm["next_n"], vllm["kernel_us"], label=f"what {VLLM_RELEASE} runs", **VLLM_MARKER)
    right.axhline(1.0, color="grey", lw=1)
    left.set(xlabel="next_n", ylabel="kernel time, µs (median, IQR bars)", title="latency")
    right.set(
        xlabel="next_n",
        ylabel=f"{VLLM_RELEASE}'s time / this time",
        title=f"speedup over {VLLM_RELEASE}'s choice (> 1: faster)",
    )
    handles, labels = left.get_legend_handles_labels()
    legend_outside(fig, handles, labels)
    fig.suptitle(title)
    add_footer(fig, caption)
    plt.show()


def latency_explorer(
    results: pd.DataFrame, device_label: str, interactive: bool = True, caption: str | None = None
) -> None:
    """Batch, context, backends and strategies of a run's results → chart (with `caption`, the
    run's provenance, under it) and recommendation table."""
    data = ok_rows(results)
    data = data[data["source"] == "measured"]
    if data.empty:
        raise ValueError("results: no measured timed rows to explore")
    batches = sorted(int(b) for b in data["batch"].unique())
    contexts = _context_order(data["context"])
    backends = sorted(data["backend"].unique())
    strategies = [s for s in STRATEGY_ORDER if s in set(data["strategy"])]
    controls = {
        "batch": dropdown("batch", batches, batches[-1], "150px"),
        "context": dropdown("context", contexts, contexts[-2] if len(contexts) > 1 else contexts[0], "220px"),
        "backends": widgets.SelectMultiple(
            options=backends, value=tuple(backends), description="backends", rows=len(backends)
        ),
        "strategies": widgets.SelectMultiple(
            options=strategies, value=tuple(strategies), description="strategies", rows=len(strategies)
        ),  # fmt: skip
    }

    def draw(batch: int, context: str, backends: tuple[str, ...], strategies: tuple[str, ...]) -> None:
        if not backends or not strategies:
            raise ValueError("backends / strategies: select at least one of each (ctrl-click to select several)")
        point = data[(data["batch"] == batch) & (data["context"] == context)
                     & data["backend"].isin(backends) & data["strategy"].isin(strategies)]  # fmt: skip
        if point.empty:
            raise ValueError(
                f"batch={batch}, context={context!r}: nothing timed for {list(backends)} × {list(strategies)}"
            )
        plot_point(point, f"B = {batch}, context {context} on {device_label} (measured)", caption)
        table = recommendations(point)
        display(
            Markdown("Recommended strategy per next_n among the series shown, against vLLM 0.33 on SM90 + DeepGEMM:")
        )
        display(
            table.style.format(
                {"recommended µs": "{:.1f}", "vLLM µs": "{:.1f}", "speedup over vLLM": "{:.2f}×"}, na_rep="—"
            )
        )

    explore("Latency explorer", controls, draw, probe="batch", interactive=interactive)
