"""The one answer to "what is fastest here", read by every page: per point, the option to use and its speedup
over what vLLM 0.33 takes, from the newest run that covers the point.

A run *covers* a point when it timed vLLM 0.33's route there (`frames.vllm_path`), so each speedup is a ratio of
two times measured in one run (run-to-run drift never enters it). Over several runs (newest first, as the
notebook room hands them over) each point is answered by the newest run that covers it, and every row names its
run and device: the landing page, the notebooks' headlines and the README's table read this table, so they agree
wherever they show the same point. The answer at a point is `workloads.answers`'s (`frames.recommend` over every
backend the run timed, a tie within the measured spread keeping vLLM's choice); a point is every point axis
(`axes.POINT_KEYS`: the workload, the batch and next_n), so two top-k implementations or two timers never meet in
one comparison. Runs of two kinds of GPU never stand for each other: the device is part of the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from dsa_lab import axes
from dsa_lab.analysis.frames import POINT, STUDY_SHAPE, by_point, ok_rows
from dsa_lab.analysis.workloads import answers, workload_order
from dsa_lab.batch.workload import ContextSpec

RUN_COLUMNS = ("run_id", "device")


@dataclass(frozen=True)
class RunFrame:
    """One run's rows, with what names it on a page: its id and the device it was measured on."""

    run_id: str
    device: str  # 'NVIDIA H200'
    results: pd.DataFrame


def _floors(results: pd.DataFrame) -> pd.DataFrame:
    """Per point the modeled floor the run stored (`floor_ms`, `floor_bound`), when it has one."""
    data = ok_rows(results)
    if "floor_ms" not in data:
        return pd.DataFrame(columns=[*POINT, "floor_ms", "floor_bound"])
    bound = data["floor_bound"] if "floor_bound" in data else None
    return data.assign(floor_bound=bound).groupby(POINT, as_index=False)[["floor_ms", "floor_bound"]].first()


def fastest(runs: Sequence[RunFrame]) -> pd.DataFrame:
    """Per point and device, `workloads.answers` from the newest run of `runs` (newest first) that timed vLLM's
    route there, with `run_id`, `device` and the point's floor (`floor_ms`, `floor_bound`: modeled, NaN where the
    run stored none). Points no run covers are absent. Empty (with the columns) when no run covers any."""
    parts = []
    for run in runs:
        table = answers(run.results)
        if table.empty:
            continue
        table = table[table["vllm_ms"].notna()].merge(_floors(run.results), on=POINT, how="left")
        parts.append(table.assign(run_id=run.run_id, device=run.device))
    if not parts:
        empty = answers(pd.DataFrame(columns=[*axes.NAMES, "status", "median_ms", "p25_ms", "p75_ms", "source"]))
        return empty.assign(floor_ms=[], floor_bound=[], run_id=[], device=[])
    every = pd.concat(parts, ignore_index=True)
    return by_point(every.drop_duplicates([*POINT, "device"], keep="first"))


def at_default_setting(table: pd.DataFrame) -> pd.Series:
    """Rows of the study's step: its shape, and every serving axis at its old-run value (no acceptance profile,
    the batch's width, logits only, CUDA events): what a uniform-batch headline reads."""
    keep = axes.at_old_values(table)
    for name, value in STUDY_SHAPE.items():
        keep &= table[name] == value
    return keep


def headline(table: pd.DataFrame, batch: int, context: str) -> pd.DataFrame:
    """`fastest`'s rows at one (batch, context) of the study's step, per next_n, in the headline's columns:
    vLLM's strategy and time (µs), the fastest option, `speedup` = vLLM's time / the best's, `beyond_spread`, the
    floor (µs, modeled) and the run and device each row comes from. Empty when no run covers the point."""
    label = ContextSpec.parse(context).label
    rows = table[at_default_setting(table) & (table["batch"] == batch) & (table["context"] == label)]
    rows = rows.assign(
        vllm_us=rows["vllm_ms"] * 1e3,
        best_us=rows["best_ms"] * 1e3,
        floor_us=rows["floor_ms"] * 1e3,
        next_n=rows["next_n"].astype(int),
    )
    return rows.sort_values("next_n").reset_index(drop=True)


def points(table: pd.DataFrame) -> list[tuple[int, str]]:
    """The (batch, context) of the study's step that `fastest` answers, largest batch first."""
    rows = table[at_default_setting(table)]
    return sorted(set(zip(rows["batch"].astype(int), rows["context"])), key=lambda p: (-p[0], p[1]))


def grid(table: pd.DataFrame, batches: Sequence[int] | None = None) -> pd.DataFrame:
    """The answer per workload and next_n: a row per (workload, batch, next_n) of `batches` (None: every batch)
    with the option to use (`choice`, its `recommended_strategy` and `recommended_backend`), its `gain` over vLLM's
    choice (1: vLLM's kept) and the run and device. Workloads of the whole step (a top-k after the logits) first,
    then the others in `workloads.workload_order`; `whole_step` says which."""
    rows = table if batches is None else table[table["batch"].isin(list(batches))]
    if rows.empty:
        return rows.assign(whole_step=pd.Series(dtype=bool))
    order = {w: i for i, w in enumerate(workload_order(rows))}
    whole = rows["timed"] != axes.axis("timed").old_value
    ranked = rows.assign(whole_step=whole, rank=rows["workload"].map(order))
    ranked = ranked.sort_values(["whole_step", "rank", "batch", "next_n"], ascending=[False, True, True, True])
    return ranked.drop(columns="rank").reset_index(drop=True)


def grid_batch(table: pd.DataFrame, wanted: int) -> int | None:
    """The batch a grid shows: `wanted` when answered, else the one answered at the most points (None: none)."""
    if table.empty:
        return None
    counts = table["batch"].astype(int).value_counts()
    return wanted if wanted in counts.index else int(counts.idxmax())


def several_batches(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the newest run in `table` (its first) whose workload it answered at more than one batch: where
    the answer may turn with the batch, within one run."""
    if table.empty:
        return table
    newest = table[table["run_id"] == table["run_id"].iloc[0]] if "run_id" in table else table
    counts = newest.groupby("workload")["batch"].nunique()
    return newest[newest["workload"].map(counts) > 1]
