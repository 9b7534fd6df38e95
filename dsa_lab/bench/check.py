"""The harness's one correctness measure: poisoned outputs compared with the reference, before any measurement.

Every mode checks a point this way before measuring it (timing, torch.profiler, Nsight
Compute), so a configuration that computes the wrong numbers is never timed or profiled.

On CUDA a first run tells the byte size of each output allocation; NaN-filled blocks of
exactly those sizes are then handed back to the caching allocator, which gives them to
the checked run's outputs, so an element the kernel never writes stays NaN (the row says
whether every output really landed in poisoned memory). The reference scores a sample of
requests (all of them when that is cheap) and the error is ||out - ref|| / ||ref|| over
the valid positions only, since some kernels leave the tail past each context unspecified.
A point passes when that error is at most its bound and no valid position is NaN. The bound
is the spec's `check_tolerance` (1e-3) unless the backend's arithmetic on this platform is
coarser (`bench.numerics`, with the reason: DeepGEMM on SM100, 1e-2); it is decided here,
so every mode checks against the same bound, and the result says which and why. (The
profiler once had a measure of its own, max |out - ref| / max |ref|; one measure now
serves every mode, so a point passes or fails the same way in each.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsa_lab.bench.numerics import backend_numerics
from dsa_lab.cache import PagedCache
from dsa_lab.decode import LaunchInputs, launch_logits
from dsa_lab.kernels import LogitsBackend, baseline_backend
from dsa_lab.metadata import DecodeMetadata
from dsa_lab.workload import DecodeBatch, DecodeInputs


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    rel_err: float
    checked_requests: int
    checked_tokens: int
    poisoned: bool  # every output landed in NaN-filled memory before the run
    message: str = ""
    tolerance: float | None = None  # the bound rel_err was held to
    tolerance_reason: str = ""  # why that bound (`bench.numerics`)


def checked_requests(batch: DecodeBatch, limit: int, count: int) -> list[int]:
    """Every request when the check is cheap; else the first, the last and the longest (up to `count`)."""
    work = sum(batch.token_context_lens())
    if work <= limit:
        return [b for b in range(batch.batch_size) if batch.decode_lens[b]]
    longest = max(range(batch.batch_size), key=lambda b: batch.seq_lens[b])
    picks = dict.fromkeys([0, batch.batch_size - 1, longest])
    return [b for b in picks if batch.decode_lens[b]][: max(1, count)]


def _poison(sizes: Sequence[int], device: torch.device) -> set[int]:
    """Hand NaN-filled blocks back to the CUDA caching allocator, which gives a request of the
    same byte size the same (best-fit, lowest-address) block next: the outputs start as NaN.
    Returns the blocks' addresses, so the check can tell whether each output really landed there."""
    blocks = [torch.full((n,), 0xFF, dtype=torch.uint8, device=device) for n in sizes]  # 0xFFFFFFFF is a NaN
    addresses = {t.data_ptr() for t in blocks}
    del blocks
    return addresses


def run_launches(
    backend: LogitsBackend, packed: Sequence[LaunchInputs], cache: PagedCache, max_len: int, schedules: Sequence[Any]
) -> list[torch.Tensor]:
    """Every launch of one decode step, as timed: the raw outputs, nothing gathered (launches
    checked once beforehand by `decode.check_launches`; no device sync here)."""
    return [launch_logits(backend, p, cache, max_len, s) for p, s in zip(packed, schedules, strict=True)]


def poisoned(run: Callable[[], list[torch.Tensor]], device: torch.device) -> tuple[list[torch.Tensor], bool]:
    """`run`'s outputs written into poisoned memory on CUDA (a first run, which JIT-compiles, tells each
    output's byte size; all bits set: NaN as float32, -1 as int32), and whether every output really landed
    there (False off CUDA)."""
    if device.type != "cuda":
        return run(), False
    addresses = _poison([out.untyped_storage().nbytes() for out in run()], device)
    outputs = run()
    return outputs, all(out.untyped_storage().data_ptr() in addresses for out in outputs)


def poisoned_run(
    backend: LogitsBackend,
    packed: Sequence[LaunchInputs],
    cache: PagedCache,
    max_len: int,
    schedules: Sequence[Any],
    device: torch.device,
) -> tuple[list[torch.Tensor], bool]:
    """Every launch of the step run into NaN-poisoned memory on CUDA (`poisoned`)."""
    return poisoned(lambda: run_launches(backend, packed, cache, max_len, schedules), device)


def check_point(
    inputs: DecodeInputs,
    metadata: DecodeMetadata,
    backend: LogitsBackend,
    packed: Sequence[LaunchInputs],
    schedules: Sequence[Any],
    tolerance: float,
    full_check_limit: int,
    sample_requests: int,
) -> CheckResult:
    """Poisoned run of every launch, then ||out - ref|| / ||ref|| on the valid positions of sampled requests.

    `tolerance` is the spec's `check_tolerance`; the backend's numerics on this device may
    loosen it (`bench.numerics.backend_numerics`), never tighten it.
    """
    device = inputs.q.device
    tolerance, tolerance_reason = backend_numerics(backend, device).check_tolerance(tolerance)
    batch, max_len = inputs.batch, metadata.max_context_len
    outputs, poisoned = poisoned_run(backend, packed, inputs.cache, max_len, schedules, device)
    requests = checked_requests(batch, full_check_limit, sample_requests)
    owners, wanted = batch.token_requests(), set(requests)
    tokens = [t for t, b in enumerate(owners) if b in wanted]
    position = torch.full((batch.num_decode_tokens,), -1, dtype=torch.long, device=device)
    position[torch.tensor(tokens, device=device)] = torch.arange(len(tokens), device=device)
    got = torch.full((len(tokens), max_len), float("nan"), dtype=torch.float32, device=device)
    for launch, out in zip(metadata.launches, outputs):
        rows = launch.token_rows.reshape(-1)
        slot = torch.where(rows >= 0, position[rows.clamp(min=0)], torch.full_like(rows, -1))
        keep = slot >= 0
        got[slot[keep]] = out[keep, :max_len].float()
    del outputs
    contexts = torch.tensor(batch.token_context_lens(), dtype=torch.int32, device=device)[tokens]
    table = inputs.cache.block_table[torch.tensor([owners[t] for t in tokens], device=device)]
    ref = baseline_backend().logits(
        inputs.q[tokens][:, None].contiguous(),
        inputs.cache.data,
        inputs.weights[tokens].contiguous(),
        contexts[:, None].contiguous(),
        table.contiguous(),
        max_len,
        cache_dtype=inputs.cache.cache_dtype,
    )
    valid = torch.arange(max_len, device=device)[None, :] < contexts[:, None]
    got_valid, ref_valid = got[valid].double(), ref[valid].double()
    nans = int(torch.isnan(got_valid).sum())
    rel_err = float((got_valid - ref_valid).norm() / ref_valid.norm().clamp(min=1e-30))
    common = {
        "checked_requests": len(requests),
        "checked_tokens": len(tokens),
        "poisoned": poisoned,
        "tolerance": tolerance,
        "tolerance_reason": tolerance_reason,
    }
    if nans:
        return CheckResult(
            False, rel_err, message=f"{nans} NaN among {got_valid.numel()} valid positions (unwritten?)", **common
        )
    if not rel_err <= tolerance:
        return CheckResult(False, rel_err, message=f"relative error {rel_err:.3e} > {tolerance:g}", **common)
    return CheckResult(True, rel_err, **common)
