"""The grid loop, written once: point -> plan -> can it run here -> workload -> a step ready to measure.

Every mode of the harness (timing, torch.profiler, the Nsight Compute target) iterates
`walk(points, spec, device)` and measures what it yields. For each point the loop asks the
backend for its native next_n set (`decode.native_sizes_for`), makes the point's
`LaunchPlan` once, and decides whether it can run here (`skip_reason`); then it builds the
point's workload (once per workload: the next points of the same workload reuse it; its K
scales in the format the run's backends need on this device, `bench.numerics`), and
yields a `Visit`. A workload that fails to build is an error for its own points only; the
next workload is built afresh. `prepare` turns a visit into the packed launches, checked
once (the value scan) outside any measured region, and fingerprints what the backend is
handed (`Visit.handed`, a `bench.check.InputGuard`) so the mode can verify it afterwards.

A workload is shared only while it is what was built: before each later point of it the
loop verifies its tensors against their fingerprints at build time (`bench.check.InputGuard`)
and rebuilds it when a backend wrote into them (`Visit.rebuilt` says which), so no point is
measured on inputs an earlier point damaged, whatever the mode. A backend's own probes
(`availability`, its numerics, its config space, `native_next_n`, `require`) that raise make
that point an error naming the backend and the probe (`errors.probe`), not the walk's crash.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from dsa_lab.batch.metadata import DecodeMetadata
from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.batch.workload import DecodeInputs
from dsa_lab.bench.check import InputGuard, checked_requests, handed_inputs
from dsa_lab.bench.inputs import MEMORY_HEADROOM, Workload, free_device_bytes, point_bytes, workload_bytes
from dsa_lab.bench.numerics import cache_k_scales
from dsa_lab.bench.point import Point, SweepSpec
from dsa_lab.bench.replay import replay_skip
from dsa_lab.bench.timing import TimingConfig, step_timing_method
from dsa_lab.decode import check_launches, launch_call, native_sizes_for, pack_launch, scheduled
from dsa_lab.errors import BackendUnavailable, UnsupportedShape, probe
from dsa_lab.kernels import LogitsBackend, LogitsCall, get_backend
from dsa_lab.topk import DEFAULT_TOPK, get_topk


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
    rebuilt: str = ""  # why the workload was rebuilt before this point (an earlier point wrote into it)
    handed: InputGuard | None = None  # what `prepare` hands the backend, fingerprinted before it runs

    @property
    def ready(self) -> bool:
        return self.inputs is not None


@dataclass(frozen=True)
class Prepared:
    """A point's launches, packed and value-checked, each one backend call with its schedule: what every mode runs."""

    metadata: DecodeMetadata
    calls: tuple[LogitsCall, ...]
    metadata_ms: float  # host time to build the metadata and pack the launches (device synced)


def point_backend(point: Point) -> LogitsBackend:
    """The point's backend running its config (`LogitsBackend.configured`); UnsupportedShape when the
    backend has no such knob (a config of a grid meant for another of its backends)."""
    backend = get_backend(point.backend)
    return probe(point.backend, f"configured({point.config!r}) (its config space)", lambda: _configured(backend, point))


def _configured(backend: LogitsBackend, point: Point) -> LogitsBackend:
    configured = backend.configured(point.config)
    if not isinstance(configured, LogitsBackend):
        raise TypeError(f"returned {type(configured).__name__}, not a LogitsBackend")
    return configured


def native_sizes(backend: LogitsBackend, device: torch.device) -> tuple[int, ...]:
    """`decode.native_sizes_for`, asked as a probe of the backend (a failure names it)."""
    return probe(backend.name, "native_next_n()", lambda: native_sizes_for(backend, device))


def skip_reason(point: Point, device: torch.device, plan: LaunchPlan | None = None, seed: int = 0) -> str | None:
    """Why the backend cannot (or need not) run this point here; None if it can."""
    try:
        backend = point_backend(point)
    except UnsupportedShape as err:
        return str(err)
    ok, reason = probe(point.backend, "availability()", lambda: _availability(backend, device))
    if not ok:
        return f"backend {point.backend!r} unavailable on {device.type}: {reason}"
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
        plan = point.plan(point.seq_lens(seed), native_sizes(backend, device), seed)
    if plan.same_as_native:
        return f"atom plan is one native piece of {point.next_n}: the same launch as native"
    for width in plan.widths:
        try:
            probe(point.backend, "require()", lambda w=width: _require(backend, device, point, w))
        except (UnsupportedShape, BackendUnavailable) as err:
            return str(err)
    return None


def _availability(backend: LogitsBackend, device: torch.device) -> tuple[bool, str]:
    state = backend.availability(device)
    return bool(state.ok), str(state.reason)


def _require(backend: LogitsBackend, device: torch.device, point: Point, width: int) -> None:
    backend.require(device, width, point.heads, point.head_dim, point.cache_dtype)


def release(device: torch.device) -> None:
    """Give freed device memory back (between workloads, after an error)."""
    gc.collect()
    if device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            pass


def walk(points: Sequence[Point], spec: SweepSpec, device: torch.device, memory_check: bool = True) -> Iterator[Visit]:
    """Each point of `points` (in order) as a `Visit`; builds each workload once, frees it when the next begins,
    and rebuilds it before a point when an earlier point's backend wrote into it."""
    max_n = max(spec.next_n)
    workload: Workload | None = None
    clean: InputGuard | None = None  # the workload's tensors as built
    key: tuple | None = None
    workload_error = ""
    try:
        for point in points:
            visit = Visit(point)
            if point.workload_key != key:
                workload, clean, key, workload_error = None, None, point.workload_key, ""
                release(device)  # the old workload's memory goes back before the next is built
            elif clean is not None and (changed := clean.changed()):
                visit.rebuilt = f"workload rebuilt: an earlier point's backend changed its {', '.join(changed)}"
                workload, clean = None, None
                release(device)
            try:
                visit.backend = point_backend(point)
                seq_lens = point.seq_lens(spec.seed)
                visit.plan = point.plan(seq_lens, native_sizes(visit.backend, device), spec.seed)
                visit.skip = skip_reason(point, device, visit.plan, spec.seed)
                if visit.skip is None and workload_error:
                    visit.error = f"workload not built: {workload_error}"
                if visit.skip is None and visit.error is None:
                    probe_batch = point.decode_batch(seq_lens, spec.seed)
                    sampled = checked_requests(probe_batch, spec.full_check_limit, spec.check_requests)
                    need = point_bytes(point, visit.plan, point.next_n * len(sampled), device)
                    need += workload_bytes(seq_lens, point, max_n) if workload is None else 0
                    visit.estimated_bytes = need
                    free = free_device_bytes(device) if memory_check else None
                    if free is not None and need > MEMORY_HEADROOM * free:
                        visit.skip = f"needs ~{need / 2**30:.2f} GiB, {free / 2**30:.2f} GiB free"
            except UnsupportedShape as err:  # a config of the grid this backend has no knob for
                visit.skip = str(err)
            except Exception as err:  # a bad plan, or a backend's probe that raised (named): this point only
                visit.error = f"{type(err).__name__}: {err}"
            if visit.skip is None and visit.error is None and workload is None:
                try:
                    k_scales = cache_k_scales(point.cache_dtype, spec.backend, device)  # every backend's numerics
                    workload = Workload(point, seq_lens, max_n, spec.seed, device, k_scales)
                    clean = InputGuard.of(_workload_tensors(workload))
                except Exception as err:  # out of memory, a failing generator or probe: this workload's points only
                    workload, clean = None, None
                    workload_error = f"{type(err).__name__}: {err}"
                    visit.error = f"workload not built: {workload_error}"
                    release(device)
            if workload is not None and visit.skip is None and visit.error is None:
                visit.inputs, visit.k_scales = workload.inputs(point), workload.k_scales
            yield visit
    finally:
        workload = clean = None
        release(device)


def _workload_tensors(workload: Workload) -> dict[str, torch.Tensor]:
    """What every point of a workload reads: its KV cache, block table, queries and weights (all next_n rows)."""
    return {"KV cache": workload.cache.data, "block table": workload.cache.block_table, "q": workload.q,
            "weights": workload.weights}  # fmt: skip


def prepare(visit: Visit, device: torch.device) -> Prepared:
    """Metadata from the plan, packed launches, the value scan (once) and each launch's call with the backend's
    schedule."""
    if not visit.ready or visit.plan is None or visit.backend is None:
        raise ValueError(f"point {visit.point.key}: not ready ({visit.skip or visit.error})")
    inputs, point, backend = visit.inputs, visit.point, visit.backend
    started = time.perf_counter()
    metadata = visit.plan.build_metadata(inputs.batch, inputs.cache.block_table)
    width = metadata.max_context_len
    calls = tuple(launch_call(pack_launch(launch, inputs), inputs.cache, width) for launch in metadata.launches)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    metadata_ms = (time.perf_counter() - started) * 1e3
    check_launches(metadata, inputs)  # the value scan, once, outside every measured region
    visit.handed = InputGuard.of(handed_inputs(inputs, calls))  # before the backend's first call, its schedule
    for call in calls:
        probe(point.backend, "require()", lambda c=call: _require(backend, device, point, c.q.shape[1]))
    calls = tuple(probe(point.backend, "schedule()", lambda c=call: scheduled(backend, c)) for call in calls)
    return Prepared(metadata, calls, metadata_ms)
