"""Notebook 04's tables in words and units: which configurations ran, the step per strategy, and the
logits kernels' Nsight Compute counters, each a few rows on top and every row folded (`plots.tables`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from pandas.io.formats.style import Styler

from dsa_lab.analysis.labels import context_title
from dsa_lab.analysis.profiles import versus_native
from dsa_lab.plots.tables import FoldedTable, top_rows

POINT = {"backend": "backend", "batch": "B", "context": "context", "next_n": "next_n", "strategy": "strategy"}


def _styled(formats: Mapping[str, str]):
    def style(rows: pd.DataFrame) -> Styler:
        return rows.style.format(dict(formats), na_rep="—", escape="html").hide(axis="index")

    return style


def _point(frame: pd.DataFrame) -> pd.DataFrame:
    shown = frame[[c for c in POINT if c in frame]].rename(columns=POINT)
    return shown.assign(context=shown["context"].astype(str).map(context_title)) if "context" in shown else shown


def configs_table(configs: Sequence[Mapping[str, Any]]) -> FoldedTable:
    """What the profile run did per tool, backend and outcome (configurations counted, the reason a backend
    skipped some), every configuration folded below."""
    frame = pd.DataFrame(list(configs))
    frame["reason"] = frame.get("reason", pd.Series("", index=frame.index)).fillna("")
    summary = (
        frame.groupby(["tool", "backend", "status", "reason"], sort=False).size().rename("configurations").reset_index()
    )
    full = _point(frame).assign(
        tool=frame["tool"],
        launches=frame.get("launches"),
        **{"error vs reference": frame.get("rel_err")},
        status=frame["status"],
        reason=frame["reason"],
    )
    style = _styled({"error vs reference": "{:.1e}", "launches": "{:.0f}"})
    return FoldedTable(summary, full, style, "Configurations per tool, backend and outcome")


def step_table(step: pd.DataFrame) -> FoldedTable:
    """`profiling.torch_profile.summarize_torch`'s step per strategy: µs and × native, the strategies furthest
    behind native on top."""
    versus = versus_native(step, ["step_us", "logits_us"])
    shown = _point(versus).assign(
        **{
            "step µs": versus["step_us"],
            "logits µs": versus["logits_us"],
            "step × native": versus["step_us_vs_native"],
            "logits × native": versus["logits_us_vs_native"],
        }
    )
    formats = {"step µs": "{:.1f}", "logits µs": "{:.1f}", "step × native": "{:.2f}", "logits × native": "{:.2f}"}
    return top_rows(shown, _styled(formats), ["step × native"], "steps furthest behind native (device µs)")


def ncu_table(summary: pd.DataFrame) -> FoldedTable:
    """The logits kernels' counters per configuration: time, DRAM read (GB and per unique KV byte), how much
    of the re-reads the L2 absorbed, bandwidth and useful TFLOP/s; the most re-read configurations on top."""
    versus = versus_native(summary, ["duration_ns"])
    shown = _point(summary).assign(
        **{
            "kernel µs": summary["duration_ns"] / 1e3,
            "× native": versus["duration_ns_vs_native"].to_numpy(),
            "DRAM read, GB": summary["dram_read_bytes"] / 1e9,
            "DRAM / unique KV": summary["dram_read_per_unique"],
            "L2 absorbed": summary["l2_absorbed"],
            "L2 hit %": summary["l2_hit_pct"],
            "TB/s": summary["effective_tbps"],
            "useful TFLOP/s": summary["useful_tflops"],
        }
    )
    formats = {
        "kernel µs": "{:.1f}",
        "× native": "{:.2f}",
        "DRAM read, GB": "{:.3f}",
        "DRAM / unique KV": "{:.2f}",
        "L2 absorbed": "{:.0%}",
        "L2 hit %": "{:.1f}",
        "TB/s": "{:.2f}",
        "useful TFLOP/s": "{:.0f}",
    }
    return top_rows(shown, _styled(formats), ["DRAM / unique KV"], "configurations that re-read the KV cache most")
