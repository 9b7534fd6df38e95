"""Issue 27's fused step set against the unfused ones, per workload (pure pandas: nothing here draws or times).

A fused backend's 'logits+topk' rows (their top-k kernel recorded as 'fused (<backend>)') time its whole step;
every other option's step is its logits launches then the point's top-k, vLLM's here. Per workload and timer:
the fused step, the best unfused step (every other backend and strategy the run timed, DeepGEMM's builds and our
own kernels, under the same timer), which option that is, their ratio, and issue 27's goal for it.
"""

from __future__ import annotations

import pandas as pd

from dsa_lab import axes
from dsa_lab.analysis.frames import ok_rows
from dsa_lab.analysis.step_split import STEP
from dsa_lab.bench.timed_unit import FUSED_KERNEL

# Issue 27's goals: at most this share of the best unfused step at each batch size, for these next_n.
GOALS = {1: 0.70, 16: 0.70, 64: 0.90, 128: 0.90}
GOAL_NEXT_N = (1, 3, 4)
RESULT_COLUMNS = ("fused", "fused_us", "best", "best_us", "ratio", "goal", "met")  # beside each workload's axes


def goal_for(batch: int, next_n: int) -> float | None:
    """The most a fused step may take of the best unfused one at this point (None: no goal there)."""
    return GOALS.get(int(batch)) if int(next_n) in GOAL_NEXT_N else None


def fused_step_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per fused backend, workload and timer (not the replay): `fused_us`, `best` ('strategy (backend)')
    and `best_us`, the fastest unfused step with vLLM's top-k, `ratio` (fused over best: < 1, the fused step is
    faster), `goal` (None where issue 27 sets none) and `met`. Workloads no unfused option was timed in are left out.
    """
    ok = ok_rows(results)
    steps = ok[(ok["timed"] == STEP) & (ok["timer"] != "replay")]
    if steps.empty or "topk_kernel" not in steps:
        return pd.DataFrame(columns=list(RESULT_COLUMNS))
    is_fused = steps["topk_kernel"].astype(str).str.startswith(FUSED_KERNEL)
    unfused = steps[~is_fused & (steps["topk_impl"] == "vllm")]
    workload = [c for c in axes.POINT_KEYS if c in steps.columns and c not in ("timed", "topk_impl")]
    best = unfused.loc[unfused.groupby(workload, sort=False)["kernel_us"].idxmin()]
    best = best.assign(best=best["strategy"] + " (" + best["backend"] + ")")[[*workload, "best", "kernel_us"]]
    # A fused step does not run the point's top-k, so a run may time it under each top-k axis value: the fastest.
    fused = steps[is_fused].groupby(["backend", *workload], sort=False, as_index=False)["kernel_us"].min()
    table = fused.rename(columns={"backend": "fused", "kernel_us": "fused_us"}).merge(
        best.rename(columns={"kernel_us": "best_us"}), on=workload, how="inner"
    )
    table["ratio"] = table["fused_us"] / table["best_us"]
    table["goal"] = [goal_for(b, n) for b, n in zip(table["batch"], table["next_n"])]
    table["met"] = [None if pd.isna(goal) else bool(r <= goal) for r, goal in zip(table["ratio"], table["goal"])]
    return table.sort_values([*(c for c in ("context", "timer") if c in table), "next_n", "batch"]).reset_index(
        drop=True
    )


def shown_columns(table: pd.DataFrame) -> list[str]:
    """What a table for people shows of `fused_step_table`: the step's axes, every other axis that varies, then the
    results."""
    point = [c for c in axes.POINT_KEYS if c in table and (c in axes.STEP_KEYS or table[c].nunique() > 1)]
    return [*point, *(c for c in RESULT_COLUMNS if c in table)]


def fused_reading(table: pd.DataFrame) -> str:
    """Markdown: where the fused step met issue 27's goals, where it missed, and its range against the best
    unfused step."""
    if table.empty:
        return "*No workload of this run holds both a fused step and an unfused one with vLLM's top-k.*"
    judged = table[table["goal"].notna()]
    met = judged[judged["met"].astype(bool)]
    lines = [
        f"- The fused step takes {table['ratio'].min():.2f}-{table['ratio'].max():.2f}× the best unfused step with "
        f"vLLM's top-k over {len(table)} workloads (below 1: faster)."
    ]
    if not judged.empty:
        lines.append(f"- Issue 27's goals: met at {len(met)} of {len(judged)} judged points.")
        for batch, rows in judged.groupby("batch"):
            lines.append(
                f"  - B = {batch}: {rows['ratio'].min():.2f}-{rows['ratio'].max():.2f}× against a goal of at most "
                f"{rows['goal'].iloc[0]:.2f}×"
            )
    return "\n".join(lines)
