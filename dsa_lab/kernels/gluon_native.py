"""A warp-specialised Gluon paged MQA-logits kernel for Hopper (SM90), native for every next_n.

Our own code after DeepGEMM's SM90 design; docs/triton_kernel.md rounds 5-6 hold the design, the
H200 measurements behind `choose_gluon_config` and what is still missing.

* Persistent grid, one CTA an SM. The launch's KV work is the request-major list of (request,
  64-token column block) pairs; CTA p takes the slice `[p * T // P, (p + 1) * T // P)` of its
  T = B * col_blocks entries, so every request's KV is split across SMs.
* A load partition (one warp) walks the slice: per request it TMA-copies Q_b and the request's
  weights into shared memory (after every consumer released the previous ones), then per scored
  block it takes the page id (32 ids per vector load) and TMA-copies the K tile (`[64, D]` fp8)
  and its 64 float32 scales into a ring of `STAGES` slots guarded by full/empty mbarriers. The
  fused cache (block p: 64 x D e4m3 bytes, then 64 f32 scales) is read through two views: K as
  2-D fp8 `[num_blocks * (64 + 256 / D), D]` (block p = rows `p * (64 + 256 / D)` + 0..63), the
  scales as 2-D f32 `[num_blocks, 16 * (D + 4)]` at column `16 * D` (byte offset 64 * D).
* `consumers` MMA + epilogue partitions (a warpgroup each) take the ring's items round-robin:
  async wgmma `S = K [64, D] @ Q_b^T` (FP8, fp32 accumulation), then per query row relu x
  weights, the head sum and the k scale, -inf past the row's context. One consumer's epilogue
  overlaps another's MMAs; inside a consumer the chunks of a group are issued together and
  chunk c's epilogue overlaps chunks c+1.. (`warpgroup_mma_wait(num_outstanding)`).
* Query rows become power-of-two MMA chunks (`gluon_chunk_plan`): `pair` = binary parts (n=3:
  N=128 + N=64, DeepGEMM PR #340's scheme), `row` = one N=H MMA a row, `pad` = next_n rounded
  up (n=3: one N=256 MMA, row 3 dropped).

Every output element is written: -inf past each row's context, and blocks past a request's
longest context are written -inf without being read (`cleans_tail = True`). Gluon kernels do
not run under TRITON_INTERPRET: `tests/test_gluon_aot.py` compiles this one for sm_90 on a CPU
machine, and `scripts/gluon_dev.py check` runs it against the reference on the H200.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dsa_lab.errors import check_choice, check_range
from dsa_lab.kernels.registry import (
    Availability,
    ConfigSpace,
    LogitsBackend,
    ModelTraits,
    check_native_call,
    num_sms,
    ready_native_call,
    register_backend,
)

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError as exc:  # the backend then reports itself unavailable, with this reason
    gluon = None
    GLUON_IMPORT_ERROR = f"triton.experimental.gluon (Hopper) is not importable ({exc})"
else:
    GLUON_IMPORT_ERROR = ""

BLOCK_SIZE = 64
MAX_NEXT_N = 16
REQUIRED_CAPABILITY = (9, 0)  # wgmma and setmaxnreg: sm_90a only (SM100 has tcgen05 instead)
PLAN_MODES = ("pair", "row", "pad")
REGISTERS_PER_SM = 65536
MAX_SHARED_BYTES = 227 * 1024


@dataclass(frozen=True)
class GluonConfig:
    """One point of the config space.

    `consumers`: MMA + epilogue warpgroups (2 to 4); `stages`: KV ring slots (a multiple of
    `consumers`); `plan`: how query rows become power-of-two MMA chunks (`PLAN_MODES`);
    `mma_columns`: the most columns (query rows x H) one MMA takes (64, 128 or 256);
    `group_columns`: the most columns a consumer has in flight (chunks are issued in groups of
    at most this many columns; within a group chunk c's epilogue overlaps chunks c+1.. on the
    tensor cores); `resident_weights`: keep a request's weights in registers, or reload them
    (L1) per block; `loader_registers`: setmaxnreg of the load warp's warpgroup (the consumers
    share the rest of the register file).
    """

    consumers: int = 2
    stages: int = 8
    plan: str = "pair"
    mma_columns: int = 256
    group_columns: int = 256
    resident_weights: bool = True
    loader_registers: int = 40

    def describe(self) -> str:
        weights = "resident" if self.resident_weights else "reload"
        return (
            f"gluon/c{self.consumers}/s{self.stages}/{self.plan}/mma{self.mma_columns}/"
            f"grp{self.group_columns}/{weights}/lr{self.loader_registers}"
        )

    def validate(self) -> None:
        check_range("consumers", self.consumers, 2, 4)
        check_range("stages", self.stages, 2, 32)
        check_choice("plan", self.plan, PLAN_MODES)
        check_choice("mma_columns", self.mma_columns, (64, 128, 256))
        check_choice("group_columns", self.group_columns, (64, 128, 192, 256, 384, 512))
        check_choice("resident_weights", self.resident_weights, (False, True))
        check_choice("loader_registers", self.loader_registers, (24, 32, 40, 48, 56, 64, 72, 80, 96))
        if self.stages % self.consumers:
            raise ValueError(f"stages={self.stages}: must be a multiple of consumers={self.consumers}")


def _constexpr_function(fn):
    """triton.constexpr_function where Triton exists (the kernel calls it at compile time)."""
    return triton.constexpr_function(fn) if gluon is not None else fn


@_constexpr_function
def _plan(next_n, heads, mode, mma_columns):
    """The chunk plan itself; self-contained (Triton hashes what a constexpr function references)."""
    per_mma = max(1, mma_columns // heads)
    if mode == 1:  # row
        return tuple((row, 1) for row in range(next_n))
    if mode == 2:  # pad
        size = min(per_mma, 1 << (next_n - 1).bit_length())
        return tuple((first, size) for first in range(0, next_n, size))
    plan = []
    first = 0
    for _ in range(next_n // per_mma):
        plan.append((first, per_mma))
        first += per_mma
    size = per_mma
    while first < next_n:
        size //= 2
        if next_n - first >= size:
            plan.append((first, size))
            first += size
    return tuple(plan)


@_constexpr_function
def _groups(plan, heads, group_columns):
    """Consecutive chunks issued together, at most `group_columns` columns a group (at least one chunk)."""
    groups = []
    current = []
    columns = 0
    for index in range(len(plan)):
        width = plan[index][1] * heads
        if current and columns + width > group_columns:
            groups.append(tuple(current))
            current = []
            columns = 0
        current.append(index)
        columns += width
    groups.append(tuple(current))
    return tuple(groups)


@_constexpr_function
def _slot_columns(plan, groups, heads):
    """Columns of the accumulator in each position of a group, reused across groups and blocks
    (the widest chunk that position takes; a narrower chunk there gets a fresh accumulator)."""
    slots = []
    for g in range(len(groups)):
        for i in range(len(groups[g])):
            width = plan[groups[g][i]][1] * heads
            if i == len(slots):
                slots.append(width)
            elif width > slots[i]:
                slots[i] = width
    return tuple(slots)


def gluon_chunk_plan(next_n: int, heads: int, mode: str, mma_columns: int = 256) -> tuple[tuple[int, int], ...]:
    """(first query row, query rows) of each MMA: rows a power of two, N = rows * H <= mma_columns.

    `pair`: full chunks of mma_columns / H rows, then the remainder's binary parts (n=3, H=64:
    2 + 1, i.e. N=128 + N=64). `row`: one N=H chunk a row. `pad`: next_n rounded up to a power
    of two, in chunks of at most mma_columns / H rows, so the last chunk may hold rows >=
    next_n, which are computed on unloaded shared memory and never stored (n=3: one N=256 MMA).
    """
    check_range("next_n", next_n, 1, MAX_NEXT_N)
    check_choice("plan", mode, PLAN_MODES)
    return _plan(next_n, heads, PLAN_MODES.index(mode), mma_columns)


def plan_rows(plan: tuple[tuple[int, int], ...]) -> int:
    """Query rows of shared memory the plan's MMAs read (>= next_n for `pad`)."""
    return max(first + rows for first, rows in plan)


def choose_gluon_config(next_n: int, heads: int, head_dim: int) -> GluonConfig:
    """A fixed rule on the query columns n * H, from the H200 rounds 5-6 (docs/triton_kernel.md).

    Registers decide: a consumer holds the fp32 accumulators of the columns it has in flight
    (N / 2 registers a thread) and, resident, a request's weights (n * H / 4). Measured best at
    B=128, L=64K, H=64: n <= 2 -> three consumers, one MMA; n=3 -> two consumers, N=128 then N=64
    one at a time; n=4 -> two consumers, two N=128 MMAs in flight; n >= 5 -> three consumers,
    N=128 chunks one at a time, weights re-read from shared memory (12% to 24% faster than two
    consumers with N=256). Round 9: a 12-slot ring at n = 3, 4 (0.4-1.3% faster than 8 in two
    calls); four consumers were no faster anywhere.
    """
    del head_dim  # D=64 was checked, not timed; it takes the D=128 choice
    columns = next_n * heads
    if columns <= 128:
        return GluonConfig(consumers=3, stages=9, plan="pair", mma_columns=256, group_columns=256)
    if columns <= 192:
        return GluonConfig(consumers=2, stages=12, plan="pair", mma_columns=128, group_columns=128)
    if columns <= 256:
        return GluonConfig(consumers=2, stages=12, plan="pair", mma_columns=128, group_columns=256)
    return GluonConfig(consumers=3, stages=9, plan="pair", mma_columns=128, group_columns=128, resident_weights=False)


def consumer_registers(config: GluonConfig) -> int:
    """setmaxnreg budget of one consumer warpgroup: the SM's registers less the loader's warpgroup."""
    per_thread = (REGISTERS_PER_SM // 128 - config.loader_registers) // config.consumers
    return min(240, per_thread // 8 * 8)


def launch_registers(consumers: int) -> int:
    """maxnreg at launch: (consumers + 1) warpgroups must fit the SM's register file."""
    return min(255, REGISTERS_PER_SM // (128 * (consumers + 1)) // 8 * 8)


def q_rows_allocated(next_n: int, heads: int, config: GluonConfig) -> int:
    """Query rows of Q's shared-memory buffer: the plan's rows rounded up to a power of two."""
    rows = plan_rows(gluon_chunk_plan(next_n, heads, config.plan, config.mma_columns))
    return 1 << (rows - 1).bit_length()


def q_box_rows(next_n: int, heads: int, config: GluonConfig) -> int:
    """Query rows one TMA box of Q takes (a box has at most 256 rows of H heads)."""
    return min(q_rows_allocated(next_n, heads, config), max(1, 256 // heads))


def shared_bytes(next_n: int, heads: int, head_dim: int, config: GluonConfig) -> int:
    """Shared memory the kernel allocates (Q, the ring, barriers), before alignment."""
    q_bytes = q_rows_allocated(next_n, heads, config) * heads * (head_dim + 4)
    ring = config.stages * (BLOCK_SIZE * head_dim + BLOCK_SIZE * 4)
    return q_bytes + ring + 8 * (2 * config.stages + 2)


if gluon is not None:

    @triton.constexpr_function
    def _mma_layout(columns):
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, columns, 32])

    @triton.constexpr_function
    def _slot_width(slot_columns, k):
        return slot_columns[k] if k < len(slot_columns) else 0

    @triton.constexpr_function
    def _row_layout():
        return gl.BlockedLayout([1], [32], [1], [0])

    @triton.constexpr_function
    def _tail_layout():
        return gl.BlockedLayout([1, 2], [1, 32], [4, 1], [1, 0])

    @gluon.jit
    def _cta_slice(total_blocks, col_blocks):
        """This CTA's global block range [g0, g1) and its requests [b0, b1)."""
        pid = gl.program_id(0).to(gl.int64)
        programs = gl.num_programs(0).to(gl.int64)
        g0 = pid * total_blocks // programs
        g1 = (pid + 1) * total_blocks // programs
        b0 = g0 // col_blocks
        b1 = (g1 + col_blocks - 1) // col_blocks
        return g0, g1, b0, b1

    @gluon.jit
    def _request_span(b, g0, g1, col_blocks, ctx_ptr, NEXT_N: gl.constexpr, BLOCK: gl.constexpr):
        """Columns blocks [lo, hi) of request b in this CTA's slice; blocks below `scored` are read."""
        base = b * col_blocks
        lo = gl.maximum(g0 - base, 0)
        hi = gl.minimum(g1 - base, col_blocks)
        ctx_max = gl.load(ctx_ptr + b * NEXT_N)
        for r in gl.static_range(1, NEXT_N):
            ctx_max = gl.maximum(ctx_max, gl.load(ctx_ptr + b * NEXT_N + r))
        scored = gl.minimum(hi, (ctx_max.to(gl.int64) + BLOCK - 1) // BLOCK)
        n_items = gl.maximum(scored - lo, 0)
        return lo.to(gl.int32), hi.to(gl.int32), scored.to(gl.int32), n_items.to(gl.int32)

    @gluon.jit
    def _load_partition(
        loads, smem, NEXT_N: gl.constexpr, H: gl.constexpr, D: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr,
        Q_ROWS: gl.constexpr, Q_BOX: gl.constexpr,
    ):  # fmt: skip
        q_desc, w_desc, kv_desc, sc_desc, ctx_ptr, table_ptr, table_stride, col_blocks, total_blocks = loads
        q_smem, w_smem, kv_smem, sc_smem, q_full, q_empty, kv_full, kv_empty = smem
        ROWS_PER_PAGE: gl.constexpr = BLOCK + BLOCK * 4 // D  # rows of the 2-D fp8 view a page takes
        SCALE_COL: gl.constexpr = BLOCK * D // 4  # the scales' first f32 column in a page's row
        KV_BYTES: gl.constexpr = BLOCK * D + BLOCK * 4
        lanes = gl.arange(0, 32, layout=_row_layout())
        g0, g1, b0, b1 = _cta_slice(total_blocks, col_blocks)
        it = 0
        qi = 0
        for b in range(b0, b1):
            lo, hi, scored, n_items = _request_span(b, g0, g1, col_blocks, ctx_ptr, NEXT_N, BLOCK)
            if n_items > 0:
                # Q_b: wait until every consumer is done with the previous request's Q.
                mbarrier.wait(q_empty, (qi & 1) ^ 1)
                # Whole boxes of Q_BOX query rows: rows past next_n belong to the next request (or
                # lie past the tensor, zero-filled) and are never used.
                mbarrier.expect(q_full, Q_ROWS * H * (D + 4))
                for r in gl.static_range(0, Q_ROWS, Q_BOX):
                    q_row = (b * NEXT_N + r).to(gl.int32)
                    tma.async_copy_global_to_shared(q_desc, [q_row * H, 0], q_full, q_smem.slice(r * H, Q_BOX * H))
                    tma.async_copy_global_to_shared(w_desc, [q_row, 0], q_full, w_smem.slice(r, Q_BOX))
                qi += 1
                row = table_ptr + b * table_stride + lo
                for g in range(0, n_items, 32):
                    ids = gl.load(row + g + lanes, mask=g + lanes < n_items, other=0)
                    for k in range(gl.minimum(n_items - g, 32)):
                        page = gl.sum(gl.where(lanes == k, ids, 0), axis=0)
                        item = it + g + k
                        s = item % STAGES
                        mbarrier.wait(kv_empty.index(s), ((item // STAGES) & 1) ^ 1)
                        mbarrier.expect(kv_full.index(s), KV_BYTES)
                        tma.async_copy_global_to_shared(
                            kv_desc, [page * ROWS_PER_PAGE, 0], kv_full.index(s), kv_smem.index(s)
                        )
                        tma.async_copy_global_to_shared(sc_desc, [page, SCALE_COL], kv_full.index(s), sc_smem.index(s))
                it += n_items

    @gluon.jit
    def _epilogue(
        acc, w, scale, ctxs, out_ptr, out_row0, out_stride, blk, max_context_len,
        FIRST: gl.constexpr, ROWS: gl.constexpr, NEXT_N: gl.constexpr, H: gl.constexpr, BLOCK: gl.constexpr,
    ):  # fmt: skip
        """relu(S) * w, summed over heads per query row, times the k scale; -inf past the context
        (`ctxs`: the request's context length per query row, read once per request).

        The head sum of a chunk's row r runs over the accumulator's columns [r * H, (r + 1) * H):
        a `where` on the column index, which the compiler folds per register (each thread's
        columns are known at compile time), so every column is added once.
        """
        layout: gl.constexpr = _mma_layout(ROWS * H)
        x = gl.maximum(acc, 0.0) * w[None, :]
        tokens = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout))
        pos = blk * BLOCK + tokens
        in_out = pos < max_context_len
        for r in gl.static_range(ROWS):
            if FIRST + r < NEXT_N:
                if ROWS == 1:
                    logits = gl.sum(x, axis=1)
                else:
                    cols = gl.arange(0, ROWS * H, layout=gl.SliceLayout(0, layout))
                    logits = gl.sum(gl.where((cols // H == r)[None, :], x, 0.0), axis=1)
                logits = gl.where(
                    pos < ctxs[FIRST + r], logits * gl.convert_layout(scale, gl.SliceLayout(1, layout)), float("-inf")
                )
                gl.store(out_ptr + (out_row0 + FIRST + r) * out_stride + pos, logits, mask=in_out)

    @gluon.jit
    def _slot_zeros(SLOT_COLUMNS: gl.constexpr, K: gl.constexpr, BLOCK: gl.constexpr):
        """The first value of accumulator slot K (0 where the plan uses fewer slots)."""
        COLUMNS: gl.constexpr = _slot_width(SLOT_COLUMNS, K)
        if COLUMNS > 0:
            return gl.zeros([BLOCK, COLUMNS], gl.float32, _mma_layout(COLUMNS))
        else:
            return 0

    @gluon.jit
    def _pick(K: gl.constexpr, s0, s1, s2, s3):
        if K == 0:
            return s0
        elif K == 1:
            return s1
        elif K == 2:
            return s2
        else:
            return s3

    @gluon.jit
    def _load_weights(w_smem, FIRST: gl.constexpr, ROWS: gl.constexpr, H: gl.constexpr):
        """A chunk's weights from shared memory, in the layout of its accumulator's columns."""
        chunk = w_smem.reshape([w_smem.shape[0] * H]).slice(FIRST * H, ROWS * H)
        return chunk.load(gl.SliceLayout(0, _mma_layout(ROWS * H)))

    @gluon.jit
    def _consumer_partition(
        outs, smem, CONSUMER: gl.constexpr, NEXT_N: gl.constexpr, H: gl.constexpr, D: gl.constexpr, BLOCK: gl.constexpr,
        STAGES: gl.constexpr, CONSUMERS: gl.constexpr, PLAN_MODE: gl.constexpr, MMA_COLUMNS: gl.constexpr,
        GROUP_COLUMNS: gl.constexpr, RESIDENT_WEIGHTS: gl.constexpr,
    ):  # fmt: skip
        ctx_ptr, out_ptr, out_stride, max_context_len, col_blocks, total_blocks = outs
        q_smem, w_smem, kv_smem, sc_smem, q_full, q_empty, kv_full, kv_empty = smem
        PLAN: gl.constexpr = _plan(NEXT_N, H, PLAN_MODE, MMA_COLUMNS)
        GROUPS: gl.constexpr = _groups(PLAN, H, GROUP_COLUMNS)
        SLOT_COLUMNS: gl.constexpr = _slot_columns(PLAN, GROUPS, H)
        N_POW2: gl.constexpr = 1 << (NEXT_N - 1).bit_length()
        g0, g1, b0, b1 = _cta_slice(total_blocks, col_blocks)
        it = 0
        qi = 0
        for b in range(b0, b1):
            lo, hi, scored, n_items = _request_span(b, g0, g1, col_blocks, ctx_ptr, NEXT_N, BLOCK)
            out_row0 = b * NEXT_N
            if n_items > 0:
                mbarrier.wait(q_full, qi & 1)
                qi += 1
                # Read once per request: inside the block loop the compiler must re-load them after
                # every logits store (the pointers may alias), a global load on each epilogue's path.
                ctxs = ()
                for r in gl.static_range(NEXT_N):
                    ctxs = ctxs + (gl.load(ctx_ptr + out_row0 + r),)
                ws = ()
                for c in gl.static_range(len(PLAN)):
                    if RESIDENT_WEIGHTS:
                        ws = ws + (_load_weights(w_smem, PLAN[c][0], PLAN[c][1], H),)
                first_j = (CONSUMER - it % CONSUMERS + CONSUMERS) % CONSUMERS
                # Accumulator registers are reused block after block (their input is ignored:
                # use_acc=False), so no zero tensor is materialised per MMA.
                slot0 = _slot_zeros(SLOT_COLUMNS, 0, BLOCK)
                slot1 = _slot_zeros(SLOT_COLUMNS, 1, BLOCK)
                slot2 = _slot_zeros(SLOT_COLUMNS, 2, BLOCK)
                slot3 = _slot_zeros(SLOT_COLUMNS, 3, BLOCK)
                for j in range(first_j, n_items, CONSUMERS):
                    item = it + j
                    s = item % STAGES
                    mbarrier.wait(kv_full.index(s), (item // STAGES) & 1)
                    k_tile = kv_smem.index(s)
                    scale = sc_smem.index(s).reshape([BLOCK]).load(gl.SliceLayout(1, _mma_layout(PLAN[0][1] * H)))
                    blk = lo + j
                    for g in gl.static_range(len(GROUPS)):
                        accs = ()
                        for i in gl.static_range(len(GROUPS[g])):
                            if SLOT_COLUMNS[i] == PLAN[GROUPS[g][i]][1] * H:
                                seed = _pick(i, slot0, slot1, slot2, slot3)
                            else:
                                seed = _slot_zeros((PLAN[GROUPS[g][i]][1] * H,), 0, BLOCK)
                            q_view = q_smem.slice(PLAN[GROUPS[g][i]][0] * H, PLAN[GROUPS[g][i]][1] * H).permute((1, 0))
                            accs = accs + (warpgroup_mma(k_tile, q_view, seed, use_acc=False, is_async=True),)
                        done = ()
                        for i in gl.static_range(len(GROUPS[g])):
                            acc = warpgroup_mma_wait(len(GROUPS[g]) - 1 - i, deps=(accs[i],))
                            if g == len(GROUPS) - 1:
                                if i == len(GROUPS[g]) - 1:
                                    # The block's last MMA is done and its scales were read (generic
                                    # proxy): order those reads before the loader's next TMA write.
                                    fence_async_shared()
                                    mbarrier.arrive(kv_empty.index(s), count=1)
                            if RESIDENT_WEIGHTS:
                                w = ws[GROUPS[g][i]]
                            else:
                                w = _load_weights(w_smem, PLAN[GROUPS[g][i]][0], PLAN[GROUPS[g][i]][1], H)
                            _epilogue(acc, w, scale, ctxs, out_ptr, out_row0, out_stride, blk, max_context_len,
                                      PLAN[GROUPS[g][i]][0], PLAN[GROUPS[g][i]][1], NEXT_N, H, BLOCK)  # fmt: skip
                            done = done + (acc,)
                        for i in gl.static_range(len(GROUPS[g])):
                            if SLOT_COLUMNS[i] == PLAN[GROUPS[g][i]][1] * H:
                                if i == 0:
                                    slot0 = done[0]
                                elif i == 1:
                                    slot1 = done[1]
                                elif i == 2:
                                    slot2 = done[2]
                                else:
                                    slot3 = done[3]
                fence_async_shared()  # weights were read from shared memory before Q_b's slot is refilled
                mbarrier.arrive(q_empty, count=1)
            it += n_items
            # Blocks past the request's longest context: -inf without reading them.
            rows = gl.arange(0, N_POW2, layout=gl.SliceLayout(1, _tail_layout()))
            tokens = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, _tail_layout()))
            ninf = gl.full([N_POW2, BLOCK], float("-inf"), gl.float32, _tail_layout())
            row_offsets = (out_row0 + rows).to(gl.int64) * out_stride
            for blk in range(gl.maximum(scored, lo) + CONSUMER, hi, CONSUMERS):
                pos = blk * BLOCK + tokens
                mask = (rows < NEXT_N)[:, None] & (pos < max_context_len)[None, :]
                gl.store(out_ptr + row_offsets[:, None] + pos[None, :], ninf, mask=mask)

    @gluon.jit
    def _paged_mqa_logits_gluon_kernel(
        q_desc, w_desc, kv_desc, sc_desc, ctx_ptr, table_ptr, out_ptr,
        table_stride, out_stride, max_context_len, col_blocks, total_blocks,
        NEXT_N: gl.constexpr, H: gl.constexpr, D: gl.constexpr, BLOCK: gl.constexpr, Q_ROWS: gl.constexpr, Q_BOX: gl.constexpr,
        STAGES: gl.constexpr, CONSUMERS: gl.constexpr, PLAN_MODE: gl.constexpr, MMA_COLUMNS: gl.constexpr,
        GROUP_COLUMNS: gl.constexpr, RESIDENT_WEIGHTS: gl.constexpr,
        CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
    ):  # fmt: skip
        q_smem = gl.allocate_shared_memory(gl.float8e4nv, [Q_ROWS * H, D], q_desc.layout)
        w_smem = gl.allocate_shared_memory(gl.float32, [Q_ROWS, H], w_desc.layout)
        kv_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK, D], kv_desc.layout)
        sc_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK], sc_desc.layout)
        q_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_full, count=1)
        mbarrier.init(q_empty, count=CONSUMERS)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_full.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=1)

        smem = (q_smem, w_smem, kv_smem, sc_smem, q_full, q_empty, kv_full, kv_empty)
        outs = (ctx_ptr, out_ptr, out_stride, max_context_len, col_blocks, total_blocks)
        loads = (q_desc, w_desc, kv_desc, sc_desc, ctx_ptr, table_ptr, table_stride, col_blocks, total_blocks)
        # One branch per consumer count: partition arguments must be tuple literals (constexprs kept).
        # fmt: off
        if CONSUMERS == 2:
            gl.warp_specialize(
                [
                    (_consumer_partition, (outs, smem, 0, NEXT_N, H, D, BLOCK, STAGES, CONSUMERS, PLAN_MODE, MMA_COLUMNS, GROUP_COLUMNS, RESIDENT_WEIGHTS)),
                    (_consumer_partition, (outs, smem, 1, NEXT_N, H, D, BLOCK, STAGES, CONSUMERS, PLAN_MODE, MMA_COLUMNS, GROUP_COLUMNS, RESIDENT_WEIGHTS)),
                    (_load_partition, (loads, smem, NEXT_N, H, D, BLOCK, STAGES, Q_ROWS, Q_BOX)),
                ],
                [4, 1],
                [CONSUMER_REGS, LOADER_REGS],
            )
        elif CONSUMERS == 3:
            gl.warp_specialize(
                [
                    (_consumer_partition, (outs, smem, 0, NEXT_N, H, D, BLOCK, STAGES, CONSUMERS, PLAN_MODE, MMA_COLUMNS, GROUP_COLUMNS, RESIDENT_WEIGHTS)),
                    (_consumer_partition, (outs, smem, 1, NEXT_N, H, D, BLOCK, STAGES, CONSUMERS, PLAN_MODE, MMA_COLUMNS, GROUP_COLUMNS, RESIDENT_WEIGHTS)),
                    (_consumer_partition, (outs, smem, 2, NEXT_N, H, D, BLOCK, STAGES, CONSUMERS, PLAN_MODE, MMA_COLUMNS, GROUP_COLUMNS, RESIDENT_WEIGHTS)),
                    (_load_partition, (loads, smem, NEXT_N, H, D, BLOCK, STAGES, Q_ROWS, Q_BOX)),
                ],
                [4, 4, 1],
                [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS],
            )
        else:
            gl.static_assert(CONSUMERS == 4, "2 to 4 consumer warpgroups")
            gl.warp_specialize(
                [
                    (_consumer_partition, (outs, smem, 0, NEXT_N, H, D, BLOCK, STAGES, CONSUMERS, PLAN_MODE, MMA_COLUMNS, GROUP_COLUMNS, RESIDENT_WEIGHTS)),
                    (_consumer_partition, (outs, smem, 1, NEXT_N, H, D, BLOCK, STAGES, CONSUMERS, PLAN_MODE, MMA_COLUMNS, GROUP_COLUMNS, RESIDENT_WEIGHTS)),
                    (_consumer_partition, (outs, smem, 2, NEXT_N, H, D, BLOCK, STAGES, CONSUMERS, PLAN_MODE, MMA_COLUMNS, GROUP_COLUMNS, RESIDENT_WEIGHTS)),
                    (_consumer_partition, (outs, smem, 3, NEXT_N, H, D, BLOCK, STAGES, CONSUMERS, PLAN_MODE, MMA_COLUMNS, GROUP_COLUMNS, RESIDENT_WEIGHTS)),
                    (_load_partition, (loads, smem, NEXT_N, H, D, BLOCK, STAGES, Q_ROWS, Q_BOX)),
                ],
                [4, 4, 4, 1],
                [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS],
            )
        # fmt: on


def kernel_constexprs(next_n: int, heads: int, head_dim: int, config: GluonConfig) -> dict[str, Any]:
    """The compile-time arguments of one launch (shared with tests/test_gluon_aot.py)."""
    return {
        "NEXT_N": next_n,
        "H": heads,
        "D": head_dim,
        "BLOCK": BLOCK_SIZE,
        "Q_ROWS": q_rows_allocated(next_n, heads, config),
        "Q_BOX": q_box_rows(next_n, heads, config),
        "STAGES": config.stages,
        "CONSUMERS": config.consumers,
        "PLAN_MODE": PLAN_MODES.index(config.plan),
        "MMA_COLUMNS": config.mma_columns,
        "GROUP_COLUMNS": config.group_columns,
        "RESIDENT_WEIGHTS": config.resident_weights,
        "CONSUMER_REGS": consumer_registers(config),
        "LOADER_REGS": config.loader_registers,
    }


def launch_options(config: GluonConfig) -> dict[str, int]:
    return {"num_warps": 4, "maxnreg": launch_registers(config.consumers)}


# The kernel's runtime arguments in order, with the types the launch gives them (descriptors
# are typed by `descriptor_layouts`); the AOT test and the dev script compile from this.
POINTER_ARGS = {"ctx_ptr": "*i32", "table_ptr": "*i32", "out_ptr": "*fp32"}
INT_ARGS = ("table_stride", "out_stride", "max_context_len", "col_blocks", "total_blocks")


def descriptor_blocks(next_n: int, heads: int, head_dim: int, config: GluonConfig) -> dict[str, tuple[str, list[int]]]:
    """Element type and box of each TMA descriptor: Q and weights (`q_box_rows` query rows), a K tile, its scales."""
    rows = q_box_rows(next_n, heads, config)
    return {
        "q_desc": ("fp8e4nv", [rows * heads, head_dim]),
        "w_desc": ("fp32", [rows, heads]),
        "kv_desc": ("fp8e4nv", [BLOCK_SIZE, head_dim]),
        "sc_desc": ("fp32", [1, BLOCK_SIZE]),
    }


def descriptor_layouts(next_n: int, heads: int, head_dim: int, config: GluonConfig) -> dict[str, Any]:
    """Shared-memory layouts: 128-byte swizzle for Q and K (wgmma operands), none for the f32 vectors
    (weights and scales are read back as flat vectors)."""
    layouts = {}
    for name, (dtype, shape) in descriptor_blocks(next_n, heads, head_dim, config).items():
        if dtype == "fp32":
            layouts[name] = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        else:
            layouts[name] = gl.NVMMASharedLayout.get_default_for(shape, gl.float8e4nv)
    return layouts


def kernel_signature(next_n: int, heads: int, head_dim: int, config: GluonConfig) -> dict[str, str]:
    """Triton's signature strings for an ahead-of-time compile (constexprs excluded)."""
    layouts = descriptor_layouts(next_n, heads, head_dim, config)
    signature = {
        name: f"tensordesc<{dtype}{shape},{layouts[name]!r}>"
        for name, (dtype, shape) in descriptor_blocks(next_n, heads, head_dim, config).items()
    }
    signature.update(POINTER_ARGS)
    signature.update(dict.fromkeys(INT_ARGS, "i32"))
    return signature


def compile_for(arch: int, next_n: int, heads: int, head_dim: int, config: GluonConfig) -> Any:
    """Compile the kernel ahead of time for `sm_<arch>` (no GPU needed); Triton's CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource  # sets num-warps before layouts are verified

    constexprs = kernel_constexprs(next_n, heads, head_dim, config)
    signature = kernel_signature(next_n, heads, head_dim, config)
    fn = _paged_mqa_logits_gluon_kernel
    full = {}
    for param in fn.params:
        full[param.name] = "constexpr" if param.name in constexprs else signature[param.name]
    source = GluonASTSource(fn=fn, signature=full, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=launch_options(config))


def availability(device: torch.device) -> Availability:
    """Can the Gluon kernel run on `device`? Gluon has no interpreter, and wgmma is SM90-only."""
    if gluon is None:
        return Availability(False, GLUON_IMPORT_ERROR)
    device = torch.device(device)
    if device.type != "cuda":
        return Availability(
            False, f"the Gluon kernel needs an SM90 (Hopper) CUDA GPU; got device {device.type} (no interpreter)"
        )
    if not torch.cuda.is_available():
        return Availability(
            False, "the Gluon kernel needs an SM90 (Hopper) CUDA GPU; torch.cuda.is_available() is False"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability != REQUIRED_CAPABILITY:
        return Availability(
            False, f"the Gluon kernel uses wgmma (sm_90a only): needs compute capability {REQUIRED_CAPABILITY}, "
            f"this GPU has {capability}"
        )  # fmt: skip
    return Availability(True, "")


def check_gluon_config(q: torch.Tensor, config: GluonConfig | None) -> None:
    """A given config must be a valid GluonConfig whose ring and Q fit in shared memory at q's shape."""
    if config is None:
        return
    if not isinstance(config, GluonConfig):
        raise ValueError(f"config: expected a GluonConfig or None, got {type(config).__name__}")
    config.validate()
    _, next_n, heads, dim = q.shape
    used = shared_bytes(next_n, heads, dim, config)
    if used > MAX_SHARED_BYTES:
        raise ValueError(
            f"config={config.describe()}: needs {used} B of shared memory at next_n={next_n}, H={heads}, "
            f"D={dim}; at most {MAX_SHARED_BYTES} (use fewer stages)"
        )


def paged_mqa_logits_gluon(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    config: GluonConfig | None = None,
    check_values: bool = True,
    out: torch.Tensor | None = None,
    *,
    cache_dtype: str,
) -> torch.Tensor:
    """DeepGEMM's calling convention; every output element is written (-inf past each context).

    `check_values=False` skips the host-syncing scan of lens and block ids (timed loops, whose
    launches were checked once before). `out` lets a check pass a poisoned output.
    """
    backend = GluonNativeBackend()
    args = (q, kv_cache, weights, context_lens, block_table, max_context_len)
    check_native_call(
        backend, *args, cache_dtype=cache_dtype, check_values=check_values, out=out, max_next_n=MAX_NEXT_N,
        block_size=BLOCK_SIZE,
    )  # fmt: skip
    check_gluon_config(q, config)
    q, weights, context_lens, block_table = ready_native_call(backend, *args, check_values=check_values)
    _, next_n, heads, dim = q.shape
    config = config or choose_gluon_config(next_n, heads, dim)
    return launch(q, kv_cache, weights, context_lens, block_table, max_context_len, config, out)[0]


def launch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    config: GluonConfig,
    out: torch.Tensor | None = None,
    num_programs: int = 0,
) -> tuple[torch.Tensor, Any]:
    """Launch on checked, contiguous arguments; also return Triton's compiled kernel.

    `num_programs` 0 = one CTA per SM (at most one per column block).
    """
    batch, next_n, heads, dim = q.shape
    if out is None:
        out = torch.empty(batch * next_n, max_context_len, dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, None
    col_blocks = -(-max_context_len // BLOCK_SIZE)
    total_blocks = batch * col_blocks
    programs = num_programs or min(num_sms(q.device.index or 0), total_blocks)
    blocks = descriptor_blocks(next_n, heads, dim, config)
    layouts = descriptor_layouts(next_n, heads, dim, config)
    num_blocks = kv_cache.shape[0]
    rows_per_page = BLOCK_SIZE + BLOCK_SIZE * 4 // dim  # 64 K rows, then the scales' bytes as rows of D
    fp8 = kv_cache.view(torch.float8_e4m3fn).view(num_blocks * rows_per_page, dim)
    f32 = kv_cache.view(num_blocks, BLOCK_SIZE * (dim + 4)).view(torch.float32)
    q2 = q.view(batch * next_n * heads, dim)
    descriptors = {
        "q_desc": TensorDescriptor.from_tensor(q2, blocks["q_desc"][1], layouts["q_desc"]),
        "w_desc": TensorDescriptor.from_tensor(weights, blocks["w_desc"][1], layouts["w_desc"]),
        "kv_desc": TensorDescriptor.from_tensor(fp8, blocks["kv_desc"][1], layouts["kv_desc"]),
        "sc_desc": TensorDescriptor.from_tensor(f32, blocks["sc_desc"][1], layouts["sc_desc"]),
    }
    kernel = _paged_mqa_logits_gluon_kernel[(programs,)](
        descriptors["q_desc"],
        descriptors["w_desc"],
        descriptors["kv_desc"],
        descriptors["sc_desc"],
        context_lens,
        block_table,
        out,
        block_table.stride(0),
        out.stride(0),
        max_context_len,
        col_blocks,
        total_blocks,
        **kernel_constexprs(next_n, heads, dim, config),
        **launch_options(config),
    )
    return out, kernel


@register_backend
class GluonNativeBackend(LogitsBackend):
    """Our warp-specialised Gluon kernel (SM90): any next_n natively, each KV tile read once per request."""

    name = "gluon"
    family = "dsa_lab"
    label = "Gluon (ours)"
    marker = "P"
    color = "#bcbd22"
    presets = ("smoke", "h200-full")  # SM90 only
    packages: ClassVar[tuple[str, ...]] = ("triton",)
    resume_fields: ClassVar[tuple[str, ...]] = ("triton",)
    cleans_tail: ClassVar[bool] = True
    # Any rows natively, float32 logits, relu and a weighted FMA a head; a persistent grid splits the KV evenly.
    model_traits: ClassVar[Mapping[str, ModelTraits]] = {"sm90": ModelTraits(1, 4, 2.0)}
    config_space: ClassVar[ConfigSpace] = ConfigSpace(GluonConfig, choose_gluon_config, paged_mqa_logits_gluon)

    def availability(self, device: torch.device) -> Availability:
        return availability(device)

    def logits(
        self,
        q,
        kv_cache,
        weights,
        context_lens,
        block_table,
        max_context_len,
        schedule: Any = None,
        *,
        cache_dtype: str,
    ):
        # No device sync: this call is timed and graph-captured; its launch was checked where it
        # was prepared (decode.check_launches).
        return paged_mqa_logits_gluon(
            q, kv_cache, weights, context_lens, block_table, max_context_len, check_values=False, cache_dtype=cache_dtype
        )  # fmt: skip
