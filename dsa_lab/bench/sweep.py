"""Sweeps: declared axes -> points -> checked, timed rows appended to a run folder.

A `SweepSpec` (bench.axes) declares the axes; `expand` orders its points so that each
workload (batch, context, cache dtype, heads, head_dim) is built once on the device and
reused for every next_n, backend and strategy. Each point is first checked against the
reference (bench.check: outputs poisoned with NaN; sampled requests for large shapes), then
timed; a point a backend cannot run, or that would not fit in memory, is recorded as
`skipped` with the reason; a wrong result is `failed` and not timed; an exception is
`error`, and the sweep goes on. Rows are appended one by one (store.append_point), so
a sweep cut off anywhere resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsa_lab import store
from dsa_lab.bench.axes import AXES, PRESETS, ContextSpec, SweepPoint, SweepSpec, expand, preset
from dsa_lab.bench.check import check_point, checked_requests, run_launches
from dsa_lab.bench.timing import Measurement, TimingConfig, flush_bytes, measure_ceilings, time_callable, timing_method
from dsa_lab.cache import bytes_per_token, random_paged_cache
from dsa_lab.decode import check_launches, native_sizes_for, pack_launch
from dsa_lab.env_info import device_name
from dsa_lab.errors import BackendUnavailable, UnsupportedShape, as_device, check_positive, check_range
from dsa_lab.kernels import LogitsBackend, get_backend
from dsa_lab.metadata import AtomPiece, build_metadata, plan_atoms
from dsa_lab.roofline import GpuSpec, StepShape, floor_ms, get_gpu, gpu_for_device, roofline_columns, step_cost
from dsa_lab.workload import DecodeBatch, DecodeInputs

__all__ = ["AXES", "PRESETS", "ContextSpec", "SweepPoint", "SweepSpec", "expand", "preset", "run_sweep", "skip_reason"]

BLOCK_SIZE = 64
OUTPUT_ALIGN = 256  # DeepGEMM pads logits rows to this; memory estimates assume it for everyone
RESULTS_EVERY_S = 30.0  # results.parquet is refreshed this often during a sweep
MEMORY_HEADROOM = 0.9


# ---------------------------------------------------------------- workloads


class Workload:
    """One (batch, context, dtype, heads, head_dim) on the device: K cache and q/weights for the largest next_n."""

    def __init__(self, point: SweepPoint, max_next_n: int, seed: int, device: torch.device) -> None:
        self.point = point
        self.seq_lens = ContextSpec.parse(point.context).seq_lens(point.batch, seed)
        self.cache = random_paged_cache(self.seq_lens, point.head_dim, BLOCK_SIZE, point.cache_dtype, seed, device)
        gen = torch.Generator(device=device).manual_seed(seed + 1)
        shape = (point.batch, max_next_n, point.heads)
        self.q = torch.randn(*shape, point.head_dim, generator=gen, device=device).to(torch.float8_e4m3fn)
        self.weights = torch.randn(*shape, generator=gen, device=device) * point.heads**-0.5

    def inputs(self, next_n: int) -> DecodeInputs:
        p = self.point
        batch = DecodeBatch(self.seq_lens, (next_n,) * p.batch, next_n, p.heads, p.head_dim, BLOCK_SIZE, p.cache_dtype)
        q = self.q[:, :next_n].reshape(p.batch * next_n, p.heads, p.head_dim).contiguous()
        weights = self.weights[:, :next_n].reshape(p.batch * next_n, p.heads).contiguous()
        return DecodeInputs(batch, q, weights, self.cache)


def workload_bytes(seq_lens: Sequence[int], point: SweepPoint, max_next_n: int) -> int:
    """Device bytes a workload holds (KV pool, q, weights) plus its generation temporaries."""
    blocks = sum(max(1, -(-length // BLOCK_SIZE)) for length in seq_lens) + 1
    kv = blocks * BLOCK_SIZE * bytes_per_token(point.head_dim, point.cache_dtype)
    generation = min(sum(seq_lens), 1 << 20) * point.head_dim * 4 * 4
    q = len(seq_lens) * max_next_n * point.heads * (point.head_dim + 4) * 2
    return kv + generation + q


def point_bytes(point: SweepPoint, seq_lens: Sequence[int], kernel_rows: int, checked_rows: int, device: torch.device) -> int:
    """Device bytes one point adds: kernel outputs, packed inputs, check buffers and the L2 flush buffer."""
    width = -(-max(seq_lens) // OUTPUT_ALIGN) * OUTPUT_ALIGN
    outputs = kernel_rows * width * 4
    packed = kernel_rows * (point.heads * (point.head_dim + 4) + 4 * (-(-max(seq_lens) // BLOCK_SIZE)))
    check = 4 * checked_rows * width * 4 + 8 * point.heads * 8192 * 4 * 4
    return outputs + packed + check + flush_bytes(device)


def free_device_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


# ---------------------------------------------------------------- one point


def launch_sizes(point: SweepPoint, backend: LogitsBackend, device: torch.device) -> tuple[AtomPiece, ...]:
    if point.strategy == "native":
        return (AtomPiece(point.next_n, 0),)
    if point.strategy == "flatten":
        return (AtomPiece(1, 0),)
    return plan_atoms(point.next_n, native_sizes_for(backend, device))


def skip_reason(point: SweepPoint, device: torch.device) -> str | None:
    """Why the backend cannot (or need not) run this point here; None if it can."""
    backend = get_backend(point.backend)
    state = backend.availability(device)
    if not state.ok:
        return f"backend {point.backend!r} unavailable on {device.type}: {state.reason}"
    pieces = launch_sizes(point, backend, device)
    if point.strategy == "atom" and pieces == (AtomPiece(point.next_n, 0),):
        return f"atom plan is one native piece of {point.next_n}: the same launch as native"
    for size in sorted({p.size for p in pieces}):
        try:
            backend.require(device, size, point.heads, point.head_dim, point.cache_dtype)
        except (UnsupportedShape, BackendUnavailable) as err:
            return str(err)
    return None


def describe_pieces(point: SweepPoint, pieces: Sequence[AtomPiece], tokens: int) -> str:
    if point.strategy == "flatten":
        return f"{tokens}x1"
    return "+".join(f"{p.size}" + (f"[pad {-p.offset}]" if p.offset < 0 else "") for p in pieces)


def evaluate_point(
    point: SweepPoint, workload: Workload, spec: SweepSpec, device: torch.device, gpu: GpuSpec | None
) -> dict[str, Any]:
    """Check then time one point; returns the result columns (status ok or failed)."""
    backend = get_backend(point.backend)
    inputs = workload.inputs(point.next_n)
    sizes = native_sizes_for(backend, device)
    started = time.perf_counter()
    metadata = build_metadata(point.strategy, inputs.batch, inputs.cache.block_table, sizes)
    packed = [pack_launch(launch, inputs) for launch in metadata.launches]
    _sync(device)
    metadata_ms = (time.perf_counter() - started) * 1e3
    check_launches(metadata, inputs)  # the value scan, once, outside every timed region
    for p in packed:
        backend.require(device, p.q.shape[1], point.heads, point.head_dim, point.cache_dtype)
    schedules = [backend.schedule(p.context_lens, BLOCK_SIZE) for p in packed]
    shape = StepShape(workload.seq_lens, point.next_n, point.strategy, point.heads, point.head_dim, point.cache_dtype, tuple(sizes))
    cost = step_cost(shape)
    row: dict[str, Any] = {
        "launches": len(metadata.launches),
        "kernel_rows": metadata.kernel_rows,
        "pieces": describe_pieces(point, launch_sizes(point, backend, device), inputs.batch.num_decode_tokens),
        "metadata_host_ms": metadata_ms,
    }
    check = check_point(inputs, metadata, backend, packed, schedules, spec.check_tolerance, spec.full_check_limit, spec.check_requests)
    row.update(
        rel_err=check.rel_err, checked_requests=check.checked_requests,
        checked_tokens=check.checked_tokens, poisoned=check.poisoned,
    )  # fmt: skip
    if not check.ok:
        return {**row, "status": "failed", "message": check.message, **roofline_columns(cost, None, gpu)}
    cache = inputs.cache

    def step() -> None:
        run_launches(backend, packed, cache, metadata.max_context_len, schedules)

    measurement = time_callable(step, device, spec.timing)
    row.update(measurement.as_row())
    row["schedule_ms"] = _schedule_ms(backend, packed, device)
    return {**row, "status": "ok", "message": "", **roofline_columns(cost, measurement.median_ms, gpu)}


def _schedule_ms(backend: LogitsBackend, packed, device: torch.device) -> float | None:
    """Median time of the backend's schedule hook for every launch (None when it has none)."""
    if type(backend).schedule is LogitsBackend.schedule:
        return None
    config = TimingConfig(warmup=2, min_samples=5, max_samples=50, max_seconds=0.05, cold_l2=False)
    result: Measurement = time_callable(lambda: [backend.schedule(p.context_lens, BLOCK_SIZE) for p in packed], device, config)
    return result.median_ms


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class SweepSummary:
    run_dir: Path
    total: int
    recorded_before: int
    recorded_now: int
    counts: dict[str, int]
    stop_reason: str  # 'complete', 'max_points', 'max_minutes' or 'device_lost'

    @property
    def remaining(self) -> int:
        return self.total - self.recorded_before - self.recorded_now


def open_run(spec: SweepSpec, run_dir: Path, device: torch.device, resume: bool, extra: dict[str, Any]) -> dict[str, Any]:
    """Create the run folder (refusing an existing one) or reopen it to resume the same spec."""
    if resume and (run_dir / store.PROVENANCE_FILE).exists():
        provenance = store.resume_run(run_dir, spec.to_dict())
        resumed = provenance.get("resumed", []) + [{"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": extra.get("command")}]
        store.update_provenance(run_dir, resumed=resumed)
        return store.read_provenance(run_dir / store.PROVENANCE_FILE)
    provenance = store.build_provenance(
        run_id=run_dir.name, device=str(device), device_name=device_name(device), source="measured",
        seed=spec.seed, timing_method=timing_method(device, spec.timing), spec=spec.to_dict(),
        extra={key: value for key, value in extra.items() if key != "command"},
    )  # fmt: skip
    store.create_run(run_dir, provenance)
    return provenance


def run_sweep(
    spec: SweepSpec,
    run_dir: str | Path,
    device: str | torch.device = "cpu",
    *,
    resume: bool = False,
    max_points: int | None = None,
    max_minutes: float | None = None,
    ceilings: bool = False,
    progress: bool = True,
    extra_provenance: dict[str, Any] | None = None,
) -> SweepSummary:
    """Run (or resume) every point of `spec` not yet recorded in `run_dir`; rows go to points.jsonl as they finish."""
    from tqdm.auto import tqdm

    if not isinstance(spec, SweepSpec):
        raise ValueError(f"spec: expected a SweepSpec (see bench.axes.preset), got {type(spec).__name__}")
    if max_points is not None:
        check_range("max_points", max_points, 1, 1 << 31)
    if max_minutes is not None:
        check_positive("max_minutes", max_minutes, allow_zero=True)  # 0: record nothing, just open the run
    device, run_dir = as_device("device", device), Path(run_dir)
    provenance = open_run(spec, run_dir, device, resume, dict(extra_provenance or {}))
    if ceilings and device.type == "cuda" and "ceilings" not in provenance:
        provenance["ceilings"] = measure_ceilings(device)
        store.update_provenance(run_dir, ceilings=provenance["ceilings"])
    gpu = gpu_for_device(device_name(device), provenance.get("ceilings")) if device.type == "cuda" else None
    points = expand(spec)
    done = store.done_keys(run_dir)
    todo = [p for p in points if p.key not in done]
    started, last_write = time.perf_counter(), time.perf_counter()
    counts: Counter[str] = Counter()
    stop, workload, workload_error = "complete", None, ""
    bar = tqdm(
        total=len(points), initial=len(points) - len(todo), disable=not progress, desc="bench", unit="pt",
        mininterval=0.1 if sys.stderr.isatty() else 15.0,  # a log file gets a line every 15 s, not every point
    )  # fmt: skip
    try:
        for point in todo:
            if max_points is not None and sum(counts.values()) >= max_points:
                stop = "max_points"
                break
            if max_minutes is not None and time.perf_counter() - started >= max_minutes * 60:
                stop = "max_minutes"
                break
            if workload is not None and workload.point.workload_key != point.workload_key:
                workload, workload_error = None, ""
                _cleanup(device)  # the old workload's memory goes back before the next is built
            row, workload, workload_error = _run_one(point, spec, device, gpu, workload, workload_error)
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
    finally:
        bar.close()
        workload = None
        _cleanup(device)
        store.write_results(run_dir)
        store.update_provenance(run_dir, progress={"points_total": len(points), "points_recorded": len(store.done_keys(run_dir)), "stop_reason": stop})
    return SweepSummary(run_dir, len(points), len(points) - len(todo), sum(counts.values()), dict(counts), stop)


def _base_row(point: SweepPoint, device: torch.device) -> dict[str, Any]:
    return {
        "point_key": point.key, **dataclasses.asdict(point), "source": "measured",
        "device": device.type, "device_name": device_name(device), "median_ms": None,
        "p25_ms": None, "p75_ms": None, "iqr_ms": None, "message": "",
    }  # fmt: skip


def _run_one(
    point: SweepPoint, spec: SweepSpec, device: torch.device, gpu: GpuSpec | None, workload: Workload | None, workload_error: str
) -> tuple[dict[str, Any], Workload | None, str]:
    """One point's row, building the workload first when needed; never raises."""
    row = _base_row(point, device)
    point_started = time.perf_counter()
    try:
        reason = skip_reason(point, device)
        if reason is not None:
            return {**row, "status": "skipped", "message": reason}, workload, workload_error
        if workload_error:
            return {**row, "status": "error", "message": f"workload not built: {workload_error}"}, workload, workload_error
        max_n = max(spec.next_n)
        seq_lens = ContextSpec.parse(point.context).seq_lens(point.batch, spec.seed)
        backend = get_backend(point.backend)
        cost = step_cost(StepShape(seq_lens, point.next_n, point.strategy, point.heads, point.head_dim, point.cache_dtype, tuple(native_sizes_for(backend, device))))
        probe = DecodeBatch(seq_lens, (point.next_n,) * point.batch, point.next_n, point.heads, point.head_dim, BLOCK_SIZE, point.cache_dtype)
        checked_rows = point.next_n * len(checked_requests(probe, spec.full_check_limit, spec.check_requests))
        need = point_bytes(point, seq_lens, cost.kernel_rows, checked_rows, device)
        if workload is None:
            need += workload_bytes(seq_lens, point, max_n)
        free = free_device_bytes(device)
        row["estimated_bytes"] = need
        if free is not None and need > MEMORY_HEADROOM * free:
            return {**row, "status": "skipped", "message": f"needs ~{need / 2**30:.2f} GiB, {free / 2**30:.2f} GiB free"}, workload, workload_error
        if workload is None:
            try:
                workload = Workload(point, max_n, spec.seed, device)
            except Exception as err:  # recorded for every point of this workload
                workload_error = f"{type(err).__name__}: {err}"
                _cleanup(device)
                return {**row, "status": "error", "message": f"workload not built: {workload_error}"}, None, workload_error
        row.update(evaluate_point(point, workload, spec, device, gpu))
    except Exception as err:  # the sweep goes on; out-of-memory included
        row.update(status="error", message=f"{type(err).__name__}: {err}")
        _cleanup(device)
    row["elapsed_s"] = time.perf_counter() - point_started
    return row, workload, workload_error


def _cleanup(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            pass


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


def estimate_seconds(spec: SweepSpec, gpu_name: str = "H200-measured", per_point_s: float = 0.08, compile_s: float = 5.0) -> float:
    """A rough wall-clock estimate: a compile per (backend, next_n), and per point a fixed overhead
    plus its samples at twice the roofline time of the strategy's bytes (+ the L2 flush)."""
    gpu = get_gpu(gpu_name)
    total = compile_s * len(spec.backend) * len(spec.next_n)
    for point in expand(spec):
        seq_lens = ContextSpec.parse(point.context).seq_lens(point.batch, spec.seed)
        shape = StepShape(seq_lens, point.next_n, point.strategy, point.heads, point.head_dim, point.cache_dtype)
        kernel_ms = 2 * floor_ms(step_cost(shape), gpu, strategy_bytes=True)[0] + 0.06
        samples = min(spec.timing.max_samples, max(spec.timing.min_samples, spec.timing.max_seconds * 1e3 / kernel_ms))
        total += per_point_s + (samples + spec.timing.warmup + 2) * kernel_ms / 1e3
    return total
