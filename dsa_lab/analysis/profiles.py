"""Frames of a profile run (`profiling.runs.load_profile_run`) that charts and notebooks read: the
phases in the order the profiled step runs them, which tensor-pipe counter a run has, each
strategy against native, and notebook 04's sections: the configurations that ran, the timeline's
point, the step and Nsight Compute tables, the modeled re-reads shown when a run has no counters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from dsa_lab import axes
from dsa_lab.analysis.modeled import modeled_reread
from dsa_lab.profiling.ncu_tables import METRICS
from dsa_lab.profiling.step import PHASES
from dsa_lab.profiling.torch_profile import OUTSIDE_PHASES

PHASE_ORDER = (*PHASES, OUTSIDE_PHASES)  # the step's phases as it runs them, then time outside them
# ncu's tensor-pipe counters, gmma-named first (where ncu offers it), else hmma-named
TENSOR_METRICS = {column: METRICS[column].split(".")[0] for column in ("tensor_gmma_pct", "tensor_hmma_pct")}


def tensor_column(summary: pd.DataFrame) -> str:
    """The tensor-pipe column this run has numbers for: ncu's gmma-named counter where it
    exists, else the hmma-named one (the only one ncu 2025.3 collects on an H200)."""
    for column in TENSOR_METRICS:
        if column in summary and summary[column].notna().any():
            return column
    raise ValueError("summary: no tensor-pipe utilisation in this run (both metrics n/a)")


def tensor_pipe_label(summary: pd.DataFrame, provenance: Mapping[str, Any] | None = None) -> str:
    """What the tensor-pipe numbers are, truthfully: the ncu counter they came from and, when it
    is the hmma-named one, that on SM90 it counts the FP8 wgmma (GMMA) these kernels issue."""
    column = tensor_column(summary)
    text = f"ncu counter {TENSOR_METRICS[column]}"
    if column == "tensor_hmma_pct":
        dropped = any(TENSOR_METRICS["tensor_gmma_pct"] in m for m in (provenance or {}).get("ncu_metrics_dropped", []))
        text += ": HMMA in name only, it is the pipe these kernels' FP8 wgmma (GMMA) runs on"
        text += "\n(this ncu offers no gmma-named counter for the GPU)" if dropped else ""
    return text


def versus_native(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Each strategy's `columns` divided by native's at the same values of every other axis."""
    keys = [k for k in axes.NAMES if k != "strategy" and k in frame]
    native = frame.loc[frame["strategy"] == "native", keys + columns]
    merged = frame[keys + ["strategy", *columns]].merge(native, on=keys, how="left", suffixes=("", "_native"))
    for column in columns:
        merged[f"{column}_vs_native"] = merged[column] / merged[f"{column}_native"]
    return merged.drop(columns=[f"{c}_native" for c in columns])


def timeline_point(kernels: pd.DataFrame, batch: int | None, next_n: int) -> tuple[int, int]:
    """The (batch, next_n) of the timeline chart: `batch` (None: the largest profiled), and `next_n`
    where that batch has it, else the largest profiled there."""
    batch = batch or int(kernels["batch"].max())
    next_ns = sorted(kernels.loc[kernels["batch"] == batch, "next_n"].unique())
    return batch, next_n if next_n in next_ns else int(max(next_ns))


def modeled_reread_stand_in(
    provenance: Mapping[str, Any], batch: int, context: str | int, next_ns: Sequence[int]
) -> tuple[pd.DataFrame, str]:
    """What a run without counters shows instead: the plan's modeled re-reads at its grid's largest
    batch and first context (`batch`, `context`, `next_ns` where its spec has none), and the chart's
    title saying it is modeled."""
    grid = provenance.get("spec", {})
    batch = int(max(grid.get("batch", [batch])))
    context = str(grid.get("context", [context])[0])
    frame = modeled_reread(batch, context, grid.get("next_n", next_ns))
    return frame, f"modeled for B={batch}, L={context} | not a measurement"
