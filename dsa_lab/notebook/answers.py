"""The one answer, fed with runs: every measured study run of a GPU (or the one run a page was asked to read)
handed to `analysis.answers.fastest`, and the headline it gives at one (batch, context).

Every page that says what is fastest (the index, notebooks 00 and 02, the README's table) asks `answer` here,
so they agree wherever they show the same point, and each names the runs its numbers come from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from dsa_lab.analysis import answers
from dsa_lab.analysis.frames import one_view
from dsa_lab.analysis.headline import headline_section
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.kernels import vllm_backend
from dsa_lab.notebook.runs import ChosenRun, absent, chosen, every_run, named_run
from dsa_lab.notebook.sections import latency_run
from dsa_lab.plots.answers import AnswerGrid
from dsa_lab.plots.style import provenance_line
from dsa_lab.store import folders as store


@dataclass
class Answer:
    """`analysis.answers.fastest` over `runs` (newest first), the runs by id, and the runs passed over."""

    table: pd.DataFrame
    runs: dict[str, store.Run]
    ignored: list[tuple[str, str]] = field(default_factory=list)
    asked: str = ""  # the run a page was asked to read ('' : every run of the GPU)

    def run_of(self, rows: pd.DataFrame) -> store.Run:
        """The run most of `rows` come from."""
        return self.runs[Counter(rows["run_id"]).most_common(1)[0][0]]

    def chosen(self, rows: pd.DataFrame) -> ChosenRun:
        return chosen(self.run_of(rows), self.ignored)

    def newest_first(self, run_ids: pd.Series) -> pd.Series:
        """A sort key putting rows of newer runs first (`runs` is newest first)."""
        order = {run_id: i for i, run_id in enumerate(self.runs)}
        return run_ids.map(order)

    def run_ids(self, rows: pd.DataFrame) -> list[str]:
        """The runs `rows` come from, newest first."""
        return [run_id for run_id in self.runs if run_id in set(rows["run_id"])]


def answer(run_path: str = "", device: str = "h200") -> Answer:
    """The answer over every measured study run of `device` under data/ (`notebook.runs.every_run`), or over the
    one run `run_path` names when it is there (a run a page was asked to read: the user's, a CPU one too)."""
    asked = named_run(run_path)
    if asked is not None:
        runs, ignored = [asked], []
    else:
        runs, ignored = every_run(device)
        ignored = absent(run_path) + ignored
    frames = [
        answers.RunFrame(r.provenance["run_id"], r.provenance.get("device_name") or r.provenance["device"], r.results)
        for r in runs
    ]
    by_id = {r.provenance["run_id"]: r for r in runs}
    return Answer(answers.fastest(frames), by_id, ignored, run_path if asked is not None else "")


@dataclass
class Headline:
    """The headline at one (batch, context): its table (`analysis.answers.headline`, each row naming its run), the
    rows of the run it comes from (one view) for the chart, the run, and notes saying each substitution made."""

    table: pd.DataFrame
    results: pd.DataFrame
    batch: int
    context: str
    chosen: ChosenRun
    caption: str
    notes: tuple[str, ...]
    own_run: bool = True  # False: the page's main run, already announced (no run answers the point)

    @property
    def runs(self) -> str:
        """The runs its rows come from ('run-a, run-b')."""
        held = self.table["run_id"] if "run_id" in self.table else pd.Series([self.chosen.run.provenance["run_id"]])
        return ", ".join(dict.fromkeys(held))

    @property
    def speedups(self) -> bool:
        """Whether its speedups mean anything: GPU times, not a CPU's wall clock (`ChosenRun.on_gpu`)."""
        return self.chosen.on_gpu


def headline(found: Answer, batch: int, context: str) -> Headline | None:
    """The headline of `found` at (batch, context), else at the point it answers nearest (the largest batch at the
    context asked for, else at the longest uniform context), with a note saying so; None when it answers no
    point of the study's step (a run that did not time vLLM's route: the page says so)."""
    label = ContextSpec.parse(context).label
    notes = []
    rows = answers.headline(found.table, batch, label)
    if rows.empty:
        held = answers.points(found.table)
        if not held:
            return None
        uniform = [p for p in held if not ContextSpec.parse(p[1]).mixed] or held
        same = [p for p in uniform if p[1] == label]
        longest = max(uniform, key=lambda p: (int(p[1]) if p[1].isdigit() else 0, p[0]))
        shown_batch, label = (same or [longest])[0]
        notes.append(
            f"*The runs answer no point at B = {batch}, {context}; showing B = {shown_batch}, "
            f"{ContextSpec.parse(label).short}.*"
        )
        batch = shown_batch
        rows = answers.headline(found.table, batch, label)
    run = found.run_of(rows)
    others = [run_id for run_id in found.run_ids(rows) if run_id != run.provenance["run_id"]]
    if others:
        notes.append(f"*Some next_n of this point come from {', '.join(others)} (each row names its run).*")
    results, setting = one_view(run.results)
    if setting:
        notes.append(f"*{setting}*")
    return Headline(rows, results, batch, label, found.chosen(rows), provenance_line(run.provenance), tuple(notes))


def headline_view(
    run_path: str, device: str, batch: int, context: str, seed: int = 0, main: ChosenRun | None = None
) -> Headline:
    """The headline every page shows: the one answer's at (batch, context) (`headline`). When no run answers a
    point (none timed vLLM's route: a plug-in kernel's run, a CPU run, no data), the page's main run (`main`,
    else `sections.latency_run`'s) shows its own times at its nearest point instead, the note saying so and the
    page drawing no speedups from a CPU's wall clock."""
    found = answer(run_path, device)
    shown = headline(found, batch, context)
    if shown is not None:
        return shown
    own = main is None
    main = latency_run(run_path, device, seed) if main is None else main
    section = headline_section(main.run.results, batch, context)
    why = (
        f"*No run here times {vllm_backend().name} (what vLLM runs) on a GPU, so there is no answer to show: the "
        f"times below are {main.device_label}'s, run {main.run.provenance['run_id']}.*"
    )
    caption = provenance_line(main.run.provenance)
    caption = caption if main.measured else f"{main.device_label} | {caption}"
    table = section.table.assign(run_id=main.run.provenance["run_id"])
    notes = (why, *section.notes)
    return Headline(table, section.results, section.batch, section.context, main, caption, notes, own)


def grids(found: Answer, batch: int, whole_step: bool | None = None) -> list[AnswerGrid]:
    """The answer as grids of workloads by next_n (`plots.answers.AnswerGrid`): the whole step's (logits and
    top-k) at `batch` (else the batch answered most), the kernel's at that batch, then the whole step's and the
    kernel's at every batch for the workloads timed at several; `whole_step` keeps the whole step's (True) or the
    kernel's (False) only; empty ones left out."""
    shown = answers.grid_batch(found.table, batch)
    if shown is None:
        return []
    rows = answers.grid(found.table, [shown])
    several = answers.grid(
        answers.several_batches(found.table.sort_values("run_id", key=found.newest_first, kind="stable"))
    )
    device = rows["device"].iloc[0]
    every = [
        (
            True,
            AnswerGrid(
                rows[rows["whole_step"]], f"The whole step (logits and top-k) on {device}: what to use at B = {shown}"
            ),
        ),
        (False, AnswerGrid(rows[~rows["whole_step"]], f"The logits kernel on {device}: what to use at B = {shown}")),
        (
            True,
            AnswerGrid(several[several["whole_step"]], f"The whole step on {device} at every batch measured", True),
        ),
        (
            False,
            AnswerGrid(several[~several["whole_step"]], f"The logits kernel on {device} at every batch measured", True),
        ),
    ]
    return [grid for whole, grid in every if not grid.rows.empty and whole_step in (None, whole)]


def whole_step_grids(run: store.Run | None, batch: int) -> list[AnswerGrid]:
    """The whole step's answer grid of one run (a section's, `sections.WHOLE_STEP`); none without a run."""
    return [] if run is None else grids(answer(str(run.path)), batch, whole_step=True)
