"""Inside one CTA of the Gluon kernel at B = 1: when each step happened (lab notes round 10).

A round-10 experiment folder under data/ holds, per call, `b1_steps.csv`: for each traced case
(next_n, context, and how it ran: cold or warm L2, with or without the descriptor prefetch) the
median over CTAs and launches of the ns after the CTA's loader started at which each step
happened. The experiment's own code (`experiments/<its name>/timeline_table.py`) made them from the
raw `traces.parquet`. Here they become the consecutive phases a chart draws (`plot_cta_phases`),
because the question they answer (what a B = 1 step waits for) is one of durations in sequence.
The folder and the call are parameters: notebook 03 passes round 10's.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from dsa_lab.batch.workload import format_tokens
from dsa_lab.paths import resolve_data_path, shown_path
from dsa_lab.plots.style import PART_PALETTE, add_footer, chart_text, legend_outside
from dsa_lab.store.folders import PROVENANCE_FILE

# (phase, the step column that ends it); each phase starts where the previous one ended, the first at 0.
PHASES = (
    ("context lengths read", "context_lengths_read_ns"),
    ("Q copy issued, page ids read", "first_kv_copy_issued_ns"),
    ("first KV tile in flight", "first_kv_tile_arrived_ns"),
    ("its MMA and epilogue", "first_epilogue_done_ns"),
    ("the other tiles, exit", "last_consumer_exit_ns"),
)
HOW = {"timed-cold": "cold L2", "timed-warm": "warm L2", "timed_prefetch-cold": "cold L2, descriptors prefetched"}


def cta_phases(path: str, call: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One row per (case, phase): `case` ('n=1, L=32K, cold L2'), `phase`, `start_ns`, `end_ns`,
    plus `q_arrived_ns` per case, from experiment folder `path` (under data/) and its call folder `call`;
    and the folder's provenance, its git naming `call`'s commit.

    Raises FileNotFoundError naming the missing file."""
    folder = resolve_data_path(path)
    steps_file = folder / call / "b1_steps.csv"
    for needed in (folder / PROVENANCE_FILE, steps_file):
        if not needed.is_file():
            raise FileNotFoundError(f"{shown_path(needed)} is missing: the round-10 timelines are not in this checkout")
    provenance = json.loads((folder / PROVENANCE_FILE).read_text(encoding="utf-8"))
    calls = (provenance.get("git") or {}).get("calls") or {}
    provenance = {**provenance, "git": calls.get(call, {})}
    steps = pd.read_csv(steps_file)
    rows = []
    for step in steps.itertuples(index=False):
        case = f"n={step.next_n}, L={format_tokens(step.context)}, {HOW.get(step.variant, step.variant)}"
        start = 0.0
        for phase, column in PHASES:
            end = float(getattr(step, column))
            rows.append(
                {
                    "case": case,
                    "next_n": step.next_n,
                    "context": step.context,
                    "variant": step.variant,
                    "phase": phase,
                    "start_ns": start,
                    "end_ns": end,
                    "q_arrived_ns": float(step.q_arrived_ns),
                }
            )
            start = end
    return pd.DataFrame(rows), provenance


def plot_cta_phases(phases: pd.DataFrame, device: str, provenance_line: str | None = None) -> Figure:
    """What one CTA of the Gluon kernel waits for at B = 1 (`cta_phases`): a bar
    per case, its consecutive phases from the loader's start, Q's arrival marked."""
    if phases.empty:
        raise ValueError("phases: no traced case to draw")
    cases = list(dict.fromkeys(phases["case"]))
    names = list(dict.fromkeys(phases["phase"]))
    colors = dict(
        zip(names, itertools.cycle(PART_PALETTE))
    )  # parts of a step: no strategy's colour (`style.PART_PALETTE`)
    fig, ax = plt.subplots(figsize=(11.5, 1.2 + 0.36 * len(cases)), constrained_layout=True)
    for phase in names:
        part = phases[phases["phase"] == phase].set_index("case").reindex(cases)
        ax.barh(
            cases,
            part["end_ns"] - part["start_ns"],
            left=part["start_ns"],
            color=colors[phase],
            label=phase,
            edgecolor="white",
            linewidth=0.6,
        )
    arrived = phases.drop_duplicates("case").set_index("case").reindex(cases)["q_arrived_ns"]
    ax.scatter(arrived, cases, marker="|", s=300, color="black", linewidths=2, zorder=3, label="Q arrived")
    ax.invert_yaxis()
    ax.set(xlabel="ns after the CTA's loader starts (median over CTAs and launches)", ylabel="")
    legend_outside(ax)
    title = (
        f"Inside one CTA of the gluon kernel at B = 1 on {chart_text(device)} (measured, instrumented copy): "
        "what the first tiles wait for"
    )
    fig.suptitle(title)
    return add_footer(fig, provenance_line)
