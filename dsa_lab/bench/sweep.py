"""The timing mode of the harness: each point checked, then timed, and appended to a run folder.

`run_sweep` walks a spec's points (`bench.walk`) and hands each ready one to `bench.evaluate` (checked against the
reference, then timed). A point the backend cannot run here, or that would not fit in memory, is `skipped` with the
reason; a wrong result is `failed` and not timed; an exception, a workload that could not be built (for its own
points only) or a point past its deadline is an `error`; the sweep goes on. Three parts keep the loop short: the
run's budget (`bench.budget`: when the run stops before its next point, each point's deadline), the hang guard
(`bench.guard`: a deadline that holds even against a hung kernel, and what a point stuck inside C leaves behind) and
the recorder (`bench.recorder`: rows appended one by one, results refreshed, how the sweep ended). The provenance
records each backend's numerics for the run's device (`numerics`, from `bench.numerics`).

The run folder cannot be corrupted by the sweep: it is locked for the whole sweep (a
second writer is refused); a resume is refused when the folder's rows disagree with its
log or when the device or environment differ from its provenance (`opening.check_resume`);
`retry_errors` re-runs points whose last row is an error; an interrupt (Ctrl-C, SIGTERM)
records `stop_reason: "interrupted"`; a `SystemExit` (a backend calling sys.exit) or any other
exception out of the loop records `exited` or `crashed` with its name (and the point in flight as
an error) before it propagates, so no run reads as complete when it is not; and a deadline per
point (`point_timeout_s`, and whatever `max_minutes` leaves) holds even against a hung kernel
(`bench.guard`). Before the first point the run id and the grid are held to what `load_run` reads
back (`bench.run_folder.check_storable`). After each point the inputs its backend was handed are
verified unchanged (`Visit.handed`): a point that wrote into them at any call, timed ones included,
is failed with its timing dropped, and the walk rebuilds the workload for the next point.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsa_lab.batch.workload import ContextSpec
from dsa_lab.bench.budget import RunBudget
from dsa_lab.bench.ceilings import measure_ceilings
from dsa_lab.bench.evaluate import evaluate_point, inputs_changed
from dsa_lab.bench.guard import HUNG_EXIT_CODE, PointTimeout, deadline, hang_guard
from dsa_lab.bench.point import Point, SweepPoint, SweepSpec, expand
from dsa_lab.bench.presets import PRESETS, preset
from dsa_lab.bench.recorder import Recorder
from dsa_lab.bench.run_folder import check_storable, open_run, resume_command
from dsa_lab.bench.walk import release, skip_reason, walk
from dsa_lab.env_info import device_name
from dsa_lab.errors import as_device
from dsa_lab.model.roofline import gpu_for_device
from dsa_lab.store import folders as store
from dsa_lab.store import opening

__all__ = [
    "HUNG_EXIT_CODE",
    "PRESETS",
    "ContextSpec",
    "Point",
    "SweepPoint",
    "SweepSpec",
    "SweepSummary",
    "expand",
    "preset",
    "resume_command",
    "run_sweep",
    "skip_reason",
]

DEFAULT_POINT_TIMEOUT_S = 300.0  # a point (JIT compile, check, timing) still running after this is an error
STOP_REASONS = (
    "complete",  # every point recorded
    "max_points",  # the limits the user set: the run resumes
    "max_minutes",
    "device_lost",  # a sticky device error: every later point would fail too
    "interrupted",  # Ctrl-C or SIGTERM
    "point_hung",  # a point past its deadline inside C: the process ended
    "exited",  # SystemExit raised under the sweep (a backend calling sys.exit): recorded, then it propagates
    "crashed",  # any other exception out of the loop: recorded with its name, then it propagates
)
SHORT_STOPS = ("device_lost", "interrupted", "point_hung", "exited", "crashed")  # not what the user asked for


@dataclass(frozen=True)
class SweepSummary:
    run_dir: Path
    total: int
    recorded_before: int
    recorded_now: int
    counts: dict[str, int]
    stop_reason: str  # one of STOP_REASONS

    @property
    def remaining(self) -> int:
        return self.total - self.recorded_before - self.recorded_now


def run_sweep(
    spec: SweepSpec,
    run_dir: str | Path,
    device: str | torch.device = "cpu",
    *,
    resume: bool = False,
    retry_errors: bool = False,
    max_points: int | None = None,
    max_minutes: float | None = None,
    point_timeout_s: float | None = DEFAULT_POINT_TIMEOUT_S,
    ceilings: bool = False,
    progress: bool = True,
    extra_provenance: dict[str, Any] | None = None,
) -> SweepSummary:
    """Run (or resume) every point of `spec` not yet recorded in `run_dir`; rows go to points.jsonl as they finish.

    Returns the summary; `stop_reason` says why it ended ('interrupted' after Ctrl-C or
    SIGTERM: the rows so far are kept and the run resumes with `resume_command`).
    """
    if not isinstance(spec, SweepSpec):
        raise ValueError(f"spec: expected a SweepSpec (see bench.presets.preset), got {type(spec).__name__}")
    budget = RunBudget(max_points, max_minutes, point_timeout_s)
    device, run_dir = as_device("device", device), Path(run_dir)
    check_storable(spec, run_dir)  # a run load_run would refuse is refused before its first point
    if resume:
        opening.require_run(run_dir)
    else:
        opening.check_new_folder(run_dir)  # before taking the lock, which creates the folder
    created = not run_dir.exists()
    try:
        with opening.run_lock(run_dir):
            provenance = open_run(spec, run_dir, device, resume, dict(extra_provenance or {}))
            if ceilings and device.type == "cuda" and "ceilings" not in provenance:
                provenance["ceilings"] = measure_ceilings(device)
                store.update_provenance(run_dir, ceilings=provenance["ceilings"])
            return _sweep(spec, run_dir, device, provenance, retry_errors, budget, progress)
    except BaseException:
        if created and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()  # a folder this call made and never wrote to
        raise


def _sweep(
    spec: SweepSpec,
    run_dir: Path,
    device: torch.device,
    provenance: dict[str, Any],
    retry_errors: bool,
    budget: RunBudget,
    progress: bool,
) -> SweepSummary:
    """The points `run_dir` lacks (or whose last row is an error, with `retry_errors`), each checked and timed under
    `budget` and its deadline, and recorded; how the sweep ended is recorded whatever ends it."""
    gpu = gpu_for_device(device_name(device), provenance.get("ceilings")) if device.type == "cuda" else None
    points = spec.points()
    logged = store.latest_rows(run_dir)
    todo = [p for p in points if p.key not in logged or (retry_errors and logged[p.key].get("status") == "error")]
    recorder = Recorder(run_dir, device, spec.seed, len(points), len(points) - len(todo), progress)
    stop, stopped_by = "complete", ""
    visits = walk(todo, spec, device)
    try:
        for visit in visits:
            if reason := budget.stop(recorder.recorded):
                stop = reason
                break
            row, limit, point_started = recorder.row(visit.point), budget.deadline(), time.perf_counter()
            try:
                if visit.skip is not None:
                    row.update(status="skipped", message=visit.skip)
                elif visit.error is not None:
                    row.update(status="error", message=visit.error)
                else:
                    row["estimated_bytes"] = visit.estimated_bytes
                    on_hang = hang_guard(recorder, visit.point, limit, resume_command(run_dir, retry_errors))
                    with deadline(limit.seconds, on_hang):
                        row.update(evaluate_point(visit, spec, device, gpu))
            except PointTimeout:
                if limit.run_binds:
                    stop = "max_minutes"  # cut by the run's budget: not recorded, re-runs on resume
                    break
                row.update(status="error", message=f"timed out after {limit.seconds:g} s (--point-timeout)")
                release(device)
            except Exception as err:  # the sweep goes on; out-of-memory included
                row.update(status="error", message=f"{type(err).__name__}: {err}")
                release(device)
            except KeyboardInterrupt:
                raise  # not recorded: the point re-runs on resume
            except (
                BaseException
            ) as err:  # SystemExit from a backend, or worse: the point is named, then the sweep stops
                row.update(status="error", message=f"{_named(err)} raised while this point ran; the sweep stopped here")
                recorder.append({**row, "elapsed_s": time.perf_counter() - point_started})
                raise
            if visit.handed is not None:
                changed, visit.handed = visit.handed.changed(), None  # its packed tensors go with the point
                if changed:
                    row = inputs_changed(row, visit, gpu, changed)  # the walk rebuilds the workload for the next
            if visit.estimated_bytes is not None:
                row.setdefault("estimated_bytes", visit.estimated_bytes)
            row["elapsed_s"] = time.perf_counter() - point_started
            recorder.record(row)
            if row["status"] == "error" and not _device_alive(device):
                stop = "device_lost"
                break
    except KeyboardInterrupt:
        stop = "interrupted"
    except SystemExit as err:
        stop, stopped_by = "exited", _named(err)
        raise
    except BaseException as err:  # recorded as what it was before it propagates: no run reads as complete
        stop, stopped_by = "crashed", _named(err)
        raise
    finally:
        recorder.close()
        with contextlib.suppress(KeyboardInterrupt):
            visits.close()
        recorder.finish(stop, stopped_by)
    counts = dict(recorder.counts)
    return SweepSummary(run_dir, len(points), len(points) - len(todo), recorder.recorded, counts, stop)


def _named(err: BaseException) -> str:
    """What a provenance and a row call an exception that ended a sweep: 'SystemExit(0)', 'TypeError: ...'."""
    return f"SystemExit({err.code!r})" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"


def _device_alive(device: torch.device) -> bool:
    """False after a sticky CUDA error (illegal address...), when every later point would fail too."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        torch.zeros(1, device=device).add_(1).item()
    except RuntimeError:
        return False
    return True
