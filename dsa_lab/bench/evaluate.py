"""One point of the timing mode: checked against the reference, then timed, into a row's result columns.

`evaluate_point` checks a ready point (`bench.check`: outputs poisoned with NaN; sampled requests for large shapes;
a fused backend by its picks), then times its `timed` unit (`bench.timed_unit`: the logits launches, or the launches
and the top-k after them, whose picks are first held to `topk_per_row` on poisoned outputs: `topk_*` columns) by its
`timer` (`bench.timing`: CUDA events, or one CUDA-graph replay of the whole step; `bench.replay` for ragged
verification). A wrong result is `failed` and not timed. A checked row records the bound it was checked against and
why (`check_tolerance`, `tolerance_reason`) and its cache's K scale format (`k_scales`); its roofline columns count
the bytes the backend's launches move (`moved_bytes`: the logits it writes, past each context too where it cleans
the tail). A point whose backend wrote into its inputs is failed whatever it measured (`inputs_changed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dsa_lab.bench.check import changed_message, check_point
from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.replay import replay_point
from dsa_lab.bench.timed_unit import check_step_topk, timed_step
from dsa_lab.bench.timing import Measurement, TimingConfig, time_callable, time_step
from dsa_lab.bench.walk import Prepared, Visit, prepare
from dsa_lab.errors import NonFiniteLogits
from dsa_lab.kernels import LogitsBackend, LogitsCall
from dsa_lab.model.roofline import GpuSpec, roofline_columns
from dsa_lab.topk import DEFAULT_TOPK

MEASURED = (set(Measurement.__dataclass_fields__) - {"device"}) | {"schedule_ms"}  # a timing's columns


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


def inputs_changed(row: dict[str, Any], visit: Visit, gpu: GpuSpec | None, changed: tuple[str, ...]) -> dict[str, Any]:
    """A point whose backend wrote into its inputs (`Visit.handed`): failed whatever it measured, its timing
    dropped (it was measured on inputs it changed), the inputs it changed named."""
    kept = {key: value for key, value in row.items() if key not in MEASURED}
    before = f"; its own result: {row['status']} {row['message']}".rstrip() if row.get("message") else ""
    untimed = roofline_columns(visit.plan.cost, None, gpu, visit.backend.cleans_tail) if visit.plan else {}
    times = dict.fromkeys(("median_ms", "p25_ms", "p75_ms", "iqr_ms"))
    return {**kept, **untimed, **times, "status": "failed", "message": changed_message(changed) + before}
