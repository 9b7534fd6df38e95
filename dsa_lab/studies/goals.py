"""Issue 13's goals for a candidate kernel against every DeepGEMM option, read from one run (a study).

The candidate is its backend's *native* strategy; "the best DeepGEMM option" at a point is the
fastest timed row of every DeepGEMM strategy (native, atom, flatten) over every DeepGEMM backend
(`frames.vllm_family`: the vendored release and the PR #340 build), so a backend missing
from a run simply does not compete. The floor is the roofline time of a kernel that reads the KV
cache once, at the run's measured ceilings (`analysis.modeled.modeled_native_rows`); a run
without ceilings falls back to its GPU's table row (`roofline.gpu_for_device`), named in
`floor_gpu`. Every time comes from the run; `Goals` holds the issue's thresholds only.

Drawn and styled in `studies.goal_display` (`plot_goal_ratio_heatmap`, `style_goal_points`,
`style_goal_summary`, `style_ncu_comparison`); the run judged and the Nsight Compute comparison are found by
`studies.goal_runs`; notebook 03 passes the run and the candidate.

Goals 1-3 speak of one context length L, so they apply to uniform contexts only; goal 4 applies
to any context at its batch sizes. A verdict is True or False where the goal applies and both
sides were timed, NA otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dsa_lab.analysis.frames import POINT, best_option, by_point, measured_ok, one_view, vllm_family
from dsa_lab.analysis.modeled import modeled_native_rows
from dsa_lab.batch.workload import ContextSpec, format_tokens
from dsa_lab.model.roofline import gpu_for_device

SMALL_BATCH_STRATEGIES = ("flatten", "atom")  # goal 4's rivals: the strategies any DeepGEMM runs at any next_n
GOAL_COLUMNS = ("goal1", "goal2", "goal3", "goal4")


@dataclass(frozen=True)
class Goals:
    """Issue 13's thresholds (H200, one run): what the candidate's native time must meet, not measurements."""

    ratio: float = 1.00  # goal 1: candidate / best DeepGEMM option at most this ...
    min_batch: int = 64  # ... at B >= min_batch
    min_context: int = 32 * 1024  # ... and L >= min_context
    next_ns: tuple[int, ...] = tuple(range(1, 9))  # ... at every one of these next_n
    point: tuple[int, int, int] = (128, 64 * 1024, 3)  # goal 2: (batch, context, next_n) ...
    point_us: float = 400.0  # ... in at most this many µs
    floor_share: float = 0.80  # goal 3: floor time / candidate time at least this ...
    floor_tokens: int = 4 * 2**20  # ... wherever B * L >= floor_tokens
    small_batches: tuple[int, ...] = (1, 16)  # goal 4: never slower than DeepGEMM flatten/atom here


GOALS = Goals()


def _where(batch: int, context: str, next_n: int | None = None) -> str:
    return (f"n={next_n} " if next_n is not None else "") + f"B={batch} L={ContextSpec.parse(context).short}"


def _applicable(table: pd.DataFrame, goals: Goals) -> dict[str, pd.Series]:
    """Per goal, the rows it applies to (goals 1-3: uniform contexts only)."""
    specs = table["context"].map(ContextSpec.parse)
    uniform = ~specs.map(lambda s: s.mixed).astype(bool)
    length = specs.map(lambda s: s.high).astype(int)
    batch, next_n = table["batch"].astype(int), table["next_n"].astype(int)
    point_batch, point_context, point_n = goals.point
    return {
        "goal1": uniform & (batch >= goals.min_batch) & (length >= goals.min_context) & next_n.isin(goals.next_ns),
        "goal2": uniform & (batch == point_batch) & (length == point_context) & (next_n == point_n),
        "goal3": uniform & (batch * length >= goals.floor_tokens),
        "goal4": batch.isin(goals.small_batches),
    }


def _verdict(applies: pd.Series, passed: pd.Series, known: pd.Series) -> pd.Series:
    verdict = pd.Series(pd.NA, index=applies.index, dtype="boolean")
    judged = applies & known
    verdict[judged] = passed[judged].astype(bool)
    return verdict


def _floors(results: pd.DataFrame, provenance: Mapping[str, Any]) -> tuple[pd.DataFrame, str | None]:
    """The floor (ms) per point at the run's ceilings, and the name of those ceilings (None: no GPU row)."""
    name = provenance.get("device_name") or provenance.get("device") or ""
    gpu = gpu_for_device(str(name), provenance.get("ceilings"))
    if gpu is None:
        return pd.DataFrame(columns=[*POINT, "floor_ms"]), None
    if "seed" not in provenance:
        raise ValueError("provenance: no 'seed'; the floor needs it to draw mixed contexts' lengths as the run did")
    rows = modeled_native_rows(results, [gpu], int(provenance["seed"]))
    return rows[[*POINT, "floor_ms"]], gpu.name


def goal_points(
    results: pd.DataFrame,
    provenance: Mapping[str, Any],
    candidate: str,
    baselines: Sequence[str] | None = None,
    goals: Goals = GOALS,
) -> pd.DataFrame:
    """One row per measured (batch, context, next_n) of a run (of one shape and serving setting,
    `frames.one_view`: the goals are about uniform logits steps): the candidate's native median (`candidate_us`),
    the best option of `baselines` (`best_us`, `best_backend`, `best_strategy`), `ratio` = candidate / best (the
    goals' thresholds) and `speedup` = best / candidate (> 1: the candidate wins; what every table shows), the
    best of their flatten and atom (`flatten_atom_*`, `flatten_atom_ratio`, `flatten_atom_speedup`), the floor
    (`floor_us`, at `floor_gpu`'s ceilings) and `floor_share` = floor / candidate, and a verdict per goal
    (`goal1`..`goal4`: True, False, or NA where the goal does not apply or a side was not timed).

    Raises ValueError when the candidate's native strategy has no measured timed row in `results`.
    """
    results = one_view(results)[0]
    data = measured_ok(results)
    mine = data[(data["backend"] == candidate) & (data["strategy"] == "native")]
    if mine.empty:
        timed = sorted(set(data["backend"] + "/" + data["strategy"]))
        raise ValueError(f"candidate={candidate!r}: no measured timed 'native' rows; timed (backend/strategy): {timed}")
    table = data[POINT].drop_duplicates()
    table = table.merge(mine[[*POINT, "median_ms"]].rename(columns={"median_ms": "candidate_ms"}), on=POINT, how="left")
    kept = [*POINT, "best_backend", "best_strategy", "best_ms"]
    baselines = vllm_family() if baselines is None else baselines
    best = best_option(results, baselines, twins=True)[kept]  # the goals hold every timed launch, twins too
    rivals = best_option(results, baselines, SMALL_BATCH_STRATEGIES, twins=True)[kept]
    rivals = rivals.rename(columns=lambda c: c.replace("best_", "flatten_atom_"))
    floors, floor_gpu = _floors(results, provenance)
    table = table.merge(best, on=POINT, how="left").merge(rivals, on=POINT, how="left")
    table = table.merge(floors, on=POINT, how="left")
    table["floor_gpu"] = floor_gpu
    for column in ("candidate", "best", "flatten_atom", "floor"):
        table[f"{column}_us"] = table.pop(f"{column}_ms").astype(float) * 1e3
    table["ratio"] = table["candidate_us"] / table["best_us"]
    table["flatten_atom_ratio"] = table["candidate_us"] / table["flatten_atom_us"]
    table["speedup"] = 1 / table["ratio"]
    table["flatten_atom_speedup"] = 1 / table["flatten_atom_ratio"]
    table["floor_share"] = table["floor_us"] / table["candidate_us"]
    applies = _applicable(table, goals)
    mine_known = table["candidate_us"].notna()
    table["goal1"] = _verdict(applies["goal1"], table["ratio"] <= goals.ratio, table["ratio"].notna())
    table["goal2"] = _verdict(applies["goal2"], table["candidate_us"] <= goals.point_us, mine_known)
    table["goal3"] = _verdict(applies["goal3"], table["floor_share"] >= goals.floor_share, table["floor_share"].notna())
    table["goal4"] = _verdict(applies["goal4"], table["flatten_atom_ratio"] <= 1.0, table["flatten_atom_ratio"].notna())
    return by_point(table)


def goal_summary(points: pd.DataFrame, goals: Goals = GOALS) -> pd.DataFrame:
    """Goal 1 per next_n over the shapes it applies to: `shapes` timed on both sides, `speedup_min`/`speedup_max`
    (the best DeepGEMM option's time over the candidate's), how many `met` it, and the `worst` shape. Every next_n
    of the goal gets a row (shapes 0: not measured)."""
    shapes = points[_applicable(points, goals)["goal1"] & points["ratio"].notna()]
    rows = []
    for n in sorted({*goals.next_ns, *shapes["next_n"].astype(int)}):
        part = shapes[shapes["next_n"] == n]
        worst = part.loc[part["ratio"].idxmax()] if not part.empty else None
        rows.append(
            {
                "next_n": n,
                "shapes": len(part),
                "speedup_min": part["speedup"].min(),
                "speedup_max": part["speedup"].max(),
                "met": int(part["goal1"].sum()),
                "worst": _where(int(worst.batch), worst.context) if worst is not None else "",
            }
        )
    return pd.DataFrame(rows, columns=["next_n", "shapes", "speedup_min", "speedup_max", "met", "worst"])


def _span(values: pd.Series, fmt: str) -> str:
    low, high = format(values.min(), fmt), format(values.max(), fmt)
    return low if low == high else f"{low}–{high}"


def _per_next_n(rows: pd.DataFrame, column: str, fmt: str, unit: str) -> str:
    """'n=1 (1.01–1.02×), n=3 (0.89×)': `column`'s span per next_n."""
    return ", ".join(f"n={n} ({_span(part[column], fmt)}{unit})" for n, part in rows.groupby("next_n"))


def _judged(points: pd.DataFrame, goal: str, goals: Goals) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """The rows a goal was judged at, those that missed it, and how many rows it applies to unjudged."""
    applies = points[_applicable(points, goals)[goal]]
    judged = applies[applies[goal].notna()]
    return judged, judged[~judged[goal].astype(bool)], len(applies) - len(judged)


def _sentence(
    goal: int, head: str, judged: pd.DataFrame, missed: pd.DataFrame, unjudged: int, body: str, absent: str = ""
) -> str:
    """'**Goal N met|missed|not met|not judged** (head): body': 'not met' when nothing missed but part of
    the goal went unmeasured (`unjudged` shapes without a time on one side, or `absent` said in words)."""
    if judged.empty:
        why = f"{unjudged} shape(s) it applies to lack a time on one side" if unjudged else "no shape it applies to"
        return f"**Goal {goal} not judged** ({head}): {why} in this run."
    verdict = "missed" if len(missed) else "not met" if unjudged or absent else "met"
    more = f" Not judged at {unjudged} more shape(s): a side not timed." if unjudged else ""
    return f"**Goal {goal} {verdict}** ({head}): {body}{absent}{more}"


def goal_sentences(points: pd.DataFrame, candidate: str, goals: Goals = GOALS) -> list[str]:
    """One markdown sentence per goal from `goal_points`: met, missed (where, by how much) or not judged."""
    name = f"{candidate} native"
    sentences = []

    judged, missed, unjudged = _judged(points, "goal1", goals)
    absent = sorted(set(goals.next_ns) - set(judged["next_n"].astype(int)))
    head = (
        f"{name} ≤ {goals.ratio:.2f}× the best DeepGEMM option at B ≥ {goals.min_batch}, "
        f"L ≥ {format_tokens(goals.min_context)}, every next_n in {goals.next_ns[0]}..{goals.next_ns[-1]}"
    )
    body = f"best / {name} {_span(judged['speedup'], '.3f')}× over {len(judged)} shapes"
    if not missed.empty:
        worst = missed.loc[missed["ratio"].idxmax()]
        body += (
            f"; below {1 / goals.ratio:.2f}× at {len(missed)}, by next_n: "
            f"{_per_next_n(missed, 'speedup', '.3f', '×')} "
            f"(worst {_where(worst.batch, worst.context, worst.next_n)}: {worst.candidate_us:.1f} µs against "
            f"{worst.best_strategy} ({worst.best_backend}) {worst.best_us:.1f} µs)"
        )
    sentences.append(
        _sentence(1, head, judged, missed, unjudged, body + ".", f" next_n {absent} not measured." if absent else "")
    )

    judged, missed, unjudged = _judged(points, "goal2", goals)
    batch, context, n = goals.point
    head = f"next_n = {n} at B = {batch}, L = {format_tokens(context)} in ≤ {goals.point_us:.0f} µs"
    us = float(judged["candidate_us"].iloc[0]) if not judged.empty else float("nan")
    body = f"{name} takes {us:.1f} µs ({us / goals.point_us:.2f}× the goal)."
    sentences.append(_sentence(2, head, judged, missed, unjudged, body))

    judged, missed, unjudged = _judged(points, "goal3", goals)
    head = f"≥ {100 * goals.floor_share:.0f} % of the floor wherever B·L ≥ {goals.floor_tokens / 2**20:g}M tokens"
    ceilings = ", ".join(dict.fromkeys(judged["floor_gpu"].dropna()))
    body = (
        f"{_span(100 * judged['floor_share'], '.1f')} % of the floor at {ceilings} ceilings over {len(judged)} shapes"
    )
    if not missed.empty:
        shares = missed.assign(share=100 * missed["floor_share"])
        body += f"; below at {len(missed)}, by next_n: {_per_next_n(shares, 'share', '.1f', ' %')}"
    sentences.append(_sentence(3, head, judged, missed, unjudged, body + "."))

    judged, missed, unjudged = _judged(points, "goal4", goals)
    batches = " and ".join(str(b) for b in goals.small_batches)
    head = f"at B = {batches}, {name} never slower than the best DeepGEMM flatten or atom"
    body = f"best flatten or atom / {name} {_span(judged['flatten_atom_speedup'], '.3f')}× over {len(judged)} shapes"
    if not missed.empty:
        worst = missed.loc[missed["flatten_atom_ratio"].idxmax()]
        body += (
            f"; slower at {len(missed)}, by next_n: {_per_next_n(missed, 'flatten_atom_speedup', '.3f', '×')} "
            f"(worst {_where(worst.batch, worst.context, worst.next_n)}: against {worst.flatten_atom_strategy} "
            f"({worst.flatten_atom_backend}) {worst.flatten_atom_us:.1f} µs)"
        )
    sentences.append(_sentence(4, head, judged, missed, unjudged, body + "."))
    return sentences
