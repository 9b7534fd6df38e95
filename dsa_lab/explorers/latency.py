"""Notebook 02's explorer: latency against next_n at one point of a run (batch, context and the
serving step's axes), with its spread, the speedup over what vLLM 0.33 picks, and the strategy to pick.

The run is chosen among every run `dsa-lab runs` lists (the notebook's own first, then the study runs, then
scratch runs, a CPU run of one's own among them, labelled so); each control offers only the values the run
measured at the others' choice, so no combination comes up empty, and a run switched to shows every backend
and strategy it timed (the explorer says so). vLLM's choice is the baseline whatever backends and strategies
are shown: it is taken from the point's unfiltered rows. A CPU run's wall-clock times are drawn without
speedups (their drift between runs exceeds most of them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd
from IPython.display import Markdown, display

from dsa_lab import axes
from dsa_lab.analysis.frames import context_order, ok_rows, one_shape, recommend
from dsa_lab.analysis.labels import axis_value_title
from dsa_lab.explorers.base import dropdown, explore, show_figure
from dsa_lab.kernels import vllm_backend
from dsa_lab.notebook.runs import run_choices
from dsa_lab.plots.latency import plot_point
from dsa_lab.plots.style import STRATEGY_ORDER, provenance_line
from dsa_lab.store import folders as store

VLLM_BACKEND = vllm_backend().name  # what vLLM 0.33 runs on SM90
THIS_RUN = ""  # the run selector's value for the results the notebook handed over
# The point's axes besides next_n (the chart's x axis), in the order the controls chain: each offers
# what the run measured at the choices before it.
POINT_AXES = tuple(a.name for a in axes.AXES if a.role == "point" and a.name != "next_n")


def recommendations(
    point: pd.DataFrame, backends: list[str], strategies: list[str], speedups: bool = True
) -> pd.DataFrame:
    """Per next_n at one point: the strategy to use among `backends` × `strategies`, beside vLLM 0.33's
    choice timed on every row of `point` (`frames.recommend`: a tie within the measured spread keeps vLLM's);
    without `speedups` (a CPU's wall clock) the fastest option and the times only."""
    table = recommend(point, backends, VLLM_BACKEND, strategies=strategies).set_index("next_n")
    if not speedups:
        return pd.DataFrame(
            {
                "fastest": table["best_strategy"] + " (" + table["best_backend"] + ")",
                "fastest µs": table["best_ms"] * 1e3,
            }
        )
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


def explorable(results: pd.DataFrame) -> pd.DataFrame:
    """The measured timed rows of one shape (`frames.one_shape`): what the explorer can show."""
    data = ok_rows(one_shape(results)[0])
    data = data[data["source"] == "measured"]
    if data.empty:
        raise ValueError("results: no measured timed rows to explore")
    return data


def latency_explorer(
    results: pd.DataFrame,
    device_label: str,
    interactive: bool = True,
    caption: str | None = None,
    run_path: str | Path | None = None,
    speedups: bool = True,
) -> None:
    """A run's results → chart (with `caption`, the run's provenance, under it) and recommendation table
    at the batch, context, serving axes, backends and strategies chosen. `run_path`: where `results` came
    from, so that the run selector does not offer it twice; `speedups`: whether its times are a GPU's (a CPU
    run's wall clock is drawn without speedups; a run switched to says by its own provenance)."""
    runs: dict[str, Shown] = {THIS_RUN: Shown(explorable(results), device_label, caption, speedups)}

    def run_data(key: str) -> Shown:
        if key not in runs:
            run = store.load_run(key)
            label = run.provenance.get("device_name", run.provenance.get("device", "?"))
            on_gpu = run.provenance.get("device") == "cuda"
            runs[key] = Shown(explorable(run.results), label, provenance_line(run.provenance), on_gpu)
        return runs[key]

    others = run_choices(Path(run_path) if run_path else None)
    first = runs[THIS_RUN].data
    controls: dict[str, widgets.ValueWidget] = {
        "run": dropdown("run", [("this notebook's run", THIS_RUN), *others], THIS_RUN, "360px")
    }
    for name in POINT_AXES:
        values = context_order(first[name]) if name == "context" else sorted(first[name].unique())
        controls[name] = dropdown(name.replace("_", " "), [(axis_value_title(name, v), v) for v in values])
    controls["batch"].value = int(first["batch"].max())
    contexts = context_order(first["context"])
    controls["context"].value = contexts[-2] if len(contexts) > 1 else contexts[0]
    for name, options in (("backends", sorted(first["backend"].unique())), ("strategies", STRATEGY_ORDER)):
        controls[name] = widgets.SelectMultiple(options=options, value=tuple(options), description=name, rows=4)

    def at_point(values: Mapping[str, Any], upto: int = len(POINT_AXES)) -> pd.DataFrame:
        """The run's rows at the values of the first `upto` point axes."""
        data = run_data(values["run"]).data
        for name in POINT_AXES[:upto]:
            data = data[data[name] == values[name]]
        return data

    def allowed(values: Mapping[str, Any]) -> dict[str, list[Any]]:
        offered: dict[str, list[Any]] = {}
        for i, name in enumerate(POINT_AXES):
            present = at_point(values, i)[name]
            ordered = context_order(present) if name == "context" else sorted(present.unique())
            offered[name] = [(axis_value_title(name, v), v) for v in ordered]
        point = at_point(values)
        offered["backends"] = sorted(point["backend"].unique())
        offered["strategies"] = [s for s in STRATEGY_ORDER if s in set(point["strategy"])]
        return offered

    def draw(run: str, backends: tuple[str, ...], strategies: tuple[str, ...], **point_values: Any) -> None:
        if not backends or not strategies:
            raise ValueError("backends / strategies: select at least one of each (ctrl-click to select several)")
        shown_run = run_data(run)
        for i, name in enumerate(POINT_AXES):  # the first control whose value the run lacks is the one named
            present = at_point({"run": run, **point_values}, i)[name]
            if not (present == point_values[name]).any():
                measured = context_order(present) if name == "context" else sorted(present.unique())
                raise ValueError(f"{name}={point_values[name]!r}: not measured here; this run has {measured}")
        point = at_point({"run": run, **point_values})
        shown = point[point["backend"].isin(backends) & point["strategy"].isin(strategies)]
        if shown.empty:
            raise ValueError(f"{list(backends)} × {list(strategies)}: nothing timed at this point; select others")
        where = ", ".join(axis_value_title(n, point_values[n]) for n in ("batch", "context"))
        setting = ", ".join(
            axis_value_title(n, point_values[n])
            for n in POINT_AXES
            if n not in ("batch", "context") and shown_run.data[n].nunique() > 1
        )
        kind = "measured" if shown_run.speedups else "CPU wall clock, no speedups"
        title = f"{where} on {shown_run.device} ({kind})" + (f"\n{setting}" if setting else "")
        figure = plot_point(shown, VLLM_BACKEND, title, shown_run.caption, baseline=point, speedups=shown_run.speedups)
        show_figure(figure)
        what = "against vLLM 0.33 on SM90 + DeepGEMM" if shown_run.speedups else "(times only: a CPU run)"
        display(Markdown(f"Recommended strategy per next_n among the series shown, {what}:"))
        table = recommendations(point, list(backends), list(strategies), shown_run.speedups)
        formats = {
            "recommended µs": "{:.1f}",
            "fastest µs": "{:.1f}",
            "vLLM µs": "{:.1f}",
            "speedup over vLLM": "{:.2f}×",
        }
        display(table.style.format({k: v for k, v in formats.items() if k in table}, na_rep="—", escape="html"))

    rows = [
        ["run", "batch", "context"],
        [n for n in POINT_AXES if n not in ("batch", "context")],
        ["backends", "strategies"],
    ]
    explore("Latency explorer", controls, draw, probe="batch", interactive=interactive, rows=rows, allowed=allowed)


@dataclass(frozen=True)
class Shown:
    """A run as the explorer draws it: its explorable rows, device, provenance caption, and whether its times are
    a GPU's (speedups drawn)."""

    data: pd.DataFrame
    device: str
    caption: str | None
    speedups: bool
