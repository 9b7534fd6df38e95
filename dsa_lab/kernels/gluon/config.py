"""The Gluon kernel's config space and the arithmetic of its resources, in plain Python.

Nothing here needs Triton: the host checks a config, the shared memory and registers it takes,
and how query rows become MMA chunks, on any machine. `kernel.py` reads the same functions
at compile time (through `triton.constexpr_function`), so host and kernel agree by construction.
docs/triton_kernel.md (rounds 5-11) holds the H200 measurements behind `choose_gluon_config`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsa_lab.batch.cache import BLOCK_SIZE  # KV tokens a page holds, and the M of every MMA
from dsa_lab.errors import check_choice, check_range
from dsa_lab.kernels.chunks import binary_chunks
from dsa_lab.kernels.chunks import constexpr_function as _constexpr_function  # the kernel calls these at compile time

MAX_NEXT_N = 16
SUPPORTED_HEADS = (32, 64)
SUPPORTED_HEAD_DIMS = (64, 128)
PLAN_MODES = ("pair", "row", "pad")
MMA_COLUMNS = (64, 128, 256)
GROUP_COLUMNS = (64, 128, 192, 256, 384, 512)
LOADER_REGISTERS = (24, 32, 40, 48, 56, 64, 72, 80, 96)
REGISTERS_PER_SM = 65536
MAX_SHARED_BYTES = 227 * 1024


@dataclass(frozen=True)
class GluonConfig:
    """One point of the config space, checked when it is made.

    `consumers`: MMA + epilogue warpgroups (2 to 4); `stages`: KV ring slots (a multiple of
    `consumers`); `plan`: how query rows become power-of-two MMA chunks (`PLAN_MODES`);
    `mma_columns`: the most columns (query rows x H) one MMA takes; `group_columns`: the most
    columns a consumer has in flight (chunks are issued in groups of at most this many columns;
    within a group chunk c's epilogue overlaps chunks c+1.. on the tensor cores);
    `resident_weights`: keep a request's weights in registers, or reload them from shared memory
    per block; `loader_registers`: setmaxnreg of the load warp's warpgroup (the consumers share
    the rest of the register file); `query_slots`: Q buffers (2 lets the loader fill the next
    request's Q while the consumers still read this one's).
    """

    consumers: int = 2
    stages: int = 8
    plan: str = "pair"
    mma_columns: int = 256
    group_columns: int = 256
    resident_weights: bool = True
    loader_registers: int = 40
    query_slots: int = 1

    def __post_init__(self) -> None:
        check_range("consumers", self.consumers, 2, 4)
        check_range("stages", self.stages, 2, 32)
        check_choice("plan", self.plan, PLAN_MODES)
        check_choice("mma_columns", self.mma_columns, MMA_COLUMNS)
        check_choice("group_columns", self.group_columns, GROUP_COLUMNS)
        check_choice("resident_weights", self.resident_weights, (False, True))
        check_choice("loader_registers", self.loader_registers, LOADER_REGISTERS)
        check_range("query_slots", self.query_slots, 1, 2)
        if self.stages % self.consumers:
            raise ValueError(f"stages={self.stages}: must be a multiple of consumers={self.consumers}")

    def describe(self) -> str:
        weights = "resident" if self.resident_weights else "reload"
        return (
            f"gluon/c{self.consumers}/s{self.stages}/{self.plan}/mma{self.mma_columns}/"
            f"grp{self.group_columns}/{weights}/lr{self.loader_registers}/q{self.query_slots}"
        )


def check_shape(next_n: int, heads: int, head_dim: int) -> None:
    """The shapes the kernel is written for, each named when outside."""
    check_range("next_n", next_n, 1, MAX_NEXT_N)
    check_choice("heads", heads, SUPPORTED_HEADS)
    check_choice("head_dim", head_dim, SUPPORTED_HEAD_DIMS)


@_constexpr_function
def chunk_plan(next_n: int, heads: int, mode: str, mma_columns: int) -> tuple[tuple[int, int], ...]:
    """(first query row, query rows) of each MMA, unchecked: the kernel calls this at compile time.

    `pair`: the shared plan (`chunks.binary_chunks`) at mma_columns / H rows a chunk (n=3, H=64:
    2 + 1, i.e. N=128 + N=64). `row`: one N=H chunk a row. `pad`: next_n rounded up to a power of
    two, in chunks of at most mma_columns / H rows, so the last chunk may hold rows >= next_n,
    computed on unloaded shared memory and never stored (n=3: one N=256 MMA).
    """
    per_mma = max(1, mma_columns // heads)
    if mode == "row":
        return tuple((row, 1) for row in range(next_n))
    if mode == "pad":
        size = min(per_mma, 1 << (next_n - 1).bit_length())
        return tuple((first, size) for first in range(0, next_n, size))
    return binary_chunks(next_n, per_mma)


@_constexpr_function
def _issue_groups(
    next_n: int, heads: int, mode: str, mma_columns: int, group_columns: int
) -> list[list[tuple[int, int]]]:
    """Consecutive chunks issued together: at most `group_columns` columns a group, at least one chunk."""
    groups: list[list[tuple[int, int]]] = [[]]
    columns = 0
    for first, rows in chunk_plan(next_n, heads, mode, mma_columns):
        if groups[-1] and columns + rows * heads > group_columns:
            groups.append([])
            columns = 0
        groups[-1].append((first, rows))
        columns += rows * heads
    return groups


@_constexpr_function
def slot_columns(next_n: int, heads: int, mode: str, mma_columns: int, group_columns: int) -> tuple[int, ...]:
    """Columns of accumulator slot i: the widest chunk that any issue group puts in position i."""
    widths: list[int] = []
    for group in _issue_groups(next_n, heads, mode, mma_columns, group_columns):
        for i, chunk in enumerate(group):  # (no nested unpacking: Triton 3.6 walks this function's AST)
            rows = chunk[1]
            if i == len(widths):
                widths.append(0)
            widths[i] = max(widths[i], rows * heads)
    return tuple(widths)


@_constexpr_function
def chunk_groups(
    next_n: int, heads: int, mode: str, mma_columns: int, group_columns: int
) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """The chunks in issue groups, each (first row, rows, accumulator slot, chunk index in the plan).

    Position i of every group reuses accumulator slot i from block to block (its input is
    ignored: use_acc=False), so no zero tensor is made per MMA; a chunk narrower than the slot's
    widest user gets a fresh accumulator (slot -1).
    """
    widths = slot_columns(next_n, heads, mode, mma_columns, group_columns)
    groups, index = [], 0
    for group in _issue_groups(next_n, heads, mode, mma_columns, group_columns):
        chunks = []
        for i, chunk in enumerate(group):
            first, rows = chunk
            chunks.append((first, rows, i if rows * heads == widths[i] else -1, index))
            index += 1
        groups.append(tuple(chunks))
    return tuple(groups)


def gluon_chunk_plan(next_n: int, heads: int, mode: str, mma_columns: int = 256) -> tuple[tuple[int, int], ...]:
    """`chunk_plan` with every argument checked (rows a power of two, N = rows * H <= mma_columns)."""
    check_range("next_n", next_n, 1, MAX_NEXT_N)
    check_choice("heads", heads, SUPPORTED_HEADS)
    check_choice("plan", mode, PLAN_MODES)
    check_choice("mma_columns", mma_columns, MMA_COLUMNS)
    return chunk_plan(next_n, heads, mode, mma_columns)


def query_rows(next_n: int, heads: int, config: GluonConfig) -> int:
    """Query rows of one Q buffer: the plan's rows rounded up to a power of two (>= next_n for `pad`)."""
    rows = max(first + size for first, size in gluon_chunk_plan(next_n, heads, config.plan, config.mma_columns))
    return 1 << (rows - 1).bit_length()


def query_box_rows(next_n: int, heads: int, config: GluonConfig) -> int:
    """Query rows one TMA box of Q takes (a box has at most 256 rows of H heads)."""
    return min(query_rows(next_n, heads, config), max(1, 256 // heads))


def shared_bytes(next_n: int, heads: int, head_dim: int, config: GluonConfig) -> int:
    """Shared memory the kernel allocates (Q slots, the KV ring, barriers), before alignment."""
    check_shape(next_n, heads, head_dim)
    if not isinstance(config, GluonConfig):
        raise ValueError(f"config: expected a GluonConfig, got {type(config).__name__}")
    q_bytes = config.query_slots * query_rows(next_n, heads, config) * heads * (head_dim + 4)
    ring = config.stages * (BLOCK_SIZE * head_dim + BLOCK_SIZE * 4)
    return q_bytes + ring + 8 * 2 * (config.stages + config.query_slots)


def consumer_registers(config: GluonConfig) -> int:
    """setmaxnreg budget of one consumer warpgroup: the SM's registers less the loader's warpgroup."""
    per_thread = (REGISTERS_PER_SM // 128 - config.loader_registers) // config.consumers
    return min(240, per_thread // 8 * 8)


def launch_registers(consumers: int) -> int:
    """maxnreg at launch: (consumers + 1) warpgroups must fit the SM's register file."""
    return min(255, REGISTERS_PER_SM // (128 * (consumers + 1)) // 8 * 8)


def choose_gluon_config(next_n: int, heads: int, head_dim: int) -> GluonConfig:
    """A fixed rule on the query columns n * H, from the H200 rounds 5-11 (docs/triton_kernel.md).

    Registers decide: a consumer holds the fp32 accumulators of the columns it has in flight
    (N / 2 registers a thread) and, resident, a request's weights (n * H / 4). Measured best at
    B=128, L=64K, H=64: n <= 2 -> three consumers, one MMA; n=3 -> two consumers, N=128 then N=64
    one at a time; n=4 -> two consumers, two N=128 MMAs in flight; n >= 5 -> three consumers,
    N=128 chunks one at a time, weights re-read from shared memory. A 12-slot ring at n = 3, 4
    (round 9). Two Q buffers up to n * H = 256 (round 11: a CTA of the balanced schedule spans
    requests, and one buffer drains the ring at each boundary: n = 3 3 % and mixed n = 2 3 % faster);
    one above, where the second buffer's 67 KB cost 3-6 % (n = 5, 8; less shared memory leaves L1 the
    room the reloaded weights need, presumably). The same reading gave round 12's six ring slots above
    n * H = 256 (nine before): n = 8 3 % faster, n = 5-7 0-1 %; three slots starve the ring (+1-15 %).
    """
    check_shape(next_n, heads, head_dim)
    columns = next_n * heads
    if columns <= 128:
        return GluonConfig(consumers=3, stages=9, plan="pair", mma_columns=256, group_columns=256, query_slots=2)
    if columns <= 192:
        return GluonConfig(consumers=2, stages=12, plan="pair", mma_columns=128, group_columns=128, query_slots=2)
    if columns <= 256:
        return GluonConfig(consumers=2, stages=12, plan="pair", mma_columns=128, group_columns=256, query_slots=2)
    return GluonConfig(consumers=3, stages=6, plan="pair", mma_columns=128, group_columns=128, resident_weights=False)


def check_config_fits(config: GluonConfig, next_n: int, heads: int, head_dim: int) -> None:
    """A given config must fit shared memory at this shape (ValueError naming the config and the bound)."""
    used = shared_bytes(next_n, heads, head_dim, config)
    if used > MAX_SHARED_BYTES:
        raise ValueError(
            f"config={config.describe()}: needs {used} B of shared memory at next_n={next_n}, H={heads}, "
            f"D={head_dim}; at most {MAX_SHARED_BYTES} (use fewer stages or query_slots=1)"
        )
