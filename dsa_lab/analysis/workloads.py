"""Answers per serving workload: which strategy and kernel to use, per next_n and batch, on each workload a
run measured, and where the answer for a ragged batch reverses the uniform one's.

A *workload* here is what a point is besides its batch and next_n (`WORKLOAD`: the context spec, the shape,
the acceptance profile, the logits width, the timed unit and the timer); the inputs' axes of the axis table
(`axes.WORKLOAD_KEYS`) are a narrower thing. The answer at each point is `frames.recommend`'s, over every
backend the run timed (ours too), against vLLM 0.33's recorded route (`vllm_route`). Pure pandas; the
numbers of issue 19's closing note come from `python -m dsa_lab.analysis.workloads RUN` (`main`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

import pandas as pd

from dsa_lab import axes
from dsa_lab.analysis.frames import (
    POINT,
    by_point,
    context_order,
    recommend,
    timed,
    uniform_twin,
    vllm_path,
)
from dsa_lab.analysis.labels import pieces_title, workload_title
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.markup import md_code, md_text

WORKLOAD = tuple(k for k in POINT if k not in ("batch", "next_n"))  # what an answer holds for
STEP = ("batch", "next_n")  # the cells of one workload's answer


def is_ragged(row: Mapping[str, object]) -> bool:
    """A batch whose requests differ: a mixed or log-normal context, or an acceptance profile (ragged rows)."""
    return ContextSpec.parse(str(row["context"])).mixed or str(row["acceptance"]) != "none"


def workload_label(row: Mapping[str, object]) -> str:
    """For people (`labels.workload_title`): the context ('mixed 2K-128K') and every other workload axis away from
    its old-run value ("logits 160K wide (vLLM's max_model_len)", "logits + torch's top-k (not vLLM's)",
    'CUDA graph'); the shape when not the study's."""
    return workload_title(row)


def choice_label(strategy: str, backend: str, pieces: str = "") -> str:
    """'atom 4+4 (deepgemm)': one option, as the answer tables name it."""
    return f"{strategy}{f' {pieces_title(pieces)}' if pieces else ''} ({backend})"


def answers(frame: pd.DataFrame, backends: Sequence[str] | None = None) -> pd.DataFrame:
    """`frames.recommend` at every measured point (options: `backends`, default every backend timed), with
    its workload (`workload`, a label), `ragged`, the option to use (`choice`) beside vLLM's (`vllm_choice`) and
    what it gains over vLLM's (`gain`: vLLM's time / its time; 1 where vLLM's choice is kept)."""
    table = recommend(frame, backends)
    if table.empty:
        return table.assign(workload=[], ragged=[], choice=[], vllm_choice=[], gain=[])
    is_best = (table["recommended_backend"] == table["best_backend"]) & (
        table["recommended_strategy"] == table["best_strategy"]
    )
    pieces = table["best_pieces"].where(is_best, "")  # an atom's split, when the option to use is the best
    rows = table.to_dict("records")
    return table.assign(
        workload=[workload_label(r) for r in rows],
        ragged=[is_ragged(r) for r in rows],
        choice=[
            choice_label(s, b, p)
            for s, b, p in zip(table["recommended_strategy"], table["recommended_backend"], pieces)
        ],
        vllm_choice=[choice_label(s, b) for s, b in zip(table["vllm_strategy"], table["vllm_backend"])],
        gain=table["vllm_ms"] / table["recommended_ms"],
    )


def workload_order(table: pd.DataFrame) -> list[str]:
    """Workload labels: contexts in `frames.context_order`, then the other axes as drawn."""
    order = {c: i for i, c in enumerate(context_order(table["context"]))}
    firsts = table.drop_duplicates("workload").assign(rank=lambda t: t["context"].map(order))
    return list(firsts.sort_values(["rank", *(k for k in axes.SETTING_KEYS if k in firsts)])["workload"])


def answer_grid(table: pd.DataFrame, workload: str, value: str = "choice") -> pd.DataFrame:
    """One workload's answers as a grid: next_n down, batch across, `value` in each cell ('' untimed)."""
    part = table[table["workload"] == workload]
    if part.empty:
        raise ValueError(f"workload={workload!r}: not in the table; allowed values are {workload_order(table)}")
    return part.pivot_table(index="next_n", columns="batch", values=value, aggfunc="first").fillna("")


def answer_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per workload: its points, where the answer is vLLM's own choice, where another option beats vLLM beyond
    the spread (and the largest speedup), and the options used, most used first."""
    rows = []
    for workload in workload_order(table):
        part = table[table["workload"] == workload]
        beaten = part[part["beyond_spread"].fillna(False).astype(bool)]
        used = part["choice"].value_counts()
        rows.append(
            {
                "workload": workload,
                "ragged": bool(part["ragged"].iloc[0]),
                "batches": ", ".join(map(str, sorted(part["batch"].unique()))),
                "next_n": ", ".join(map(str, sorted(part["next_n"].unique()))),
                "points": len(part),
                "vLLM kept": len(part) - len(beaten),
                "vLLM beaten": len(beaten),
                "best speedup": float(beaten["speedup"].max()) if not beaten.empty else 1.0,
                "options used": "; ".join(f"{c} ×{n}" for c, n in used.items()),
            }
        )
    return pd.DataFrame(rows)


def _workload_of(table: pd.DataFrame, workload: str) -> pd.DataFrame:
    part = table[table["workload"] == workload]
    if part.empty:
        raise ValueError(f"workload={workload!r}: not in the table; allowed values are {workload_order(table)}")
    return part


def pairings(table: pd.DataFrame) -> list[tuple[str, str]]:
    """(uniform, ragged) workload pairs to compare: each ragged workload with the uniform one of the same other
    axes measured at the most of its (batch, next_n) cells; of equals, its uniform twin (`frames.uniform_twin`),
    then the longest. A ragged workload no uniform one shares a cell with is left out."""
    runs = table["run_id"] if "run_id" in table else pd.Series("", index=table.index)
    cells = {w: set(zip(p["batch"], p["next_n"], runs[p.index])) for w, p in table.groupby("workload")}
    firsts = table.drop_duplicates("workload").set_index("workload")
    others = [k for k in WORKLOAD if k != "context"]
    pairs = []
    for ragged in workload_order(table):
        row = firsts.loc[ragged]
        if not row["ragged"] or row["acceptance"] != "none":  # an acceptance profile pairs with its own next_n
            continue
        twin = uniform_twin(row["context"])
        candidates = [
            (len(cells[w] & cells[ragged]), firsts.loc[w, "context"] == twin, int(firsts.loc[w, "context"]), w)
            for w in firsts.index
            if not firsts.loc[w, "ragged"] and all(firsts.loc[w, k] == row[k] for k in others)
        ]
        candidates = [c for c in candidates if c[0] > 0]
        if candidates:
            pairs.append((max(candidates)[3], ragged))
    return pairs


def panels(table: pd.DataFrame) -> list[str]:
    """What to draw side by side: the uniform workload paired over the most cells, then its ragged partners."""
    pairs = pairings(table)
    if not pairs:
        return workload_order(table)[:1]
    cells = {pair: len(reversals(table, *pair)) for pair in pairs}
    uniform = max(cells, key=cells.get)[0]
    return [uniform, *(ragged for left, ragged in pairs if left == uniform)]


def reversals(table: pd.DataFrame, uniform: str, ragged: str) -> pd.DataFrame:
    """Per (batch, next_n) measured in both workloads (by one run, when `table` holds several runs' answers: the
    options two runs timed differ): the option to use on each and whether they differ (`differs`: another strategy
    or another kernel; `strategy_differs`: another strategy)."""
    keys = [*STEP, *(["run_id"] if "run_id" in table else [])]  # answers of several runs: a cell within one run
    left = _workload_of(table, uniform)[[*keys, "choice", "recommended_strategy", "recommended_ms"]]
    right = _workload_of(table, ragged)[[*keys, "choice", "recommended_strategy", "recommended_ms"]]
    both = left.merge(right, on=keys, suffixes=("_uniform", "_ragged"))
    both["differs"] = both["choice_uniform"] != both["choice_ragged"]
    both["strategy_differs"] = both["recommended_strategy_uniform"] != both["recommended_strategy_ragged"]
    both.insert(0, "ragged", ragged)
    both.insert(0, "uniform", uniform)
    return both.sort_values(list(STEP)).reset_index(drop=True)


def reversal_counts(table: pd.DataFrame, pairs: Sequence[tuple[str, str]] | None = None) -> pd.DataFrame:
    """Per (uniform, ragged) pair (default: `pairings`): the cells both measured and those whose answer differs."""
    rows = []
    for uniform, ragged in pairings(table) if pairs is None else pairs:
        cells = reversals(table, uniform, ragged)
        rows.append(
            {
                "uniform": uniform,
                "ragged": ragged,
                "cells": len(cells),
                "answer differs": int(cells["differs"].sum()),
                "strategy differs": int(cells["strategy_differs"].sum()),
                "batches": ", ".join(map(str, sorted(cells["batch"].unique()))),
            }
        )
    return pd.DataFrame(rows)


def reversal_reading(table: pd.DataFrame, run_id: str, pairs: Sequence[tuple[str, str]] | None = None) -> str:
    """Markdown: per pair, how many cells keep the uniform batch's answer and which reverse, in words."""
    pairs = pairings(table) if pairs is None else pairs
    if not pairs:
        return f"Run {md_code(run_id)} holds no ragged workload beside a uniform one at a shared (batch, next_n)."
    lines = [f"**Uniform against ragged batches, run {md_code(run_id)}** (the option to use at the same B and next_n):"]
    for uniform, ragged in pairs:
        cells = reversals(table, uniform, ragged)
        flips = cells[cells["differs"]]
        head = (
            f"- **{md_text(ragged)}** against **{md_text(uniform)}**: the answer differs in {len(flips)} of "
            f"{len(cells)} cells ({int(cells['strategy_differs'].sum())} by strategy)"
        )
        shown = [
            f"B = {r.batch}, next_n = {r.next_n}: {md_text(r.choice_uniform)} on the uniform batch, "
            f"{md_text(r.choice_ragged)} on the ragged one"
            for r in flips.head(4).itertuples()
        ]
        more = f"; and {len(flips) - 4} more" if len(flips) > 4 else ""
        lines.append(head + (": " + "; ".join(shown) + more + "." if shown else ": the uniform answer holds."))
    return "\n".join(lines)


def step_options(
    frame: pd.DataFrame,
    batch: int = 128,
    next_n: int = 3,
    context: str = "mixed:2048-131072",
    unit: str = "logits+topk",
) -> pd.DataFrame:
    """Every option timed at one step of `unit` (default the logits + top-k step): per timer, backend and
    strategy its median and IQR in µs, vLLM 0.33's route marked (`vllm`), fastest first."""
    context = ContextSpec.parse(context).label
    data = timed(frame)
    data = data[(data["batch"] == batch) & (data["next_n"] == next_n) & (data["context"] == context)]
    data = data[(data["timed"] == unit) & (data["acceptance"] == "none")]
    if data.empty:
        raise ValueError(f"batch={batch}, next_n={next_n}, context={context!r}, timed={unit!r}: no timed rows")
    route = vllm_path(data)[[*POINT, "vllm_strategy", "vllm_backend"]]
    data = data.merge(route, on=POINT, how="left")
    setting = [k for k in axes.SETTING_KEYS if k not in ("acceptance", "timed")]  # fixed above: the rest vary
    return (
        data.assign(
            vllm=(data["strategy"] == data["vllm_strategy"]) & (data["backend"] == data["vllm_backend"]),
            pieces=data["pieces"].where(data["strategy"] == "atom", ""),
            median_us=data["median_ms"] * 1e3,
            p25_us=data["p25_ms"] * 1e3,
            p75_us=data["p75_ms"] * 1e3,
        )[[*setting, *axes.OPTION_KEYS, "pieces", "median_us", "p25_us", "p75_us", "vllm"]]
        .sort_values(["timer", "logits_width", "median_us"])
        .reset_index(drop=True)
    )


def ragged_kernels(frame: pd.DataFrame, contexts: Sequence[str], candidate: str) -> pd.DataFrame:
    """On ragged contexts (default axes otherwise): the candidate kernel's native time beside the fastest option
    of each other backend, and each other's time over the candidate's (> 1: the candidate is faster)."""
    labels = [ContextSpec.parse(c).label for c in contexts]
    data = timed(frame)
    data = data[data["context"].isin(labels) & default_axes(data)]
    best = data.loc[data.groupby([*POINT, "backend"])["median_ms"].idxmin()]
    mine = data[(data["backend"] == candidate) & (data["strategy"] == "native")].set_index(POINT)["median_ms"]
    wide = best.pivot_table(index=POINT, columns="backend", values="median_ms").mul(1e3)
    others = [b for b in wide.columns if b != candidate]
    table = wide.assign(**{f"{b} / {candidate}": wide[b] / (mine * 1e3) for b in others})
    table = by_point(table.reset_index())
    return table[[*axes.STEP_KEYS, *wide.columns, *(f"{b} / {candidate}" for b in others)]]


def ragged_contexts(frame: pd.DataFrame, batch: int) -> list[str]:
    """The mixed and log-normal contexts timed at `batch` (default serving axes), in `frames.context_order`."""
    data = timed(frame)
    data = data[(data["batch"] == batch) & default_axes(data)]
    return [c for c in context_order(data["context"]) if ContextSpec.parse(c).mixed]


def ragged_reading(table: pd.DataFrame, candidate: str) -> str:
    """Markdown: per ragged context of `ragged_kernels`, at how many points the candidate is the fastest kernel
    and its range against each other backend's fastest option."""
    lines = []
    others = [c.removesuffix(f" / {candidate}") for c in table.columns if c.endswith(f" / {candidate}")]
    for context in context_order(table["context"]):
        part = table[table["context"] == context].dropna(subset=[candidate])
        ratios = part[[f"{b} / {candidate}" for b in others]].dropna(axis="columns", how="all")
        faster = int((ratios.min(axis="columns") > 1).sum())
        spans = [
            f"{md_text(c.removesuffix(f' / {candidate}'))} {part[c].min():.2f}-{part[c].max():.2f}×"
            for c in ratios.columns
        ]
        lines.append(
            f"- **{md_text(ContextSpec.parse(context).short)}**: {md_text(candidate)} native is the fastest kernel at "
            f"{faster} of {len(part)} points (batch, next_n); the others' fastest over it: {'; '.join(spans)}."
        )
    return "\n".join(lines) or f"No ragged point with {md_text(candidate)} timed."


def default_axes(data: pd.DataFrame) -> pd.Series:
    """Rows at every serving axis's old-run value (no acceptance profile, batch width, logits, events)."""
    return axes.at_old_values(data)


def _markdown(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False, floatfmt=".1f")


def main(argv: Sequence[str] | None = None) -> int:
    """Issue 19's closing numbers from a serving run: the answers per workload, the cells whose answer differs
    between uniform and ragged batches (the pairs `pairings` makes), and every option's logits + top-k step."""
    from dsa_lab.paths import resolve_data_path
    from dsa_lab.store import folders as store

    parser = argparse.ArgumentParser(prog="python -m dsa_lab.analysis.workloads", description=main.__doc__)
    parser.add_argument("run", help="a run folder, or a path relative to data/ (e.g. h200/RUN_ID)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--next-n", type=int, default=3)
    parser.add_argument("--context", default="mixed:2K-128K")
    args = parser.parse_args(argv)
    run = store.load_run(resolve_data_path(args.run))
    table = answers(run.results)
    print(f"# Answers per workload, run {run.provenance['run_id']}\n")
    print(_markdown(answer_summary(table)) + "\n")
    for workload in workload_order(table):
        print(f"## {workload}\n\n" + answer_grid(table, workload).reset_index().to_markdown(index=False) + "\n")
    print("# Uniform against ragged\n\n" + _markdown(reversal_counts(table)) + "\n")
    print(reversal_reading(table, run.provenance["run_id"]) + "\n")
    print(f"# Every option at B = {args.batch}, next_n = {args.next_n}, {args.context}, logits + top-k (µs)\n")
    print(_markdown(step_options(run.results, args.batch, args.next_n, args.context)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
