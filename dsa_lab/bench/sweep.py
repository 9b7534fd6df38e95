"""The timing mode of the harness: each point checked, then timed, and appended to a run folder.

`run_sweep` walks a spec's points (`bench.walk`), checks each against the reference
(`bench.check`: outputs poisoned with NaN; sampled requests for large shapes) and times
it (`bench.timing`). A point the backend cannot run here, or that would not fit in memory,
is `skipped` with the reason; a wrong result is `failed` and not timed; an exception, a
workload that could not be built (for its own points only) or a point past its deadline
is an `error`; the sweep goes on. Rows are appended one by one (`store.append_point`).
A checked row records the bound it was checked against and why (`check_tolerance`,
`tolerance_reason`) and its cache's K scale format (`k_scales`); the provenance records
both per backend for the run's device (`numerics`, from `bench.numerics`).

A point times its `timed` unit (`bench.timed_unit`: the logits launches, or the launches and the
top-k after them, whose picks are first held to `topk_per_row` on poisoned outputs: `topk_*`
columns) by its `timer` (`bench.timing`: CUDA events, or one CUDA-graph replay of the whole step).
Every row says what vLLM 0.33 runs for its step (`vllm_route`, `vllm_decodes`, `vllm_prefills`,
on `vllm_platform`: `Point.vllm_route`), and its roofline columns count the bytes the backend's
launches move (`moved_bytes`: the logits it writes, past each context too where it cleans the tail).

The run folder cannot be corrupted by the sweep: it is locked for the whole sweep (a
second writer is refused); a resume is refused when the folder's rows disagree with its
log or when the device or environment differ from its provenance (`store.check_resume`);
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
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsa_lab.bench import guard
from dsa_lab.bench.check import changed_message, check_point
from dsa_lab.bench.guard import PointTimeout, deadline
from dsa_lab.bench.point import Point, SweepPoint, SweepSpec, expand
from dsa_lab.bench.presets import PRESETS, preset
from dsa_lab.bench.replay import replay_point
from dsa_lab.bench.run_folder import check_storable, open_run, resume_command
from dsa_lab.bench.timed_unit import check_step_topk, timed_step
from dsa_lab.bench.timing import Measurement, TimingConfig, measure_ceilings, time_callable, time_step
from dsa_lab.bench.walk import Prepared, Visit, prepare, release, skip_reason, walk
from dsa_lab.env_info import device_name
from dsa_lab.errors import NonFiniteLogits, as_device, check_positive, check_range
from dsa_lab.kernels import LogitsBackend, LogitsCall
from dsa_lab.model.roofline import GpuSpec, gpu_for_device, roofline_columns
from dsa_lab.policy.vllm import CAPABILITY_FAMILIES, Platform
from dsa_lab.store import folders as store
from dsa_lab.topk import DEFAULT_TOPK
from dsa_lab.workload import ContextSpec

__all__ = [
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

RESULTS_EVERY_S = 30.0  # results.parquet is refreshed this often during a sweep
STUDY_PLATFORM = Platform("sm90", True)  # vLLM with DeepGEMM on Hopper: whose route a run off CUDA records
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
MEASURED = (set(Measurement.__dataclass_fields__) - {"device"}) | {"schedule_ms"}  # a timing's columns
HUNG_EXIT_CODE = 3


# ---------------------------------------------------------------- one point


def evaluate_point(visit: Visit, spec: SweepSpec, device: torch.device, gpu: GpuSpec | None) -> dict[str, Any]:
    """Check then time one ready point; returns the result columns (status ok or failed)."""
    plan, backend, inputs, point = visit.plan, visit.backend, visit.inputs, visit.point
    prepared = prepare(visit, device)
    row: dict[str, Any] = {**plan.columns(), "metadata_host_ms": prepared.metadata_ms}
    cleans = backend.cleans_tail
    tolerance = spec.check_tolerance
    if not backend.fuses_topk:  # a fused backend writes no logits: its check is the top-k check below
        check = check_point(
            inputs,
            prepared.metadata,
            backend,
            prepared.calls,
            spec.check_tolerance,
            spec.full_check_limit,
            spec.check_requests,
        )
        row.update(
            rel_err=check.rel_err,
            checked_requests=check.checked_requests,
            checked_tokens=check.checked_tokens,
            poisoned=check.poisoned,
            check_tolerance=check.tolerance,
            tolerance_reason=check.tolerance_reason,
        )
        if not check.ok:
            failed = {"status": "failed", "message": check.message, "k_scales": visit.k_scales}
            return {**row, **failed, **roofline_columns(plan.cost, None, gpu, cleans)}
        tolerance = check.tolerance
    row["k_scales"] = visit.k_scales
    max_len, longest = prepared.metadata.max_context_len, inputs.batch.max_seq_len
    if point.timed == "logits+topk":
        message = _check_topk(row, backend, prepared, longest, point.topk_impl, spec.check_tolerance)
        if message:
            return {**row, "status": "failed", "message": message, **roofline_columns(plan.cost, None, gpu, cleans)}
    if changed := visit.handed.changed():  # written into during the checks (a change undone by the timing's end)
        return {
            **row,
            "status": "failed",
            "message": changed_message(changed),
            **roofline_columns(plan.cost, None, gpu, cleans),
        }
    if point.timer == "replay":  # one graph over many ragged steps, each checked: its own columns and verdict
        replayed = replay_point(point, backend, inputs, max_len, tolerance, spec.check_requests, spec.seed, spec.timing)
        return {**row, **replayed, **roofline_columns(plan.cost, None, gpu, cleans)}
    step = timed_step(point.timed, backend, prepared.calls, longest, topk_impl=point.topk_impl)
    if point.timer == "events":  # honours the timing config's own graph mode (`bench --graph`), as before the axis
        measurement = time_callable(step, device, spec.timing)
    else:
        measurement = time_step(step, device, point.timer, spec.timing)
    row.update(measurement.as_row())
    row["schedule_ms"] = _schedule_ms(backend, prepared.calls, device)
    timed = roofline_columns(plan.cost, measurement.median_ms, gpu, cleans)
    return {**row, "status": "ok", "message": "", **timed}


def _check_topk(
    row: dict[str, Any],
    backend: LogitsBackend,
    prepared: Prepared,
    longest: int,
    topk_impl: str,
    tolerance: float,
) -> str:
    """The top-k check of a 'logits+topk' point (`timed_unit.check_step_topk`) into `row`; '' when it passes."""
    metadata = prepared.metadata
    try:
        found = check_step_topk(
            backend,
            prepared.calls,
            metadata,
            longest,
            topk_impl,
            tolerance=tolerance,
        )
    except (NonFiniteLogits, ValueError) as err:  # a NaN left inside a row's context; logits the top-k wrote into
        return f"top-k check: {err}"
    agreement = found.agreement
    row.update(
        topk=DEFAULT_TOPK,
        topk_kernel=found.kernels,
        topk_rows=agreement.rows,
        topk_rows_equal=agreement.rows_equal,
        topk_max_score_gap=agreement.max_score_gap,
        topk_poisoned=found.poisoned,
    )
    if agreement.equal:
        return ""
    return (
        f"top-k check: {agreement.rows - agreement.rows_equal} of {agreement.rows} rows pick other scores than "
        f"topk_per_row (largest gap {agreement.max_score_gap:.3g})"
    )


def _schedule_ms(backend: LogitsBackend, calls: Sequence[LogitsCall], device: torch.device) -> float | None:
    """Median time of the backend's schedule hook for every launch (None when it has none)."""
    if type(backend).schedule is LogitsBackend.schedule:
        return None
    config = TimingConfig(warmup=2, min_samples=5, max_samples=50, max_seconds=0.05, cold_l2=False)
    hook = backend.schedule
    result: Measurement = time_callable(
        lambda: [hook(c.context_lens, c.kv_cache.shape[1], c.block_table) for c in calls], device, config
    )
    return result.median_ms


def route_platform(device: torch.device) -> Platform:
    """The platform whose vLLM 0.33 route every row records: vLLM with DeepGEMM (how it serves DeepSeek) on this
    GPU's family; off CUDA the study's GPU, SM90 (`STUDY_PLATFORM`; each row names it in `vllm_platform`)."""
    if device.type != "cuda":
        return STUDY_PLATFORM
    return Platform(CAPABILITY_FAMILIES.get(torch.cuda.get_device_capability(device)[0], "other"), True)


def route_columns(point: Point, seed: int, platform: Platform) -> dict[str, Any]:
    """What vLLM 0.33 runs for the point's step on `platform` (`Point.vllm_route`): its path ('native',
    'padded', 'flatten', 'varlen', or 'rejected' where vLLM refuses the configuration at startup), how many
    requests stay decodes and how many go to the prefill path."""
    try:
        route = point.vllm_route(seed, platform)
    except ValueError:  # rejected at startup (e.g. an MXFP4 cache vLLM 0.33 does not read here)
        return {"vllm_route": "rejected", "vllm_decodes": 0, "vllm_prefills": 0, "vllm_platform": platform.label}
    return {
        "vllm_route": route.path,
        "vllm_decodes": route.decodes,
        "vllm_prefills": route.prefills,
        "vllm_platform": platform.label,
    }


def _base_row(point: Point, device: torch.device, seed: int, platform: Platform) -> dict[str, Any]:
    return {
        "point_key": point.key,
        **point.axes(),
        "source": "measured",
        "device": device.type,
        "device_name": device_name(device),
        **route_columns(point, seed, platform),
        "median_ms": None,
        "p25_ms": None,
        "p75_ms": None,
        "iqr_ms": None,
        "message": "",
    }


# ---------------------------------------------------------------- the sweep


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
    if max_points is not None:
        check_range("max_points", max_points, 1, 1 << 31)
    if max_minutes is not None:
        check_positive("max_minutes", max_minutes, allow_zero=True)  # 0: record nothing, just open the run
    if point_timeout_s is not None:
        check_positive("point_timeout_s", point_timeout_s)
    device, run_dir = as_device("device", device), Path(run_dir)
    check_storable(spec, run_dir)  # a run load_run would refuse is refused before its first point
    if resume:
        store.require_run(run_dir)
    else:
        store.check_new_folder(run_dir)  # before taking the lock, which creates the folder
    created = not run_dir.exists()
    try:
        with store.run_lock(run_dir):
            provenance = open_run(spec, run_dir, device, resume, dict(extra_provenance or {}))
            return _sweep(
                spec,
                run_dir,
                device,
                provenance,
                retry_errors,
                max_points,
                max_minutes,
                point_timeout_s,
                ceilings,
                progress,
            )
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
    max_points: int | None,
    max_minutes: float | None,
    point_timeout_s: float | None,
    ceilings: bool,
    progress: bool,
) -> SweepSummary:
    from tqdm.auto import tqdm

    if ceilings and device.type == "cuda" and "ceilings" not in provenance:
        provenance["ceilings"] = measure_ceilings(device)
        store.update_provenance(run_dir, ceilings=provenance["ceilings"])
    gpu = gpu_for_device(device_name(device), provenance.get("ceilings")) if device.type == "cuda" else None
    platform = route_platform(device)
    points = spec.points()
    logged = store.latest_rows(run_dir)
    redo = {key for key, row in logged.items() if retry_errors and row.get("status") == "error"}
    todo = [p for p in points if p.key not in logged or p.key in redo]
    started = last_write = time.perf_counter()
    counts: Counter[str] = Counter()
    stop, stopped_by = "complete", ""
    bar = tqdm(
        total=len(points),
        initial=len(points) - len(todo),
        disable=not progress,
        desc="bench",
        unit="pt",
        mininterval=0.1 if _watched() else 15.0,  # a log file gets a line every 15 s, not every point
    )

    def finish(reason: str, error: str = "") -> None:
        store.write_results(run_dir)
        progress = {
            "points_total": len(points),
            "points_recorded": len(store.done_keys(run_dir)),
            "stop_reason": reason,
        }
        store.update_provenance(run_dir, progress={**progress, **({"stop_error": error} if error else {})})

    visits = walk(todo, spec, device)
    try:
        for visit in visits:
            if max_points is not None and sum(counts.values()) >= max_points:
                stop = "max_points"
                break
            left_s = None if max_minutes is None else max_minutes * 60 - (time.perf_counter() - started)
            if left_s is not None and left_s <= 0:
                stop = "max_minutes"
                break
            row = _base_row(visit.point, device, spec.seed, platform)
            bounds = [x for x in (point_timeout_s, left_s) if x is not None]
            limit = min(bounds) if bounds else None
            budget_binds = left_s is not None and (point_timeout_s is None or left_s < point_timeout_s)

            def on_hang(point: Point = visit.point, budget: bool = budget_binds, limit: float | None = limit) -> None:
                if not budget:  # the point's own deadline: it is an error; the budget's: it re-runs on resume
                    message = (
                        f"hung: still running {limit:g} s + {guard.HANG_GRACE_S:g} s after it started (point timeout)"
                    )
                    base = _base_row(point, device, spec.seed, platform)
                    store.append_point(run_dir, {**base, "status": "error", "message": message})
                finish("point_hung")
                print(
                    f"dsa-lab bench: point {point.key} hung past its deadline (a kernel that never returns?); "
                    f"the device may be unusable. Resume with: {resume_command(run_dir, retry_errors)}",
                    file=sys.stderr,
                    flush=True,
                )
                with contextlib.suppress(OSError):
                    (run_dir / store.LOCK_FILE).unlink()  # its flock ends with the process
                os._exit(HUNG_EXIT_CODE)

            point_started = time.perf_counter()
            try:
                if visit.skip is not None:
                    row.update(status="skipped", message=visit.skip)
                elif visit.error is not None:
                    row.update(status="error", message=visit.error)
                else:
                    row["estimated_bytes"] = visit.estimated_bytes
                    with deadline(limit, on_hang):
                        row.update(evaluate_point(visit, spec, device, gpu))
            except PointTimeout:
                if budget_binds:
                    stop = "max_minutes"  # cut by the run's budget: not recorded, re-runs on resume
                    break
                row.update(status="error", message=f"timed out after {limit:g} s (--point-timeout)")
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
                store.append_point(run_dir, {**row, "elapsed_s": time.perf_counter() - point_started})
                raise
            if visit.handed is not None:
                changed, visit.handed = visit.handed.changed(), None  # its packed tensors go with the point
                if changed:
                    row = _inputs_changed(row, visit, gpu, changed)  # the walk rebuilds the workload for the next
            if visit.estimated_bytes is not None:
                row.setdefault("estimated_bytes", visit.estimated_bytes)
            row["elapsed_s"] = time.perf_counter() - point_started
            store.append_point(run_dir, row)
            counts[row["status"]] += 1
            bar.update(1)
            bar.set_postfix(counts)
            if row["status"] == "error" and not _device_alive(device):
                stop = "device_lost"
                break
            if time.perf_counter() - last_write > RESULTS_EVERY_S:
                store.write_results(run_dir)
                last_write = time.perf_counter()
    except KeyboardInterrupt:
        stop = "interrupted"
    except SystemExit as err:
        stop, stopped_by = "exited", _named(err)
        raise
    except BaseException as err:  # recorded as what it was before it propagates: no run reads as complete
        stop, stopped_by = "crashed", _named(err)
        raise
    finally:
        bar.close()
        with contextlib.suppress(KeyboardInterrupt):
            visits.close()
        finish(stop, stopped_by)
    return SweepSummary(run_dir, len(points), len(points) - len(todo), sum(counts.values()), dict(counts), stop)


def _named(err: BaseException) -> str:
    """What a provenance and a row call an exception that ended a sweep: 'SystemExit(0)', 'TypeError: ...'."""
    return f"SystemExit({err.code!r})" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"


def _inputs_changed(row: dict[str, Any], visit: Visit, gpu: GpuSpec | None, changed: tuple[str, ...]) -> dict[str, Any]:
    """A point whose backend wrote into its inputs (`Visit.handed`): failed whatever it measured, its timing
    dropped (it was measured on inputs it changed), the inputs it changed named."""
    kept = {key: value for key, value in row.items() if key not in MEASURED}
    before = f"; its own result: {row['status']} {row['message']}".rstrip() if row.get("message") else ""
    untimed = roofline_columns(visit.plan.cost, None, gpu, visit.backend.cleans_tail) if visit.plan else {}
    times = dict.fromkeys(("median_ms", "p25_ms", "p75_ms", "iqr_ms"))
    return {**kept, **untimed, **times, "status": "failed", "message": changed_message(changed) + before}


def _watched() -> bool:
    """Someone watches the bar: a terminal, or a notebook kernel (where tqdm.auto draws a widget)."""
    return sys.stderr.isatty() or "ipykernel" in sys.modules


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
