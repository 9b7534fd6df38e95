"""The warp-specialised Gluon paged MQA-logits kernel for Hopper (SM90): the device code only.

Our own code after DeepGEMM's SM90 design (docs/triton_kernel.md, rounds 5-12: the design and the H200
measurements); `launch.py` launches it and says what it writes, `config.py` holds its config.

* Persistent grid, one CTA an SM, over the work-balanced schedule of `schedule.py`: CTA p walks
  its contiguous share of the launch's real KV blocks (request-major), which may begin inside one
  request and end inside another; blocks past a request's longest row are never visited.
* A load partition (one warp) walks that range. Per request it takes the page ids (32 a vector
  load; the CTA's first 32 come with the schedule, `BalancedSchedule.pages`) and TMA-copies each
  K tile (`[64, D]` fp8) and its 64 float32 scales into the `KVRing`, the request's first tile
  before its Q and weights (`QueryBuffers`). The fused cache (page p: 64 x D e4m3 bytes, then 64
  f32 scales) is read through two views: K as 2-D fp8 `[num_blocks * (64 + 256 / D), D]`, the
  scales as 2-D f32 `[num_blocks, 16 * (D + 4)]`.
* `CONSUMERS` MMA + epilogue partitions (a warpgroup each) take the ring's items round-robin:
  async wgmma `S = K [64, D] @ Q_b^T` (FP8, fp32 accumulation) in chunk groups
  (`config.chunk_groups`), then per query row relu x weights, the head sum and the k scale,
  -inf past the row's context. One consumer's epilogue overlaps another's MMAs; inside a consumer
  chunk c's epilogue overlaps chunks c+1.. of its group.
"""

# No `from __future__ import annotations`: aggregates check their fields against the real annotation types.
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

from dsa_lab.kernels.gluon.config import chunk_groups, slot_columns

try:
    from triton.experimental.gluon import aggregate  # Triton >= 3.7
except ImportError:  # Triton 3.6 (the H200's) has it under its private name
    from triton.language.core import _aggregate as aggregate


@triton.constexpr_function
def _mma_layout(columns):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, columns, 32])


@triton.constexpr_function
def _group_size(groups, g):
    """Chunks in issue group g (`config.chunk_groups`; Triton 3.6 cannot subscript it in a kernel)."""
    return len(groups[g])


@triton.constexpr_function
def _chunk(groups, g, i, field):
    """Field `field` of chunk i of group g: 0 first row, 1 rows, 2 accumulator slot, 3 index in the plan."""
    return groups[g][i][field]


@triton.constexpr_function
def _lane_layout():
    return gl.BlockedLayout([1], [32], [1], [0])


@aggregate
class KVRing:
    """STAGES slots, each a K tile [64, D] fp8 and its 64 f32 scales behind a full and an empty
    barrier. Item i of a CTA's walk lives in slot i % STAGES; lap i // STAGES sets the phase."""

    tiles: gl.shared_memory_descriptor
    scales: gl.shared_memory_descriptor
    full: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    STAGES: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, tiles, scales, full, empty, STAGES):
        self.tiles = tiles
        self.scales = scales
        self.full = full
        self.empty = empty
        self.STAGES = gl.constexpr(STAGES)

    @gluon.jit
    def fill(self, item, page, kv_desc, sc_desc):
        """Loader: wait until item's slot is free, then TMA-copy page `page`'s K tile and scales into it."""
        BLOCK: gl.constexpr = self.tiles.shape[1]
        D: gl.constexpr = self.tiles.shape[2]
        ROWS_PER_PAGE: gl.constexpr = BLOCK + BLOCK * 4 // D  # rows of the 2-D fp8 view a page takes
        SCALE_COLUMN: gl.constexpr = BLOCK * D // 4  # the scales' first f32 column in a page's row
        s = item % self.STAGES
        mbarrier.wait(self.empty.index(s), ((item // self.STAGES) & 1) ^ 1)
        mbarrier.expect(self.full.index(s), BLOCK * D + BLOCK * 4)
        tma.async_copy_global_to_shared(kv_desc, [page * ROWS_PER_PAGE, 0], self.full.index(s), self.tiles.index(s))
        tma.async_copy_global_to_shared(sc_desc, [page, SCALE_COLUMN], self.full.index(s), self.scales.index(s))

    @gluon.jit
    def wait(self, item):
        """Consumer: wait until item's tile has landed; its slot."""
        s = item % self.STAGES
        mbarrier.wait(self.full.index(s), (item // self.STAGES) & 1)
        return s

    @gluon.jit
    def release(self, s):
        """Consumer: the slot's MMAs are done and its scales read (generic proxy): order those reads
        before the loader's next TMA write, then free it."""
        fence_async_shared()
        mbarrier.arrive(self.empty.index(s), count=1)


@aggregate
class QueryBuffers:
    """SLOTS buffers of one request's Q (ROWS query rows x H heads, fp8) and weights (f32), filled in
    boxes of BOX rows; request number qi of a CTA's walk uses buffer qi % SLOTS. Every consumer
    releases it (the empty barrier counts CONSUMERS arrivals)."""

    q: gl.shared_memory_descriptor
    w: gl.shared_memory_descriptor
    full: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    SLOTS: gl.constexpr
    BOX: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, q, w, full, empty, SLOTS, BOX):
        self.q = q
        self.w = w
        self.full = full
        self.empty = empty
        self.SLOTS = gl.constexpr(SLOTS)
        self.BOX = gl.constexpr(BOX)

    @gluon.jit
    def fill(self, qi, first_row, q_desc, w_desc):
        """Loader: Q rows first_row.. of the launch (whole boxes: rows past the request's next_n belong
        to the next request, or lie past the tensor and come zero-filled, and are never used)."""
        ROWS: gl.constexpr = self.w.shape[1]
        H: gl.constexpr = self.w.shape[2]
        D: gl.constexpr = self.q.shape[2]
        s = qi % self.SLOTS
        mbarrier.wait(self.empty.index(s), ((qi // self.SLOTS) & 1) ^ 1)
        mbarrier.expect(self.full.index(s), ROWS * H * (D + 4))
        for r in gl.static_range(0, ROWS, self.BOX):
            row = (first_row + r).to(gl.int32)
            bar = self.full.index(s)
            tma.async_copy_global_to_shared(q_desc, [row * H, 0], bar, self.q.index(s).slice(r * H, self.BOX * H))
            tma.async_copy_global_to_shared(w_desc, [row, 0], bar, self.w.index(s).slice(r, self.BOX))

    @gluon.jit
    def wait(self, qi):
        """Consumer: wait until request qi's Q and weights have landed; their buffers."""
        s = qi % self.SLOTS
        mbarrier.wait(self.full.index(s), (qi // self.SLOTS) & 1)
        return self.q.index(s), self.w.index(s)

    @gluon.jit
    def release(self, qi):
        """Consumer: weights were read from shared memory (generic proxy) before the buffer is refilled."""
        fence_async_shared()
        mbarrier.arrive(self.empty.index(qi % self.SLOTS), count=1)


@aggregate
class LogitsLaunch:
    """Everything both partitions read: descriptors, pointers, scalars, the two buffers, the shape."""

    q_desc: tma.tensor_descriptor
    w_desc: tma.tensor_descriptor
    kv_desc: tma.tensor_descriptor
    sc_desc: tma.tensor_descriptor
    ctx_ptr: gl.tensor
    table_ptr: gl.tensor
    out_ptr: gl.tensor
    ranges_ptr: gl.tensor
    blocks_ptr: gl.tensor
    pages_ptr: gl.tensor
    table_stride: gl.tensor
    out_stride: gl.tensor
    max_context_len: gl.tensor
    ring: KVRing
    queries: QueryBuffers
    NEXT_N: gl.constexpr
    H: gl.constexpr
    BLOCK: gl.constexpr
    CONSUMERS: gl.constexpr
    GROUPS: gl.constexpr  # config.chunk_groups
    SLOT_COLUMNS: gl.constexpr  # config.slot_columns
    RESIDENT_WEIGHTS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, descs, ptrs, scalars, ring, queries, NEXT_N, H, BLOCK, CONSUMERS, GROUPS, SLOT_COLUMNS,
                 RESIDENT_WEIGHTS):  # fmt: skip
        self.q_desc, self.w_desc, self.kv_desc, self.sc_desc = descs
        self.ctx_ptr, self.table_ptr, self.out_ptr, self.ranges_ptr, self.blocks_ptr, self.pages_ptr = ptrs
        self.table_stride, self.out_stride, self.max_context_len = scalars
        self.ring = ring
        self.queries = queries
        self.NEXT_N = gl.constexpr(NEXT_N)
        self.H = gl.constexpr(H)
        self.BLOCK = gl.constexpr(BLOCK)
        self.CONSUMERS = gl.constexpr(CONSUMERS)
        self.GROUPS = gl.constexpr(GROUPS)
        self.SLOT_COLUMNS = gl.constexpr(SLOT_COLUMNS)
        self.RESIDENT_WEIGHTS = gl.constexpr(RESIDENT_WEIGHTS)

    @gluon.jit
    def cta_range(self):
        """This CTA's share of the schedule: from (request b0, block off0) to before (b1, off1)."""
        pid = gl.program_id(0)
        start = self.ranges_ptr + 2 * pid
        return gl.load(start), gl.load(start + 1), gl.load(start + 2), gl.load(start + 3)

    @gluon.jit
    def request_blocks(self, b, b0, off0, b1, off1):
        """Blocks [lo, hi) of request b inside this CTA's range (b in [b0, b1]; b1 may be the end, B)."""
        lo = gl.where(b == b0, off0, 0)
        owned = gl.load(self.blocks_ptr + b, mask=b < b1, other=0)
        return lo, gl.where(b == b1, off1, owned)


@gluon.jit
def _lane(values, lanes, k):
    """Element k of a vector spread over the warp's lanes (a shuffle, no memory)."""
    return gl.sum(gl.where(lanes == k, values, 0), axis=0)


@gluon.jit
def _load_partition(a):
    lanes = gl.arange(0, 32, layout=_lane_layout())
    first_ids = gl.load(a.pages_ptr + gl.program_id(0) * 32 + lanes)  # alongside the range: no dependent read
    b0, off0, b1, off1 = a.cta_range()
    it = 0
    qi = 0
    for b in range(b0, b1 + 1):
        lo, hi = a.request_blocks(b, b0, off0, b1, off1)
        count = hi - lo
        if count > 0:
            row = a.table_ptr + b * a.table_stride + lo
            if b == b0:
                ids = first_ids
            else:
                ids = gl.load(row + lanes, mask=lanes < count, other=0)
            a.ring.fill(it, _lane(ids, lanes, 0), a.kv_desc, a.sc_desc)  # before Q: see the module docstring
            a.queries.fill(qi, b * a.NEXT_N, a.q_desc, a.w_desc)
            qi += 1
            for k in range(1, gl.minimum(count, 32)):
                a.ring.fill(it + k, _lane(ids, lanes, k), a.kv_desc, a.sc_desc)
            for g in range(32, count, 32):
                ids = gl.load(row + g + lanes, mask=g + lanes < count, other=0)
                for k in range(gl.minimum(count - g, 32)):
                    a.ring.fill(it + g + k, _lane(ids, lanes, k), a.kv_desc, a.sc_desc)
            it += count


@gluon.jit
def _chunk_weights(w_tile, FIRST: gl.constexpr, ROWS: gl.constexpr, H: gl.constexpr):
    """A chunk's weights from shared memory, in the layout of its accumulator's columns."""
    chunk = w_tile.reshape([w_tile.shape[0] * H]).slice(FIRST * H, ROWS * H)
    return chunk.load(gl.SliceLayout(0, _mma_layout(ROWS * H)))


@gluon.jit
def _resident_weights(a, w_tile):
    """Every chunk's weights, read once per request when they stay in registers (else an empty tuple)."""
    GROUPS: gl.constexpr = a.GROUPS
    weights = ()
    if a.RESIDENT_WEIGHTS:
        for g in gl.static_range(len(GROUPS)):
            for i in gl.static_range(_group_size(GROUPS, g)):
                weights = weights + (_chunk_weights(w_tile, _chunk(GROUPS, g, i, 0), _chunk(GROUPS, g, i, 1), a.H),)
    return weights


@gluon.jit
def _row_contexts(a, b):
    """The request's context length per query row, read once per request: inside the block loop the
    compiler would re-load them after every logits store (the pointers may alias)."""
    ctxs = ()
    for r in gl.static_range(a.NEXT_N):
        ctxs = ctxs + (gl.load(a.ctx_ptr + b * a.NEXT_N + r),)
    return ctxs


@gluon.jit
def _zero_accumulator(BLOCK: gl.constexpr, COLUMNS: gl.constexpr):
    return gl.zeros([BLOCK, COLUMNS], gl.float32, _mma_layout(COLUMNS))


@gluon.jit
def _fresh_slots(a):
    """The accumulator slots' first values (overwritten by the first MMA: use_acc=False)."""
    SLOT_COLUMNS: gl.constexpr = a.SLOT_COLUMNS
    slots = ()
    for i in gl.static_range(len(SLOT_COLUMNS)):
        slots = slots + (_zero_accumulator(a.BLOCK, SLOT_COLUMNS[i]),)
    return slots


@gluon.jit
def _epilogue(a, acc, w, scale, ctxs, out_rows, blk, FIRST: gl.constexpr, ROWS: gl.constexpr):
    """relu(S) * w, summed over heads per query row, times the k scale; -inf past the row's context.

    The head sum of a chunk's row r runs over the accumulator's columns [r * H, (r + 1) * H): a
    `where` on the column index, which the compiler folds per register (each thread's columns are
    known at compile time), so every column is added once.
    """
    layout: gl.constexpr = _mma_layout(ROWS * a.H)
    x = gl.maximum(acc, 0.0) * w[None, :]
    pos = blk * a.BLOCK + gl.arange(0, a.BLOCK, layout=gl.SliceLayout(1, layout))
    inside = pos < a.max_context_len
    k_scale = gl.convert_layout(scale, gl.SliceLayout(1, layout))
    for r in gl.static_range(ROWS):
        if FIRST + r < a.NEXT_N:
            if ROWS == 1:
                logits = gl.sum(x, axis=1)
            else:
                cols = gl.arange(0, ROWS * a.H, layout=gl.SliceLayout(0, layout))
                logits = gl.sum(gl.where((cols // a.H == r)[None, :], x, 0.0), axis=1)
            logits = gl.where(pos < ctxs[FIRST + r], logits * k_scale, float("-inf"))
            gl.store(out_rows + (FIRST + r) * a.out_stride + pos, logits, mask=inside)


@gluon.jit
def _issue_chunk(a, k_tile, q_tile, slots, GROUP: gl.constexpr, CHUNK: gl.constexpr):
    """Chunk CHUNK of group GROUP: its async MMA `K [64, D] @ Q_rows^T`, into its accumulator slot (or a fresh one)."""
    GROUPS: gl.constexpr = a.GROUPS
    FIRST: gl.constexpr = _chunk(GROUPS, GROUP, CHUNK, 0)
    ROWS: gl.constexpr = _chunk(GROUPS, GROUP, CHUNK, 1)
    SLOT: gl.constexpr = _chunk(GROUPS, GROUP, CHUNK, 2)
    if SLOT >= 0:
        seed = slots[SLOT]
    else:
        seed = _zero_accumulator(a.BLOCK, ROWS * a.H)
    q_view = q_tile.slice(FIRST * a.H, ROWS * a.H).permute((1, 0))
    return warpgroup_mma(k_tile, q_view, seed, use_acc=False, is_async=True)


@gluon.jit
def _finish_chunk(
    a, acc, s, scale, w_tile, weights, ctxs, out_rows, blk, slots, GROUP: gl.constexpr, CHUNK: gl.constexpr
):
    """Chunk CHUNK of group GROUP once its MMA is done: free the KV slot after the block's last MMA, then the
    epilogue; the accumulator goes back to its slot for the next block."""
    GROUPS: gl.constexpr = a.GROUPS
    FIRST: gl.constexpr = _chunk(GROUPS, GROUP, CHUNK, 0)
    ROWS: gl.constexpr = _chunk(GROUPS, GROUP, CHUNK, 1)
    SLOT: gl.constexpr = _chunk(GROUPS, GROUP, CHUNK, 2)
    if GROUP == len(GROUPS) - 1:
        if CHUNK == _group_size(GROUPS, GROUP) - 1:
            a.ring.release(s)
    if a.RESIDENT_WEIGHTS:
        w = weights[_chunk(GROUPS, GROUP, CHUNK, 3)]
    else:
        w = _chunk_weights(w_tile, FIRST, ROWS, a.H)
    _epilogue(a, acc, w, scale, ctxs, out_rows, blk, FIRST, ROWS)
    if SLOT >= 0:
        slots = slots[:SLOT] + (acc,) + slots[SLOT + 1 :]
    return slots


@gluon.jit
def _score_block(a, item, blk, q_tile, w_tile, weights, ctxs, out_rows, slots):
    """One KV item: each chunk group's MMAs are issued together, then finished in order (chunk c's
    epilogue overlaps chunks c+1.. on the tensor cores)."""
    GROUPS: gl.constexpr = a.GROUPS
    s = a.ring.wait(item)
    k_tile = a.ring.tiles.index(s)
    FIRST_COLUMNS: gl.constexpr = _chunk(GROUPS, 0, 0, 1) * a.H
    scale = a.ring.scales.index(s).reshape([a.BLOCK]).load(gl.SliceLayout(1, _mma_layout(FIRST_COLUMNS)))
    for g in gl.static_range(len(GROUPS)):
        mmas = ()
        for i in gl.static_range(_group_size(GROUPS, g)):
            mmas = mmas + (_issue_chunk(a, k_tile, q_tile, slots, g, i),)
        for i in gl.static_range(_group_size(GROUPS, g)):
            acc = warpgroup_mma_wait(_group_size(GROUPS, g) - 1 - i, deps=(mmas[i],))
            slots = _finish_chunk(a, acc, s, scale, w_tile, weights, ctxs, out_rows, blk, slots, g, i)
    return slots


@gluon.jit
def _consumer_partition(a, CONSUMER: gl.constexpr):
    b0, off0, b1, off1 = a.cta_range()
    it = 0
    qi = 0
    for b in range(b0, b1 + 1):
        lo, hi = a.request_blocks(b, b0, off0, b1, off1)
        count = hi - lo
        if count > 0:
            q_tile, w_tile = a.queries.wait(qi)
            ctxs = _row_contexts(a, b)
            weights = _resident_weights(a, w_tile)
            out_rows = a.out_ptr + (b * a.NEXT_N).to(gl.int64) * a.out_stride
            slots = _fresh_slots(a)
            for j in range((CONSUMER - it % a.CONSUMERS + a.CONSUMERS) % a.CONSUMERS, count, a.CONSUMERS):
                slots = _score_block(a, it + j, lo + j, q_tile, w_tile, weights, ctxs, out_rows, slots)
            a.queries.release(qi)
            qi += 1
            it += count


@gluon.jit(do_not_specialize=["table_stride", "out_stride", "max_context_len"])
def paged_mqa_logits_gluon_kernel(
    q_desc, w_desc, kv_desc, sc_desc, ctx_ptr, table_ptr, out_ptr, ranges_ptr, blocks_ptr, pages_ptr,
    table_stride, out_stride, max_context_len,
    NEXT_N: gl.constexpr, H: gl.constexpr, D: gl.constexpr, BLOCK: gl.constexpr, Q_ROWS: gl.constexpr,
    Q_BOX: gl.constexpr, Q_SLOTS: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, PLAN: gl.constexpr,
    MMA_COLUMNS: gl.constexpr, GROUP_COLUMNS: gl.constexpr, RESIDENT_WEIGHTS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
):  # fmt: skip
    ring = KVRing(
        gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK, D], kv_desc.layout),
        gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK], sc_desc.layout),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        STAGES,
    )
    queries = QueryBuffers(
        gl.allocate_shared_memory(gl.float8e4nv, [Q_SLOTS, Q_ROWS * H, D], q_desc.layout),
        gl.allocate_shared_memory(gl.float32, [Q_SLOTS, Q_ROWS, H], w_desc.layout),
        gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout()),
        Q_SLOTS,
        Q_BOX,
    )
    for i in gl.static_range(STAGES):
        mbarrier.init(ring.full.index(i), count=1)
        mbarrier.init(ring.empty.index(i), count=1)
    for i in gl.static_range(Q_SLOTS):
        mbarrier.init(queries.full.index(i), count=1)
        mbarrier.init(queries.empty.index(i), count=CONSUMERS)
    a = LogitsLaunch(
        (q_desc, w_desc, kv_desc, sc_desc),
        (ctx_ptr, table_ptr, out_ptr, ranges_ptr, blocks_ptr, pages_ptr),
        (table_stride, out_stride, max_context_len),
        ring,
        queries,
        NEXT_N,
        H,
        BLOCK,
        CONSUMERS,
        chunk_groups(NEXT_N, H, PLAN, MMA_COLUMNS, GROUP_COLUMNS),
        slot_columns(NEXT_N, H, PLAN, MMA_COLUMNS, GROUP_COLUMNS),
        RESIDENT_WEIGHTS,
    )
    # One region: consumer 0 is the default partition, consumers 1.. and the loader are workers.
    gl.warp_specialize(
        [(_consumer_partition, (a, c)) for c in (0, 1, 2, 3)[:CONSUMERS]] + [(_load_partition, (a,))],
        [4 for c in (0, 1, 2, 3)[1:CONSUMERS]] + [1],
        [CONSUMER_REGS for c in (0, 1, 2, 3)[1:CONSUMERS]] + [LOADER_REGS],
    )
