"""The harness's one input builder: a workload's KV cache and queries on the device, and what they cost.

A `Workload` holds, for one (batch, context, cache dtype, heads, head_dim), the paged KV
cache (`cache.random_paged_cache`: drawn and quantised on the device, gigabytes in
seconds) and FP8 queries and float32 head weights for the largest next_n of the grid;
`inputs(point)` slices them for a point (each request's first rows, as many as the point's
acceptance gives it), so every point of the workload (any next_n, acceptance, backend,
strategy, any mode: timing, torch.profiler, Nsight Compute) reads the same data.
Its K scales are float32 or powers of two (`k_scales`, which `bench.numerics.cache_k_scales`
decides from the run's backends and the device: 'ue8m0' where DeepGEMM runs on SM100).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsa_lab.batch.cache import BLOCK_SIZE, bytes_per_token, random_paged_cache
from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.batch.workload import DecodeInputs
from dsa_lab.bench.numerics import K_SCALE_FORMATS
from dsa_lab.bench.point import Point
from dsa_lab.bench.timing import flush_bytes
from dsa_lab.errors import check_choice

OUTPUT_ALIGN = 256  # DeepGEMM pads logits rows to this; memory estimates assume it for everyone
MEMORY_HEADROOM = 0.9


class Workload:
    """One (batch, context, dtype, heads, head_dim) on the device: K cache and q/weights for the largest next_n."""

    def __init__(
        self,
        point: Point,
        seq_lens: Sequence[int],
        max_next_n: int,
        seed: int,
        device: torch.device,
        k_scales: str = "float32",
    ) -> None:
        self.key = point.workload_key
        self.seq_lens, self.seed = tuple(seq_lens), seed
        check_choice("k_scales", k_scales, K_SCALE_FORMATS)
        self.k_scales = k_scales
        self.cache = random_paged_cache(
            self.seq_lens, point.head_dim, BLOCK_SIZE, point.cache_dtype, seed, device, ue8m0=k_scales == "ue8m0"
        )
        gen = torch.Generator(device=device).manual_seed(seed + 1)
        shape = (point.batch, max_next_n, point.heads)
        self.q = torch.randn(*shape, point.head_dim, generator=gen, device=device).to(torch.float8_e4m3fn)
        self.weights = torch.randn(*shape, generator=gen, device=device) * point.heads**-0.5

    def inputs(self, point: Point) -> DecodeInputs:
        """The point's step: each request decodes its first `decode_lens[b]` query rows (next_n each
        without an acceptance profile), request-major."""
        if point.workload_key != self.key:
            raise ValueError(f"point {point.key}: not of this workload {self.key}")
        batch = point.decode_batch(self.seq_lens, self.seed)
        if batch.next_n > self.q.shape[1]:
            raise ValueError(f"point {point.key}: next_n={batch.next_n} above this workload's {self.q.shape[1]}")
        lens = torch.tensor(batch.decode_lens, device=self.q.device)
        rows = torch.arange(batch.next_n, device=self.q.device)[None, :] < lens[:, None]  # [B, n], request-major
        q = self.q[:, : batch.next_n][rows].contiguous()
        weights = self.weights[:, : batch.next_n][rows].contiguous()
        return DecodeInputs(batch, q, weights, self.cache)


def workload_bytes(seq_lens: Sequence[int], point: Point, max_next_n: int) -> int:
    """Device bytes a workload holds (KV pool, q, weights) plus its generation temporaries."""
    blocks = sum(max(1, -(-length // BLOCK_SIZE)) for length in seq_lens) + 1
    kv = blocks * BLOCK_SIZE * bytes_per_token(point.head_dim, point.cache_dtype)
    generation = min(sum(seq_lens), 1 << 20) * point.head_dim * 4 * 4
    q = len(seq_lens) * max_next_n * point.heads * (point.head_dim + 4) * 2
    return kv + generation + q


def point_bytes(point: Point, plan: LaunchPlan, checked_rows: int, device: torch.device) -> int:
    """Device bytes one point adds: kernel outputs (at the plan's logits width), packed inputs, check
    buffers, the L2 flush buffer; for 'logits+topk' the top-k check's whole-step logits, its masked copy and
    the selections; for the 'graph' timer a second set of outputs (the graph's pool holds its own)."""
    width = -(-plan.max_context_len // OUTPUT_ALIGN) * OUTPUT_ALIGN
    rows, tokens = plan.kernel_rows, plan.tokens
    outputs = rows * width * 4
    packed = rows * (point.heads * (point.head_dim + 4) + 4 * (-(-max(plan.seq_lens) // BLOCK_SIZE)))
    check = 4 * checked_rows * width * 4 + 8 * point.heads * 8192 * 4 * 4
    topk = (2 * tokens * width * 4 + 2 * rows * max(plan.seq_lens) * 4) if point.timed == "logits+topk" else 0
    graph = outputs + rows * max(plan.seq_lens) * 4 if point.timer == "graph" else 0
    return outputs + packed + check + topk + graph + flush_bytes(device)


def free_device_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
