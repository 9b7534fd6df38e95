"""The grid loop, written once: point -> plan -> can it run here -> workload -> a step ready to measure.

Every mode of the harness (timing, torch.profiler, the Nsight Compute target) iterates
`walk(points, spec, device)` and measures what it yields. For each point the loop asks the
backend for its native next_n set (`decode.native_sizes_for`), makes the point's
`LaunchPlan` once, and decides whether it can run here (`skip_reason`); then it builds the
point's workload (once per workload: the next points of the same workload reuse it; its K
scales in the format the run's backends need on this device, `bench.numerics`), and
yields a `Visit`. A workload that fails to build is an error for its own points only; the
next workload is built afresh. `prepare` turns a visit into the packed launches, checked
once (the value scan) outside any measured region.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsa_lab.bench.check import checked_requests
from dsa_lab.bench.inputs import MEMORY_HEADROOM, Workload, free_device_bytes, point_bytes, workload_bytes
from dsa_lab.bench.numerics import cache_k_scales
from dsa_lab.bench.point import BLOCK_SIZE, Point, SweepSpec
from dsa_lab.bench.replay import replay_skip
from dsa_lab.bench.timing import TimingConfig, step_timing_method
from dsa_lab.decode import LaunchInputs, check_launches, native_sizes_for, pack_launch
from dsa_lab.errors import BackendUnavailable, UnsupportedShape
from dsa_lab.kernels import LogitsBackend, get_backend
from dsa_lab.metadata import DecodeMetadata
from dsa_lab.plan import LaunchPlan
from dsa_lab.topk import DEFAULT_TOPK, get_topk
from dsa_lab.workload import DecodeInputs


@dataclass
class Visit:
    """One point as the loop hands it to a mode: ready (`inputs` set), skipped or in error."""

    point: Point
    plan: LaunchPlan | None = None
    backend: LogitsBackend | None = None
    inputs: DecodeInputs | None = None
    skip: str | None = None  # why the point does not run here (status 'skipped')
    error: str | None = None  # why it could not be prepared (status 'error')
    estimated_bytes: int | None = None
    k_scales: str | None = None  # the K scale format of the workload's cache ('float32' or 'ue8m0'), once built

    @property
    def ready(self) -> bool:
        return self.inputs is not None


@dataclass(frozen=True)
class Prepared:
    """A point's launches, packed and value-checked: what every mode runs."""

    metadata: DecodeMetadata
    packed: tuple[LaunchInputs, ...]
    schedules: tuple[Any, ...]
    metadata_ms: float  # host time to build the metadata and pack the launches (device synced)


def point_backend(point: Point) -> LogitsBackend:
    """The point's backend running its config (`LogitsBackend.configured`); UnsupportedShape when the
    backend has no such knob (a config of a grid meant for another of its backends)."""
    return get_backend(point.backend).configured(point.config)


def skip_reason(point: Point, device: torch.device, plan: LaunchPlan | None = None, seed: int = 0) -> str | None:
    """Why the backend cannot (or need not) run this point here; None if it can."""
    try:
        backend = point_backend(point)
    except UnsupportedShape as err:
        return str(err)
    state = backend.availability(device)
    if not state.ok:
        return f"backend {point.backend!r} unavailable on {device.type}: {state.reason}"
    try:
        step_timing_method(device, point.timer, TimingConfig())
    except ValueError as err:  # a CUDA-graph replay off CUDA
        return str(err)
    if backend.fuses_topk and (point.timed == "logits" or point.timer == "replay"):
        return f"backend {point.backend!r} fuses the top-k: its unit is the step (timed logits+topk, not replayed)"
    if point.timer == "replay" and (why := replay_skip(point)) is not None:
        return why
    if point.timed != "logits":
        try:
            get_topk(point.topk_impl).require(device, DEFAULT_TOPK)
        except (ValueError, BackendUnavailable) as err:  # vLLM's top-k off CUDA, or a k it does not take
            return str(err)
    if plan is None:
        plan = point.plan(point.seq_lens(seed), native_sizes_for(backend, device), seed)
    if plan.same_as_native:
        return f"atom plan is one native piece of {point.next_n}: the same launch as native"
    for width in plan.widths:
        try:
            backend.require(device, width, point.heads, point.head_dim, point.cache_dtype)
        except (UnsupportedShape, BackendUnavailable) as err:
            return str(err)
    return None


def release(device: torch.device) -> None:
    """Give freed device memory back (between workloads, after an error)."""
    gc.collect()
    if device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            pass


def walk(points: Sequence[Point], spec: SweepSpec, device: torch.device, memory_check: bool = True) -> Iterator[Visit]:
    """Each point of `points` (in order) as a `Visit`; builds each workload once, frees it when the next begins."""
    max_n = max(spec.next_n)
    workload: Workload | None = None
    key: tuple | None = None
    workload_error = ""
    try:
        for point in points:
            if point.workload_key != key:
                workload, key, workload_error = None, point.workload_key, ""
                release(device)  # the old workload's memory goes back before the next is built
            visit = Visit(point)
            try:
                visit.backend = point_backend(point)
                seq_lens = point.seq_lens(spec.seed)
                visit.plan = point.plan(seq_lens, native_sizes_for(visit.backend, device), spec.seed)
                visit.skip = skip_reason(point, device, visit.plan, spec.seed)
                if visit.skip is None and workload_error:
                    visit.error = f"workload not built: {workload_error}"
                if visit.skip is None and visit.error is None:
                    probe = point.decode_batch(seq_lens, spec.seed)
                    checked = point.next_n * len(checked_requests(probe, spec.full_check_limit, spec.check_requests))
                    need = point_bytes(point, visit.plan, checked, device)
                    need += workload_bytes(seq_lens, point, max_n) if workload is None else 0
                    visit.estimated_bytes = need
                    free = free_device_bytes(device) if memory_check else None
                    if free is not None and need > MEMORY_HEADROOM * free:
                        visit.skip = f"needs ~{need / 2**30:.2f} GiB, {free / 2**30:.2f} GiB free"
            except UnsupportedShape as err:  # a config of the grid this backend has no knob for
                visit.skip = str(err)
            except (ValueError, RuntimeError) as err:  # a bad plan or availability probe: this point only
                visit.error = f"{type(err).__name__}: {err}"
            if visit.skip is None and visit.error is None and workload is None:
                try:
                    k_scales = cache_k_scales(point.cache_dtype, spec.backend, device)
                    workload = Workload(point, seq_lens, max_n, spec.seed, device, k_scales)
                except Exception as err:  # out of memory, a failing generator: this workload's points only
                    workload_error = f"{type(err).__name__}: {err}"
                    visit.error = f"workload not built: {workload_error}"
                    release(device)
            if workload is not None and visit.skip is None and visit.error is None:
                visit.inputs, visit.k_scales = workload.inputs(point), workload.k_scales
            yield visit
    finally:
        workload = None
        release(device)


def prepare(visit: Visit, device: torch.device) -> Prepared:
    """Metadata from the plan, packed launches, the value scan (once) and the backend's schedules."""
    if not visit.ready or visit.plan is None or visit.backend is None:
        raise ValueError(f"point {visit.point.key}: not ready ({visit.skip or visit.error})")
    inputs, point, backend = visit.inputs, visit.point, visit.backend
    started = time.perf_counter()
    metadata = visit.plan.build_metadata(inputs.batch, inputs.cache.block_table)
    packed = tuple(pack_launch(launch, inputs) for launch in metadata.launches)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    metadata_ms = (time.perf_counter() - started) * 1e3
    check_launches(metadata, inputs)  # the value scan, once, outside every measured region
    for p in packed:
        backend.require(device, p.q.shape[1], point.heads, point.head_dim, point.cache_dtype)
    schedules = tuple(backend.schedule(p.context_lens, BLOCK_SIZE, p.block_table) for p in packed)
    return Prepared(metadata, packed, schedules, metadata_ms)
