"""What an SM100 section shows: a measured SM100 run when one lies under data/ (`runs.sm100_run`, found by its
recorded compute capability), else the calibrated model's rows (`analysis.modeled.calibrated_rows`), labelled
modeled; and where its per-strategy chart looks. Choosing the run is the notebook room's job; the rows it reads
are analysis's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from dsa_lab.analysis.modeled import SM100_GPUS, SM100_PLATFORM, calibrated_rows
from dsa_lab.analysis.versus import pick_point
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.kernels import vllm_backend
from dsa_lab.markup import md_code, md_text
from dsa_lab.notebook.runs import SM100_SWEEP_HOW, ChosenRun, sm100_evidence, sm100_run
from dsa_lab.paths import resolve_data_path, shown_path
from dsa_lab.policy.vllm import Platform


@dataclass
class Sm100Frame:
    """What notebook 03's SM100 section draws, and how to label it.

    `frame`: a run's columns. Measured: the SM100 run's rows (every status; charts keep the
    'ok' ones), plus the calibrated model at its points when asked. Modeled: the calibrated
    model's rows, `source='modeled'`. `note` says which in one sentence (with the command
    that makes a run when there is none); `chosen` is the run (for `runs.announce`);
    `ignored` the runs passed over and why; `platform` is vLLM's SM100 platform for
    `frames.vllm_path` (whose 'varlen' is the harness's DeepGEMM 'native' there).
    """

    frame: pd.DataFrame
    measured: bool
    label: str
    note: str
    chosen: ChosenRun | None = None
    ignored: list[tuple[str, str]] = field(default_factory=list)
    platform: Platform = SM100_PLATFORM

    @property
    def drawn(self) -> bool:
        """Whether there is a row to draw (none: every point lay outside the model's domain, which `note` says)."""
        return not self.frame.empty


def _model_gpu(device_name: str) -> str | None:
    """The model's row for a device name ('NVIDIA GB200' -> 'GB200'), None for a GPU it has no row for."""
    upper = device_name.upper()
    return next((name for name in ("GB200", "B200") if name in upper), None)


def sm100_frame(
    points: pd.DataFrame | None = None,
    seed: int = 0,
    gpus: Sequence[str] = SM100_GPUS,
    backend: str | None = None,
    with_model: bool = False,
) -> Sm100Frame:
    """Measured SM100 rows when a run exists under data/ (`runs.sm100_run`; `backend`: one that timed
    it), else the calibrated model's rows for `gpus` at `points` (`calibrated_rows`), labelled 'modeled'.
    `with_model` adds, beside a measured run, the model's rows for its GPU at its points (the model's
    error on SM100, once there is a measurement to hold it to)."""
    chosen, ignored = sm100_run(backend)
    if chosen is not None:
        run = chosen.run
        frame = run.results.copy()
        ok = frame[frame["status"] == "ok"]
        gpu = _model_gpu(chosen.device_label)
        if with_model and gpu is not None and not ok.empty:
            frame = pd.concat([frame, calibrated_rows(ok, [gpu], run.provenance["seed"])], ignore_index=True)
        where = f"{run.path.parent.name}/{run.path.name}"  # data/<device>/<run_id>, as the run folders lie
        note = (
            f"Measured on {md_text(chosen.device_label)} ({sm100_evidence(run.provenance)}): run "
            f"{md_code(run.provenance['run_id'])} ({md_code(where)}), "
            f"created {md_text(run.provenance['created'])}, {len(ok)} points timed."
        )
        return Sm100Frame(frame, True, chosen.device_label, note, chosen, ignored)
    passed = f" ({len(ignored)} run(s) passed over, listed below)" if ignored else ""
    rows = calibrated_rows(points, gpus, seed)
    missing = f" Not modeled: {md_text('; '.join(rows.attrs['not_modeled']))}." if rows.attrs["not_modeled"] else ""
    what = (
        "and nothing to model"
        if rows.empty
        else "these times are **modeled, not measured** (dsa_lab.model: efficiencies fitted on the H200 sweep, at "
        f"{', '.join(gpus)} ceilings)"
    )
    note = (
        f"No measured SM100 run under {shown_path(resolve_data_path('.'))}/{passed}: {what}.{missing} {SM100_SWEEP_HOW}"
    )
    return Sm100Frame(rows, False, f"{', '.join(gpus)} (modeled)", note, None, ignored)


@dataclass(frozen=True)
class Sm100Point:
    """The rows and the (batch, context) an SM100 section's per-strategy chart draws."""

    frame: pd.DataFrame
    batch: int
    context: str


def sm100_point(sm100: Sm100Frame, results: pd.DataFrame | None, batch: int, context: str) -> Sm100Point:
    """Where an SM100 section looks: a measured SM100 run at its point nearest (batch, context)
    (`versus.pick_point`); modeled rows beside the measured `results` at their chosen point, or alone at
    (batch, context) when there are no measured results (the CPU stand-in)."""
    if sm100.measured:
        shown_batch, shown_context, _ = pick_point(sm100.frame, batch, context)
        return Sm100Point(sm100.frame, shown_batch, shown_context)
    if results is None:
        return Sm100Point(sm100.frame, batch, ContextSpec.parse(context).label)
    shown_batch, shown_context, _ = pick_point(results, batch, context)
    return Sm100Point(pd.concat([results, sm100.frame], ignore_index=True), shown_batch, shown_context)


def sm100_backend(sm100: Sm100Frame) -> str:
    """The backend of an SM100 decision table: what vLLM runs there when it was timed, else the first timed."""
    timed = list(sm100.frame.loc[sm100.frame["status"] == "ok", "backend"].unique())
    preferred = vllm_backend().name
    return preferred if preferred in timed else timed[0]
