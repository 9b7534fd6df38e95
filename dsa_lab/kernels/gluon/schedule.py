"""A work-balanced persistent schedule for paged MQA logits, made on the device; and the tail it leaves.

Request b of a launch owns `S_b = ceil(max_j context_lens[b, j] / 64)` KV blocks, those of its
longest row (0 for a CUDA-graph padding request). Laid end to end they make `T = sum_b S_b`
blocks; persistent CTA p of P takes the contiguous range `[p T // P, (p + 1) T // P)`, which may
begin inside one request and end inside another, so every CTA gets the same share of the real
work whatever the spread of the contexts (DeepGEMM's `get_paged_mqa_logits_metadata` splits the
same sum over its SMs). A split of `B * ceil(max_context_len / 64)` column blocks instead hands
each CTA about one request's columns, empty ones included, and the step lasts as long as the
longest request alone.

The schedule is `P + 1` (request, block offset) pairs: CTA p's range starts at entry p and ends
before entry p + 1, and (B, 0) is the end. One program computes it (two passes over the
requests: the total, then each CTA's start), with no host sync, so it is captured in CUDA graphs
and timed apart from the kernel (the harness's `schedule_ms`), as DeepGEMM's is. A kernel walking
it writes only the blocks rows own: `fill_tail` writes -inf past them for a caller that asks for
a clean tail. Both run under TRITON_INTERPRET, so the CPU tests run them against
`reference_schedule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dsa_lab.batch.cache import BLOCK_SIZE
from dsa_lab.errors import check_choice, check_range, check_tensor
from dsa_lab.kernels.jit import compile_ahead, jitted

try:
    import triton
    import triton.language as tl
except ImportError:  # the Gluon backend, the one user, then reports itself unavailable
    triton = None

SCHEDULE_CHUNK = 32  # requests one step of the schedule's loops takes (x TARGETS compares, in registers)
TAIL_COLUMNS = 1024  # columns one program of fill_tail writes
FIRST_PAGES = 32  # page ids the schedule gathers for each CTA's first blocks (one vector load in the kernel)
MAX_PROGRAMS = 4096


@dataclass(frozen=True)
class BalancedSchedule:
    """`ranges` int32 [programs + 1, 2]: (request, block offset) where each CTA's range starts;
    `blocks` int32 [batch]: each request's KV blocks (its longest row's); `pages` int32
    [programs, FIRST_PAGES]: the page ids of each CTA's first blocks (from its start, in its first
    request; entries past that request's table row are 0 and never read)."""

    ranges: torch.Tensor
    blocks: torch.Tensor
    pages: torch.Tensor

    @property
    def programs(self) -> int:
        return self.ranges.shape[0] - 1


def _schedule_kernel(
    ctx_ptr, table_ptr, blocks_ptr, ranges_ptr, pages_ptr, batch, programs, table_stride, table_width,
    NEXT_N: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, TARGETS: tl.constexpr, PAGES: tl.constexpr,
):  # fmt: skip
    total = tl.zeros([1], dtype=tl.int32)
    for start in range(0, batch, CHUNK):
        b = start + tl.arange(0, CHUNK)
        live = b < batch
        longest = tl.load(ctx_ptr + b * NEXT_N, mask=live, other=0)
        for r in tl.static_range(1, NEXT_N):
            longest = tl.maximum(longest, tl.load(ctx_ptr + b * NEXT_N + r, mask=live, other=0))
        count = (tl.maximum(longest, 0) + BLOCK - 1) // BLOCK
        tl.store(blocks_ptr + b, count, mask=live)
        total += tl.sum(count, axis=0)
    p = tl.arange(0, TARGETS)
    share = total // programs
    target = p * share + tl.minimum(p, total % programs)  # CTA p's first block: shares differ by one at most
    request = tl.zeros([TARGETS], dtype=tl.int32)  # requests whose blocks all lie before the target
    before = tl.zeros([TARGETS], dtype=tl.int32)  # their blocks
    carry = tl.zeros([1], dtype=tl.int32)
    for start in range(0, batch, CHUNK):
        b = start + tl.arange(0, CHUNK)
        live = b < batch
        longest = tl.load(ctx_ptr + b * NEXT_N, mask=live, other=0)
        for r in tl.static_range(1, NEXT_N):
            longest = tl.maximum(longest, tl.load(ctx_ptr + b * NEXT_N + r, mask=live, other=0))
        count = (tl.maximum(longest, 0) + BLOCK - 1) // BLOCK
        ends = tl.cumsum(count, axis=0) + carry
        done = (ends[None, :] <= target[:, None]) & live[None, :]
        request += tl.sum(done.to(tl.int32), axis=1)
        before += tl.sum(tl.where(done, count[None, :], 0), axis=1)
        carry += tl.sum(count, axis=0)
    offset = target - before
    keep = p <= programs
    tl.store(ranges_ptr + 2 * p, request, mask=keep)
    tl.store(ranges_ptr + 2 * p + 1, offset, mask=keep)
    # The page ids of each CTA's first PAGES blocks (in its first request), so its first KV copies wait
    # behind one read of this table and not two (the ranges, then the block table).
    k = tl.arange(0, PAGES)
    column = offset[:, None] + k[None, :]
    take = (p < programs)[:, None] & (request < batch)[:, None] & (column < table_width)
    rows = table_ptr + request.to(tl.int64)[:, None] * table_stride + column
    pages = tl.load(rows, mask=take, other=0)
    tl.store(pages_ptr + p[:, None] * PAGES + k[None, :], pages, mask=(p < programs)[:, None] & (k < PAGES)[None, :])


def _fill_tail_kernel(out_ptr, blocks_ptr, out_stride, width, chunks, NEXT_N: tl.constexpr, BLOCK: tl.constexpr,
                      COLUMNS: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    row = pid // chunks
    cols = (pid % chunks) * COLUMNS + tl.arange(0, COLUMNS)
    start = tl.load(blocks_ptr + row // NEXT_N) * BLOCK
    keep = (cols >= start) & (cols < width)
    tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, tl.full([COLUMNS], float("-inf"), tl.float32), mask=keep)


KERNELS = {"schedule": _schedule_kernel, "tail": _fill_tail_kernel}


def balanced_schedule(context_lens: torch.Tensor, block_table: torch.Tensor, programs: int) -> BalancedSchedule:
    """The schedule of a launch with these int32 [B, n] context lens and [B, W] block table over
    `programs` CTAs, made on the device with no host sync."""
    if triton is None:
        raise RuntimeError("balanced_schedule needs triton, which is not importable here")
    check_tensor("context_lens", context_lens, dtype=torch.int32, ndim=2, contiguous=True)
    batch, next_n = context_lens.shape
    check_tensor("block_table", block_table, dtype=torch.int32, shape=(batch, None), device=context_lens.device)
    if block_table.shape[1] and block_table.stride(1) != 1:
        raise ValueError("block_table: rows must be unit-stride")
    check_range("programs", programs, 1, MAX_PROGRAMS)
    check_range("next_n", next_n, 1, 64)
    device = context_lens.device
    ranges = torch.empty(programs + 1, 2, dtype=torch.int32, device=device)
    blocks = torch.empty(batch, dtype=torch.int32, device=device)
    pages = torch.empty(programs, FIRST_PAGES, dtype=torch.int32, device=device)
    jitted(_schedule_kernel)[(1,)](
        context_lens, block_table, blocks, ranges, pages, batch, programs, block_table.stride(0), block_table.shape[1],
        NEXT_N=next_n, BLOCK=BLOCK_SIZE, CHUNK=SCHEDULE_CHUNK, TARGETS=triton.next_power_of_2(programs + 1),
        PAGES=FIRST_PAGES, num_warps=8,
    )  # fmt: skip
    return BalancedSchedule(ranges, blocks, pages)


def fill_tail(out: torch.Tensor, schedule: BalancedSchedule, next_n: int) -> None:
    """Write -inf in every column of `out` [B * next_n, width] past its request's last scored block."""
    if triton is None:
        raise RuntimeError("fill_tail needs triton, which is not importable here")
    check_tensor("out", out, dtype=torch.float32, ndim=2, device=schedule.blocks.device)
    rows, width = out.shape
    if rows != schedule.blocks.shape[0] * next_n:
        raise ValueError(f"out: {rows} rows for {schedule.blocks.shape[0]} requests of next_n={next_n}")
    if out.stride(1) != 1:
        raise ValueError("out: rows must be unit-stride")
    if rows == 0 or width == 0:
        return
    chunks = triton.cdiv(width, TAIL_COLUMNS)
    jitted(_fill_tail_kernel)[(rows * chunks,)](
        out, schedule.blocks, out.stride(0), width, chunks, NEXT_N=next_n, BLOCK=BLOCK_SIZE, COLUMNS=TAIL_COLUMNS,
    )  # fmt: skip


SCHEDULE_SIGNATURE = {
    "ctx_ptr": "*i32", "table_ptr": "*i32", "blocks_ptr": "*i32", "ranges_ptr": "*i32", "pages_ptr": "*i32",
    "batch": "i32", "programs": "i32", "table_stride": "i32", "table_width": "i32",
}  # fmt: skip
TAIL_SIGNATURE = {"out_ptr": "*fp32", "blocks_ptr": "*i32", "out_stride": "i32", "width": "i32", "chunks": "i32"}
COMPILE_ARCHS = (80, 86, 89, 90, 100, 120)


def compile_for(arch: int, kernel: str, next_n: int, programs: int = 132) -> Any:
    """Compile the schedule (`kernel='schedule'`) or the tail fill (`'tail'`) ahead of time for
    `sm_<arch>` (no GPU needed; call it where TRITON_INTERPRET is unset); Triton's CompiledKernel."""
    check_choice("arch", arch, COMPILE_ARCHS)
    check_choice("kernel", kernel, tuple(KERNELS))
    check_range("next_n", next_n, 1, 64)
    check_range("programs", programs, 1, MAX_PROGRAMS)
    if triton is None:
        raise RuntimeError("compile_for needs triton, which is not importable here")
    if kernel == "schedule":
        constexprs = {"NEXT_N": next_n, "BLOCK": BLOCK_SIZE, "CHUNK": SCHEDULE_CHUNK,
                      "TARGETS": triton.next_power_of_2(programs + 1), "PAGES": FIRST_PAGES}  # fmt: skip
        signature, options = SCHEDULE_SIGNATURE, {"num_warps": 8}
    else:
        constexprs = {"NEXT_N": next_n, "BLOCK": BLOCK_SIZE, "COLUMNS": TAIL_COLUMNS}
        signature, options = TAIL_SIGNATURE, {"num_warps": 4}
    return compile_ahead(KERNELS[kernel], arch, signature, constexprs, options)


def reference_schedule(
    context_lens: torch.Tensor, block_table: torch.Tensor, programs: int
) -> tuple[list[tuple[int, int]], list[int], list[list[int]]]:
    """The same split in plain Python (tests): each CTA's (request, block offset) start, the blocks,
    and each CTA's first FIRST_PAGES page ids (0 past its first request's table row)."""
    lens = context_lens.to(torch.int64).cpu()
    table = block_table.cpu().tolist()
    blocks = [(max(int(row.max()), 0) + BLOCK_SIZE - 1) // BLOCK_SIZE if row.numel() else 0 for row in lens]
    total = sum(blocks)
    share, rest = divmod(total, programs)
    starts, pages = [], []
    for p in range(programs + 1):
        target, request, before = p * share + min(p, rest), 0, 0
        while request < len(blocks) and before + blocks[request] <= target:
            before += blocks[request]
            request += 1
        starts.append((request, target - before))
        if p < programs:
            row = table[request] if request < len(blocks) else []
            first = row[target - before : target - before + FIRST_PAGES]
            pages.append(first + [0] * (FIRST_PAGES - len(first)))
    return starts, blocks, pages
