"""Notebook 02's explorer: latency against next_n at one batch and context of a run,
with its spread, the speedup over what vLLM 0.33 picks, and the strategy to pick."""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from dsa_lab.analysis.frames import context_order, ok_rows, recommend
from dsa_lab.explorers.base import dropdown, explore
from dsa_lab.kernels import vllm_backend
from dsa_lab.plots.latency import plot_point
from dsa_lab.plots.style import STRATEGY_ORDER

VLLM_BACKEND = vllm_backend().name  # what vLLM 0.33 runs on SM90


def recommendations(point: pd.DataFrame) -> pd.DataFrame:
    """Per next_n at one (batch, context): the strategy to use among the series shown, beside vLLM 0.33's
    choice (`frames.recommend`: a tie within the measured spread keeps vLLM's)."""
    table = recommend(point, vllm_backend=VLLM_BACKEND).set_index("next_n")
    return pd.DataFrame(
        {
            "recommended": table["recommended_strategy"] + " (" + table["recommended_backend"] + ")",
            "recommended µs": table["recommended_ms"] * 1e3,
            "fastest": table["best_strategy"] + " (" + table["best_backend"] + ")",
            "vLLM 0.33 takes": table["vllm_strategy"] + f" ({VLLM_BACKEND})",
            "vLLM µs": table["vllm_ms"] * 1e3,
            "speedup over vLLM": table["vllm_ms"] / table["recommended_ms"],
        }
    )


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
    contexts = context_order(data["context"])
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
        ),
    }

    def draw(batch: int, context: str, backends: tuple[str, ...], strategies: tuple[str, ...]) -> None:
        if not backends or not strategies:
            raise ValueError("backends / strategies: select at least one of each (ctrl-click to select several)")
        point = data[
            (data["batch"] == batch)
            & (data["context"] == context)
            & data["backend"].isin(backends)
            & data["strategy"].isin(strategies)
        ]
        if point.empty:
            raise ValueError(
                f"batch={batch}, context={context!r}: nothing timed for {list(backends)} × {list(strategies)}"
            )
        plot_point(point, VLLM_BACKEND, f"B = {batch}, context {context} on {device_label} (measured)", caption)
        plt.show()
        table = recommendations(point)
        display(
            Markdown("Recommended strategy per next_n among the series shown, against vLLM 0.33 on SM90 + DeepGEMM:")
        )
        display(
            table.style.format(
                {"recommended µs": "{:.1f}", "vLLM µs": "{:.1f}", "speedup over vLLM": "{:.2f}×"},
                na_rep="—",
                escape="html",
            )
        )

    explore("Latency explorer", controls, draw, probe="batch", interactive=interactive)
