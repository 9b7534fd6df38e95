"""A candidate kernel against a baseline backend, point by point: the frames behind notebook 03's charts.

Input is a run's results frame, one shape (heads, head_dim, cache dtype) at a time (`frames.one_shape`);
only rows with status 'ok' count. The *candidate* is a (backend, strategy), the *baseline* one backend or several
(default: every DeepGEMM build the run timed, `frames.baseline_backends`), compared two ways per point: vLLM
0.33's path on SM90 + DeepGEMM (`frames.vllm_path`, timed on `frames.path_backend`) and the best baseline option
(`frames.best_option`, the fastest of every strategy of every baseline backend that ran), named by
`labels.baseline_label` wherever it is shown. Modeled rows (roofline times, `analysis.modeled`) are never part of a comparison:
`modeled_vs_measured` sets them beside it, labelled `MODELED_LABEL`. Nothing here draws or times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from dsa_lab.analysis.frames import (
    POINT,
    SM90_DEEPGEMM,
    baseline_backends,
    best_option,
    by_point,
    context_order,
    measured_ok,
    ok_rows,
    path_backend,
    vllm_path,
)
from dsa_lab.analysis.labels import baseline_label
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.policy.vllm import RELEASES, Platform

MODELED_LABEL = "modeled (roofline, not measured)"
RELEASE = RELEASES["vllm_0_33_0"][0]  # 'vLLM 0.33.0'


def kernel_comparison(
    frame: pd.DataFrame,
    candidate: tuple[str, str],
    baseline: str | Sequence[str] | None = None,
    platform: Platform = SM90_DEEPGEMM,
) -> pd.DataFrame:
    """Per point where the candidate ran: its time and share of the floor, vLLM's path and the best
    baseline option, and the speedups (baseline time / candidate time, > 1: the candidate wins).

    `beyond_spread_*` is True when the candidate's 75th percentile lies below the other's 25th.
    """
    data = measured_ok(frame)
    backend, strategy = candidate
    mine = data[(data["backend"] == backend) & (data["strategy"] == strategy)]
    if mine.empty:
        timed = sorted(set(data["backend"] + "/" + data["strategy"]))
        raise ValueError(f"candidate={candidate!r}: no measured timed rows; timed (backend/strategy): {timed}")
    floor_pct = 100 * mine["floor_ms"] / mine["median_ms"] if "floor_ms" in mine else np.nan
    table = mine[POINT].assign(
        candidate_ms=mine["median_ms"],
        candidate_p25_ms=mine["p25_ms"],
        candidate_p75_ms=mine["p75_ms"],
        floor_pct=pd.to_numeric(floor_pct, errors="coerce"),
        floor_bound=mine["floor_bound"] if "floor_bound" in mine else None,
    )
    backends = baseline_backends(baseline, frame)
    table = table.merge(vllm_path(frame, path_backend(backends), platform), on=POINT, how="left")
    table = table.merge(best_option(frame, list(backends)), on=POINT, how="left")
    table["speedup_vs_vllm"] = table["vllm_ms"] / table["candidate_ms"]
    table["speedup_vs_best"] = table["best_ms"] / table["candidate_ms"]
    table["beyond_spread_vs_vllm"] = table["candidate_p75_ms"] < table["vllm_p25_ms"]
    table["beyond_spread_vs_best"] = table["candidate_p75_ms"] < table["best_p25_ms"]
    return by_point(table)


def held_to(comparison: pd.DataFrame, baseline: str | Sequence[str] | None = None) -> tuple[str, ...]:
    """The baseline backends a `kernel_comparison` was held to: `baseline` as given, else the DeepGEMM builds
    whose options were the best somewhere (`frames.baseline_backends`)."""
    won = comparison.rename(columns={"best_backend": "backend"})[["backend"]].dropna().assign(status="ok")
    return baseline_backends(baseline, won)


def pick_point(frame: pd.DataFrame, batch: int, context: str | int) -> tuple[int, str, str]:
    """The (batch, context label) to draw: the one asked for if measured, else the largest
    measured batch and longest uniform context; and a note saying which and why."""
    data = measured_ok(frame)
    if data.empty:
        raise ValueError("frame: no measured rows with status 'ok'")
    label = ContextSpec.parse(context).label
    pairs = set(zip(data["batch"], data["context"]))
    if (batch, label) in pairs:
        return batch, label, ""
    contexts = context_order(data["context"])
    uniform = [c for c in contexts if not c.startswith("mixed")] or contexts
    chosen_context = uniform[-1]
    chosen_batch = int(data.loc[data["context"] == chosen_context, "batch"].max())
    note = (
        f"batch={batch}, context={label} was not measured in this run; showing batch={chosen_batch}, "
        f"context={chosen_context} (the largest batch at the longest uniform context measured)."
    )
    return chosen_batch, chosen_context, note


def modeled_gpu(backend: str) -> str:
    """'model (B200)' -> 'B200'; the table's measured-ceilings row reads 'H200 (measured ceilings)'."""
    name = backend.removeprefix("model (").removesuffix(")")
    return name.replace("-measured", " (measured ceilings)")


def modeled_vs_measured(
    frame: pd.DataFrame,
    batch: int,
    context: str,
    candidate: tuple[str, str],
    baseline: str | Sequence[str] | None = None,
) -> pd.DataFrame:
    """µs per next_n (rows) at one (batch, context): the candidate, best baseline option and vLLM's
    path as measured, then every modeled backend's native time (columns say which is which)."""
    backends = baseline_backends(baseline, frame)
    columns: dict[str, pd.Series] = {}
    measured = measured_ok(frame)
    if ((measured["backend"] == candidate[0]) & (measured["strategy"] == candidate[1])).any():
        comp = kernel_comparison(frame, candidate, baseline)
        comp = comp[(comp["batch"] == batch) & (comp["context"] == context)].set_index("next_n")
        columns[f"{candidate[1]} ({candidate[0]}), measured"] = comp["candidate_ms"] * 1e3
        columns[f"{baseline_label(backends)}, measured"] = comp["best_ms"] * 1e3
        columns[f"{RELEASE} path ({path_backend(backends)}), measured"] = comp["vllm_ms"] * 1e3
    modeled = ok_rows(frame)
    modeled = modeled[(modeled["source"] == "modeled") & (modeled["strategy"] == "native")]
    modeled = modeled[(modeled["batch"] == batch) & (modeled["context"] == context)]
    for backend, part in modeled.groupby("backend", sort=False):
        columns[f"{modeled_gpu(backend)} native: {MODELED_LABEL}"] = part.set_index("next_n")["kernel_us"]
    if not columns:
        raise ValueError(f"frame: nothing to show at batch={batch}, context={context}")
    table = pd.DataFrame(columns).sort_index()
    table.index.name = "next_n"
    return table
