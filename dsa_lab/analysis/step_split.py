"""The whole decode step split into its logits and its top-k (issue 26), per option and workload.

A run of the `step` preset times each option twice at every point and timer: the logits launches alone
('logits') and the launches followed by the point's top-k ('logits+topk'). The step's top-k costs the
difference, measured under the same timer in the same run; its share of the step is what the stacked chart
of notebook 02 draws. `route_ratio` sets each workload's best whole step against what vLLM 0.33 runs there
(its library on its recorded route), per top-k implementation, never mixing two. Pure pandas: nothing here
draws or times.
"""

from __future__ import annotations

import pandas as pd

from dsa_lab import axes
from dsa_lab.analysis.frames import ok_rows, vllm_family
from dsa_lab.kernels import vllm_backend

STEP = "logits+topk"
# What a chart of one run shows first where it holds several: the serving study's ragged batch, CUDA graphs (how
# vLLM replays a decode step), vLLM's own top-k.
SHOWN_FIRST = {"context": "mixed:2048-131072", "timer": "graph", "topk_impl": "vllm"}
# A step's time and its logits' time pair up over every axis but the timed unit and the top-k run after them.
PAIRED = [a.name for a in axes.AXES if a.name not in ("timed", "topk_impl")]


def step_split(results: pd.DataFrame) -> pd.DataFrame:
    """One row per option, point and top-k implementation timed both ways: `logits_us`, `step_us`, `topk_us`
    (their difference), `topk_share` (of the step), with each row's recorded `vllm_route` and `topk_kernel`."""
    ok = ok_rows(results)
    logits = ok[ok["timed"] == "logits"][[*PAIRED, "kernel_us"]].rename(columns={"kernel_us": "logits_us"})
    keep = [*PAIRED, "topk_impl", "kernel_us", *(c for c in ("vllm_route", "topk_kernel") if c in ok.columns)]
    steps = ok[ok["timed"] == STEP][keep].rename(columns={"kernel_us": "step_us"})
    split = steps.merge(logits, on=PAIRED, how="inner")
    split["topk_us"] = split["step_us"] - split["logits_us"]
    split["topk_share"] = split["topk_us"] / split["step_us"]
    return split.reset_index(drop=True)


def against_route(split: pd.DataFrame) -> pd.DataFrame:
    """`split` with, on every row, its workload's step as vLLM runs it (`route_us`: vLLM's library on the route the
    row records) and the row's logits and top-k as shares of that (`logits_rel`, `topk_rel`: a bar of height < 1
    is a step faster than vLLM's); rows of a workload vLLM's route was not timed in are left out."""
    table = route_ratio(split)
    if table.empty:
        return split.iloc[0:0].assign(route_us=[], logits_rel=[], topk_rel=[])
    workload = [c for c in table.columns if c in split.columns]
    out = split.merge(table[[*workload, "route_us"]], on=workload, how="inner")
    out["logits_rel"] = out["logits_us"] / out["route_us"]
    out["topk_rel"] = out["topk_us"] / out["route_us"]
    return out


def route_ratio(split: pd.DataFrame) -> pd.DataFrame:
    """Per workload (every point axis, the timer and the top-k included): vLLM's step (its library on the route
    each row records: native where it runs native, else flatten), the fastest step of any option, which
    option that is, and `route_over_best` (> 1: faster than what vLLM runs by that factor)."""
    vllm = vllm_backend().name
    workload = [c for c in [*axes.POINT_KEYS, "topk_impl"] if c in split.columns and c != "timed"]
    rows = []
    for key, group in split.groupby(workload, sort=False):
        taken = group["vllm_route"].replace({"padded": "native"})  # a padded native step runs the native kernel
        route = group[(group["backend"] == vllm) & (group["strategy"] == taken)]
        if route.empty:
            continue
        best = group.loc[group["step_us"].idxmin()]
        rows.append(
            {
                **dict(zip(workload, key if isinstance(key, tuple) else (key,))),
                "route": f"{route.iloc[0]['strategy']} ({vllm})",
                "route_us": float(route["step_us"].min()),
                "best": f"{best['strategy']} ({best['backend']})",
                "best_us": float(best["step_us"]),
                "best_is_vllms_library": best["backend"] in vllm_family(),
            }
        )
    table = pd.DataFrame(rows)
    if not table.empty:
        table["route_over_best"] = table["route_us"] / table["best_us"]
    return table


def one_chart(split: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The rows of `split` one chart draws (one context, timer and top-k: `SHOWN_FIRST`'s where the run has them,
    else its first; an axis the frame lacks is not chosen on), and a note naming the others the run holds ('' when
    it holds none)."""
    picked, others = split, []
    for axis, preferred in SHOWN_FIRST.items():
        if axis not in picked:
            continue
        values = list(dict.fromkeys(picked[axis]))
        value = preferred if preferred in values else values[0]
        others += [f"{axis} {v}" for v in values if v != value]
        picked = picked[picked[axis] == value]
    note = f"Also in this run: {', '.join(others)}." if others else ""
    return picked, note


def replayed(results: pd.DataFrame) -> pd.DataFrame:
    """Ragged verification's rows (timer 'replay') whose step ran the top-k, timed or failed by a wrong replay."""
    rows = axes.complete(results)
    steps = rows[(rows["timer"] == "replay") & (rows["timed"] == STEP) & rows["status"].isin(("ok", "failed"))]
    return steps[steps["median_ms"].notna()].reset_index(drop=True)
