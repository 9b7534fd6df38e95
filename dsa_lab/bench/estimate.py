"""How long a grid takes on an H200 before it runs (`dsa-lab bench --dry-run`), per grid of a union.

The estimate walks the points as the sweep would, on the H200's terms (each backend's SM90 native
sizes; a point its backend skips there costs nothing) and adds, in seconds:

- a JIT compile the first time a backend launches a kernel shape (its rows a request, heads, head
  dim, cache dtype, config): `COMPILE_S`, the mean extra time of the 69 first launches in the five
  harness runs shipped under data/h200/ (the full study, its repeat, the harness re-run and the two
  Gluon studies; DeepGEMM 3.2 s, Gluon 1.5 s, Triton 0.5 s);
- a workload build each time the workload changes between two points that run (`WORKLOAD_S` and
  the KV cache drawn at `BUILD_BYTES_PER_S`; the issue-13 run's 8 builds took about 2 s);
- per point `POINT_S` (check, prepare, schedule timing: the mean over 1,675 warm points of those runs,
  the time of their samples taken out), plus the step itself: the check's two runs, the warm-up and the
  samples (`TimingConfig`: `min_samples` rounded up to whole `sync_every` batches, as those runs show)
  at the modeled step time: `KERNEL_OVER_FLOOR` x the roofline floor of the bytes the backend's launches
  move, `LAUNCH_MS` a launch, `SAMPLE_MS` of L2 flush and spin a sample;
- for 'logits+topk': the top-k after every launch, `TOPK_PASSES` passes over the rows' longest-context
  columns at the measured read rate (modeled: torch.topk's radix select and the masked copy before it),
  and its check (the whole step's logits scattered, `topk_per_row`, the comparison: `TOPK_CHECK_PASSES`);
- for the 'graph' timer: the capture (warm-up steps off the stream, one captured step, one upload replay)
  and `GRAPH_S` for the capture itself.

A point's plan is drawn for at most `ESTIMATE_REQUESTS` of its requests and scaled to its batch (bytes,
FLOPs and rows add up over requests: exact for a uniform context, a seeded sample's mean for a mixed
one), once per distinct sample, so a dry run over thousands of batch sizes answers in seconds.

`START_S` (imports, CUDA start, the ceilings' measurement) is outside a sweep's `--max-minutes` and is
reported beside it. A resumed run pays the compiles of what is left again (a new process).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from dsa_lab.batch.cache import bytes_per_token
from dsa_lab.batch.plan import ANY_NEXT_N, LaunchPlan
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.bench.point import Point, SweepSpec
from dsa_lab.bench.walk import point_backend, skip_reason
from dsa_lab.decode import native_sizes_for
from dsa_lab.errors import UnsupportedShape
from dsa_lab.kernels import get_backend
from dsa_lab.model.gpus import ARCH_MAJORS
from dsa_lab.model.roofline import floor_ms, get_gpu

SM90_MAJOR = ARCH_MAJORS["sm90"]
START_S = 20.0
COMPILE_S = 1.5
WORKLOAD_S = 0.3
BUILD_BYTES_PER_S = 10e9
POINT_S = 0.14
KERNEL_OVER_FLOOR = 1.2  # B = 128, 64K: 286 us against a 254 us floor (native n = 1), 2178 / 2032 (flatten n = 8)
LAUNCH_MS = 0.008  # B = 1, 64K: 9.4 us a native step whose floor is 2 us
SAMPLE_MS = 0.1  # the L2 flush (2 x 60 MB zeroed) and the spin kernel before each sample
TOPK_PASSES = 6
TOPK_CHECK_PASSES = 12
GRAPH_S = 0.05
ESTIMATE_REQUESTS = 64


def sample_batch(point: Point) -> int:
    """At most `ESTIMATE_REQUESTS` requests: the batch a dry run draws and scales to the point's (one request
    where every request is alike: one fixed length, no acceptance draw)."""
    alike = ContextSpec.parse(point.context).distribution == "fixed" and point.acceptance == "none"
    return min(point.batch, 1 if alike else ESTIMATE_REQUESTS)


def sample_point(point: Point) -> Point:
    """The point at its `sample_batch`: the plan a dry run draws."""
    return dataclasses.replace(point, batch=sample_batch(point))


class SamplePlans:
    """Each sampled point's cached lengths and launch plan, drawn once per shape: a plan depends on the
    point's axes but not on which backend runs it (only on the native sizes it has)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._plans: dict[tuple, tuple[tuple[int, ...], LaunchPlan]] = {}

    def get(self, point: Point, native: tuple[int, ...]) -> tuple[tuple[int, ...], LaunchPlan, float]:
        """(cached lengths, plan) of `sample_point(point)`, and the factor that scales it to the point's batch."""
        batch = sample_batch(point)
        key = (*(v for name, v in point.axes().items() if name not in ("backend", "config") and name != "batch"), batch)
        if (*key, native) not in self._plans:
            sample = dataclasses.replace(point, batch=batch)  # made only for a shape not drawn yet
            seq_lens = sample.seq_lens(self.seed)
            self._plans[(*key, native)] = seq_lens, sample.plan(seq_lens, native, self.seed)
        return (*self._plans[(*key, native)], point.batch / batch)


def skipped_on(spec: SweepSpec, device: torch.device) -> int:
    """How many of the spec's points `walk.skip_reason` skips on `device`, asked once per sampled point with
    its context left out: whether a point runs depends on its launches' widths, not on its cached lengths."""
    plans, reasons, count = SamplePlans(spec.seed), {}, 0
    for point in spec.points():
        batch = sample_batch(point)
        key = (*(v for name, v in point.axes().items() if name not in ("context", "batch")), batch)
        if key not in reasons:
            try:
                backend = point_backend(point)
            except UnsupportedShape:
                plan = None  # skip_reason names the refused config
            else:
                ok = backend.availability(device).ok
                plan = plans.get(point, native_sizes_for(backend, device))[1] if ok else None
            reasons[key] = skip_reason(sample_point(point), device, plan, spec.seed) is not None
        count += reasons[key]
    return count


@dataclass(frozen=True)
class GridEstimate:
    """One grid's share of a run: its points, those an H200 would run, compiles, workload builds, seconds."""

    name: str
    points: int
    run: int
    compiles: int
    workloads: int
    seconds: float


def estimate(spec: SweepSpec, gpu_name: str = "H200-measured") -> list[GridEstimate]:
    """The H200 time of `spec`, per grid (one entry for a spec of one grid), in the order they run."""
    gpu = get_gpu(gpu_name)
    timing = spec.timing
    samples = max(timing.min_samples, 1)
    samples = math.ceil(samples / timing.sync_every) * timing.sync_every
    compiled: set[tuple] = set()
    plans = SamplePlans(spec.seed)
    workload = None
    out = []
    for name, points in spec.grid_points():
        run = compiles = workloads = 0
        seconds = 0.0
        for point in points:
            backend = get_backend(point.backend)
            try:
                backend = backend.configured(point.config)
            except UnsupportedShape:
                continue
            native = backend.native_sizes_on(SM90_MAJOR)
            seq_lens, plan, scale = plans.get(point, native or ANY_NEXT_N)
            if plan.same_as_native or (native is not None and not set(plan.widths) <= set(native)):
                continue  # skipped on the H200: costs nothing
            run += 1
            if point.workload_key != workload:
                workload = point.workload_key
                workloads += 1
                kv = scale * (sum(seq_lens) + 64 * len(seq_lens)) * bytes_per_token(point.head_dim, point.cache_dtype)
                seconds += WORKLOAD_S + kv / BUILD_BYTES_PER_S
            for width in plan.widths:
                shape = (point.backend, point.config, width, point.heads, point.head_dim, point.cache_dtype)
                if shape not in compiled:
                    compiled.add(shape)
                    compiles += 1
                    seconds += COMPILE_S
            moved = plan.cost.moved_bytes(backend.cleans_tail)
            memory_ms = moved / (gpu.hbm_tbps * 1e12) * 1e3
            floor = scale * max(memory_ms, floor_ms(plan.cost, gpu, strategy_bytes=True)[0])
            step_ms = KERNEL_OVER_FLOOR * floor + LAUNCH_MS * plan.launches
            topk_pass_ms = scale * plan.kernel_rows * max(seq_lens) * 4 / (gpu.hbm_tbps * 1e12) * 1e3
            check_s = 0.0
            if point.timed == "logits+topk":
                step_ms += TOPK_PASSES * topk_pass_ms + LAUNCH_MS * 4 * plan.launches
                check_s = TOPK_CHECK_PASSES * topk_pass_ms / 1e3 + POINT_S / 2
            replays = samples + timing.warmup + 2  # the check's two runs, the warm-up, the samples
            if point.timer == "graph":
                replays += timing.warmup + 2
                check_s += GRAPH_S
            seconds += POINT_S + check_s + replays * (step_ms + SAMPLE_MS) / 1e3
        out.append(GridEstimate(name, len(points), run, compiles, workloads, seconds))
    return out


def estimate_seconds(spec: SweepSpec, gpu_name: str = "H200-measured") -> float:
    """The whole sweep's H200 time (start-up aside: `START_S`)."""
    return sum(part.seconds for part in estimate(spec, gpu_name))


def estimate_table(parts: list[GridEstimate]) -> str:
    """The dry run's lines per grid (`estimate`'s): points, those an H200 runs, compiles, workload builds, seconds."""
    width = max(len("grid"), *(len(p.name) for p in parts))
    lines = [f"  {'grid':<{width}}  points  on H200  compiles  workloads  est. s"]
    for p in parts:
        lines.append(
            f"  {p.name:<{width}}  {p.points:>6}  {p.run:>7}  {p.compiles:>8}  {p.workloads:>9}  {p.seconds:>6.1f}"
        )
    return "\n".join(lines)
