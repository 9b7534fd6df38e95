"""What each section of notebooks 02 and 03 draws from its run, resolved here once, so that no notebook cell
branches on what kind of run it shows.

Three kinds of run reach a section (`notebook.runs.ChosenRun`): a GPU measurement (its speedups mean
something), a CPU run of one's own (wall-clock times, which drift between runs by more than most speedups:
shown as times, never as speedups) and the CPU stand-in made when no run is there (the same, beside the H200
roofline model, labelled modeled). Each function returns what to draw and a note saying what is not drawn and
why; a note is '' when nothing needs saying.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from dsa_lab.analysis import frames, modeled, readings
from dsa_lab.analysis.labels import baseline_label
from dsa_lab.kernels import baseline_backend, vllm_backend
from dsa_lab.markup import md_code, md_text
from dsa_lab.model.roofline import get_gpu
from dsa_lab.notebook.display import show_provenance
from dsa_lab.notebook.runs import ChosenRun, timed_backends

H200 = "H200"
MODEL_GRID = {"batches": (16, 64), "contexts": ("8192", "65536", "mixed:1K-64K"), "next_ns": range(1, 9)}


def wall_clock(chosen: ChosenRun) -> str:
    """Why a CPU run's section shows no speedups, in one line ('' for a GPU run): a CPU's wall clock drifts
    between two runs of the same code by more than most speedups (the notebooks' introductions say so once)."""
    if chosen.on_gpu:
        return ""
    return f"*No speedups here: run {md_code(chosen.run.provenance['run_id'])} was timed by a CPU's wall clock.*"


def run_seed(chosen: ChosenRun, seed: int) -> int:
    """The seed mixed contexts were drawn with: the run's own, the notebook's for a stand-in made now."""
    return int(chosen.run.provenance.get("seed", seed)) if chosen.measured else seed


def speedup_panels(
    chosen: ChosenRun, results: pd.DataFrame, overlay_modeled: bool, seed: int
) -> tuple[list[tuple[str, pd.DataFrame]], str]:
    """The speedup heatmaps' (label, frame) panels: a GPU run's rows, with the roofline model at its ceilings
    beside them when `overlay_modeled`; a CPU run's none, the H200 roofline model instead (modeled; its provenance
    shown, as every chart's data is)."""
    if chosen.on_gpu:
        roofline = (
            modeled.modeled_rows_like(results, chosen.gpu, run_seed(chosen, seed))
            if overlay_modeled and chosen.gpu
            else None
        )
        return [
            (
                chosen.device_label,
                pd.concat([results, roofline], ignore_index=True) if roofline is not None else results,
            )
        ], ""
    gpu = get_gpu("H200-measured")
    grid = modeled.modeled_grid(gpu=gpu, seed=seed, **MODEL_GRID)
    show_provenance({"source": "modeled", "roofline_gpu": gpu.name, "ceilings": gpu.source}, "modeled H200 times")
    return [(H200, grid)], wall_clock(chosen) + " *The H200 panels below are the roofline model's (modeled).*"


def decision_tables(
    chosen: ChosenRun, results: pd.DataFrame, wanted: str, seed: int
) -> tuple[list[tuple[str, str, pd.DataFrame]], str]:
    """(label, backend, `frames.decisions` table) per decision table, and a note: a GPU run's on `wanted` (or the
    most-timed backend, said), a CPU run's none (its speedups are noise), the H200 roofline model's instead."""
    if chosen.on_gpu:
        backend, why = frames.decision_backend(results, wanted, chosen.run.provenance["run_id"])
        return [(chosen.device_label, backend, frames.decisions(results, backend))], why or ""
    grid = modeled.modeled_grid(gpu=get_gpu("H200-measured"), seed=seed, **MODEL_GRID)
    backend = grid["backend"].iloc[0]
    return [(f"{H200} (modeled)", backend, frames.decisions(grid, backend))], wall_clock(chosen)


def mixed_gap_reading(
    chosen: ChosenRun, results: pd.DataFrame, candidate: tuple[str, str], seed: int, baseline: object = None
) -> str:
    """`readings.mixed_context_reading` for a GPU run; '' for a CPU run (its section says why once)."""
    if not chosen.on_gpu:
        return ""
    gap = frames.mixed_context_gap(results, run_seed(chosen, seed), candidate, baseline)
    return readings.mixed_context_reading(gap, chosen.device_label, candidate, baseline)


@dataclass(frozen=True)
class Candidate:
    """Notebook 03's two sides: the candidate (backend, strategy), the baseline backends (the best of them is
    held against it) and their label, and a note when either is not the one asked for."""

    candidate: tuple[str, str]
    baseline: tuple[str, ...]
    label: str
    note: str

    @property
    def held_to(self) -> str:
        """'*gluon native, held to the best DeepGEMM option (deepgemm, deepgemm-pr340).*': the page's two sides."""
        return f"*{md_text(self.candidate[0])} native, held to {md_text(self.label)}.*"


def candidate_of(results: pd.DataFrame, wanted: str) -> Candidate:
    """The candidate and baseline of notebook 03 for this run: `wanted` native against the best over every
    DeepGEMM build timed in it (`frames.vllm_family`). A run without `wanted` (a plug-in kernel's, a CPU one)
    takes the first backend it timed that is neither DeepGEMM nor the correctness baseline, and a run without
    DeepGEMM is held to the correctness baseline (the reference); the note says each substitution."""
    timed = sorted(set(results.loc[results["status"] == "ok", "backend"]))
    if not timed:
        raise ValueError("results: no point timed ok, nothing to compare")
    family = tuple(b for b in frames.vllm_family() if b in timed)
    reference = baseline_backend().name
    notes = []
    candidate = wanted
    if wanted not in timed:
        others = [b for b in timed if b not in family and b != reference]
        candidate = others[0] if others else timed[0]
        notes.append(f"{md_code(wanted)} was not timed in this run; the candidate is {md_code(candidate)}")
    baseline = family or ((reference,) if reference in timed and reference != candidate else ())
    if not family:
        if not baseline:
            baseline = (candidate,)
        notes.append(
            f"{md_text(vllm_backend().name)} (what vLLM runs) was not timed; the baseline is {md_code(baseline[0])}"
        )
    note = f"*{'; '.join(notes)} (timed: {', '.join(map(md_text, timed))}).*" if notes else ""
    return Candidate((candidate, "native"), baseline, baseline_label(baseline), note)


def roofline_note(chosen: ChosenRun) -> str:
    """Why a roofline is not drawn ('' when it is): a run with no GPU ceilings (a CPU run) has none to draw."""
    if chosen.on_gpu and chosen.gpu is not None:
        return ""
    return (
        f"*No roofline: {md_text(chosen.device_label)} has no GPU ceilings (HBM bandwidth, FP8 rate) to draw "
        "its points under. Notebook 02 draws the H200's modeled speedups instead.*"
    )


def measured_points(chosen: ChosenRun, results: pd.DataFrame) -> pd.DataFrame | None:
    """A GPU run's rows, for what sets other numbers beside measured ones (the model's points, SM100's bars);
    None for a CPU run (the model's own grid then)."""
    return results if chosen.on_gpu else None


def vs_vllm(chosen: ChosenRun, results: pd.DataFrame) -> tuple[pd.DataFrame | None, str]:
    """The rows whose speedup over vLLM's choice a chart draws: a GPU run's, when it timed what vLLM runs; else
    None and why."""
    if not chosen.on_gpu:
        return None, wall_clock(chosen)
    if vllm_backend().name not in timed_backends(chosen.run):
        return None, f"*{md_text(vllm_backend().name)} (what vLLM runs) was not timed: no speedup over its choice.*"
    return results, ""


def with_floor(chosen: ChosenRun, results: pd.DataFrame, seed: int) -> pd.DataFrame:
    """A GPU run's rows with the roofline floor of a kernel that reads the KV once at its ceilings (modeled); a
    CPU run's as they are."""
    if not (chosen.on_gpu and chosen.gpu):
        return results
    floor = modeled.modeled_native_rows(results, [chosen.gpu], run_seed(chosen, seed))
    return pd.concat([results, floor], ignore_index=True)


def comparison_reading(chosen: ChosenRun, comparison: pd.DataFrame, batch: int, context: str, sides: Candidate) -> str:
    """`readings.comparison_reading` for a GPU run; for a CPU run, why its speedups are not read."""
    if not chosen.on_gpu:
        return wall_clock(chosen)
    return readings.comparison_reading(comparison, batch, context, chosen.device_label, sides.candidate, sides.baseline)
