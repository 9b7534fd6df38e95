"""Frames of a profile run (`profiling.runs.load_profile_run`) that charts and notebooks read: the
phases in the order the profiled step runs them, which tensor-pipe counter a run has, and each
strategy against native."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from dsa_lab import axes
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
