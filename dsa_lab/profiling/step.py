"""One decode step cut into named phases, for the profilers: the step a point's plan launches.

The phases ("metadata", "pack", "logits", "scatter", "topk") are torch.profiler
`record_function` ranges and, for Nsight Compute, NVTX push/pop ranges, so both tools
can attribute every kernel to the part of the step that launched it. The launches come
from the point's `LaunchPlan` (`plan.build_metadata`), the blocks from `dsa_lab.decode`;
only the loop over launches is spelled out here so that pack and logits get separate
ranges. Correctness is checked before any profile, by the harness's one measure
(`bench.check.check_point`), not here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch.profiler import record_function

from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.batch.workload import DecodeInputs
from dsa_lab.decode import DecodeResult, check_launches, launch_logits, pack_launch, scatter_logits
from dsa_lab.kernels import LogitsBackend
from dsa_lab.topk import DEFAULT_TOPK, topk_per_row

PHASES = ("metadata", "pack", "logits", "scatter", "topk")


@contextmanager
def phase(name: str, nvtx: bool = False) -> Iterator[None]:
    """A torch.profiler range, and an NVTX push/pop range of the same name when `nvtx`."""
    with record_function(name):
        if nvtx:
            torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()


def phased_decode(
    inputs: DecodeInputs,
    plan: LaunchPlan,
    backend: LogitsBackend,
    topk: int = DEFAULT_TOPK,
    *,
    nvtx: bool = False,
    logits_window: Callable[[], AbstractContextManager[object]] = nullcontext,
    check: bool = True,
) -> DecodeResult:
    """The plan's decode step with every phase in its own range.

    The backend's scheduling metadata (DeepGEMM's SM plan) belongs to "metadata", as in
    vLLM's metadata builder. `logits_window` wraps each backend call only (the ncu target
    opens a profiling window there). `check` runs the value scans (launches, finite
    logits), each a device->host copy vLLM's step does not make: the warm-up runs them,
    and the profiled steps on the same inputs pass `check=False` so the tables show the step alone.
    """
    if not isinstance(plan, LaunchPlan):
        raise ValueError(f"plan: expected a LaunchPlan, got {type(plan).__name__}")
    device, batch = inputs.q.device, inputs.batch
    with phase("metadata", nvtx):
        metadata = plan.build_metadata(batch, inputs.cache.block_table)
        if check:
            check_launches(metadata, inputs)
        schedules = [
            backend.schedule(launch.context_lens, batch.block_size, launch.block_table) for launch in metadata.launches
        ]
    outputs = []
    for launch, schedule in zip(metadata.launches, schedules, strict=True):
        with phase("pack", nvtx):
            packed = pack_launch(launch, inputs)
        with phase("logits", nvtx), logits_window():
            outputs.append(launch_logits(backend, packed, inputs.cache, metadata.max_context_len, schedule))
    with phase("scatter", nvtx):
        logits, context = scatter_logits(metadata, outputs, device)
    with phase("topk", nvtx):
        indices = topk_per_row(logits, context, topk, check_values=check)
    return DecodeResult(metadata, logits, context, indices)
