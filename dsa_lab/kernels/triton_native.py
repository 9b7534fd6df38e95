"""Our own Triton paged MQA-logits kernel, native for every next_n from 1 to 16.

Each program takes one request b and a range of KV blocks. Per 64-token block it
loads the K tile once and scores it against *all* next_n query rows of b:
`S = K [64, D] @ Q_b^T [D, n*H]` on FP8 tensor cores (fp32 accumulation), then
relu, times the weights, a sum over heads and the per-token k scale, so flattening's
re-reads of the cache never happen. Q_b stays resident in shared memory for the
whole range. Rows are scored in chunks of whole query rows whose count is a power
of two (`chunk_plan`, e.g. n=3, H=64 -> 2+1 rows = 128+64 dot columns), so odd
next_n waste no tensor-core work on padding.

The kernel is jitted on first use, not at import, so the TRITON_INTERPRET in force
then decides compiled vs interpreted (`kernels.jit`). docs/triton_kernel.md has the
design, the config space and the H200 measurements behind `choose_config`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dsa_lab.batch.cache import BLOCK_SIZE
from dsa_lab.errors import check_choice, check_range
from dsa_lab.kernels.chunks import binary_chunks
from dsa_lab.kernels.convention import LogitsCall, check_native_call, num_sms, ready_native_call
from dsa_lab.kernels.descriptor import RULE, Availability, ConfigSpace, KernelFit, LogitsBackend, ModelTraits
from dsa_lab.kernels.jit import compile_ahead, interpreter_enabled, interpreter_state, jitted
from dsa_lab.kernels.registry import register_backend

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # the backend then reports itself unavailable, with this reason
    triton = None
    TRITON_IMPORT_ERROR = f"triton is not importable ({exc})"
else:
    TRITON_IMPORT_ERROR = ""

LOG = logging.getLogger(__name__)
MAX_NEXT_N = 16
MIN_CUDA_CAPABILITY = (8, 9)  # tl.dot on float8e4nv needs Ada or Hopper
# Targets `compile_for` takes: each compiles with Triton 3.8 on the CPU (sm_80 has no e4m3 dot); sm_90 and
# sm_100 are also checked by tests/test_triton_aot.py.
AOT_ARCHS = (89, 90, 100, 103, 120)
NUM_WARPS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class KernelConfig:
    """One point of the config space (docs/triton_kernel.md).

    `dot_rows`: most q rows (query rows x heads) one tl.dot takes; `resident_weights`:
    keep the weights in registers over the range (n*H/4 registers a thread at 4 warps)
    or reload them (from L1) each step; `blocks_per_program`: KV blocks a program walks
    (0: `blocks_per_program` picks it from the batch).
    """

    dot_rows: int = 256
    num_warps: int = 4
    num_stages: int = 5
    resident_weights: bool = True
    blocks_per_program: int = 0

    def __post_init__(self) -> None:
        rows = check_range("dot_rows", self.dot_rows, 16, 2048)
        if rows & (rows - 1):
            raise ValueError(f"dot_rows={rows}: must be a power of two (tl.dot shapes are)")
        check_choice("num_warps", self.num_warps, NUM_WARPS)
        check_range("num_stages", self.num_stages, 1, 16)
        check_choice("resident_weights", self.resident_weights, (True, False))
        check_range("blocks_per_program", self.blocks_per_program, 0, 1 << 16)

    def describe(self) -> str:
        bpp = self.blocks_per_program or "auto"
        weights = "resident" if self.resident_weights else "reload"
        return f"rows{self.dot_rows}/w{self.num_warps}/s{self.num_stages}/{weights}/bpp{bpp}"


# The interpreter runs numpy: one config, no tuning (one big dot per step is fastest there).
INTERPRETER_CONFIG = KernelConfig(dot_rows=256, num_warps=4, num_stages=1, blocks_per_program=4)


SM100_MAJOR = 10


def choose_config(next_n: int, heads: int, head_dim: int, capability: tuple[int, int] | None = None) -> KernelConfig:
    """A fixed rule on the q rows n*H, from the H200 sweeps at H=64, D=128 (docs/triton_kernel.md).

    Measured best at B=128, L=64K: n=1, 2 -> one dot, 5 stages, weights resident; n=3 ->
    three N=64 dots with reloaded weights (124 registers: 4 CTAs an SM); n=4 -> one N=256
    dot, 7 stages; n=8 -> two N=256 dots, weights reloaded. Other (n, H, D) follow by n*H.

    `capability` is the target's (major, minor): the wrapper passes that of q's device; None:
    the current CUDA device's, or SM90's rule without a GPU. On SM100 (major 10) weights stay
    resident only up to 128 q rows: n=4's resident weights (64 registers a thread) beside the
    score tile read out of tensor memory spill there (sm_100 AOT, Triton 3.8: 255 registers
    and a 272-byte stack), reloading them takes 218 registers and no stack. Not timed (no
    SM100 here).
    """
    del head_dim  # D=64 was not timed; it takes the D=128 choice
    if capability is None:
        capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
    q_rows = next_n * heads
    if q_rows <= 128:
        return KernelConfig(dot_rows=256, num_stages=5, resident_weights=True)
    if q_rows <= 192:
        return KernelConfig(dot_rows=64, num_stages=5, resident_weights=False)
    if q_rows <= 256:
        return KernelConfig(dot_rows=256, num_stages=7, resident_weights=capability[0] != SM100_MAJOR)
    return KernelConfig(dot_rows=256, num_stages=5, resident_weights=False)


def chunk_plan(next_n: int, heads: int, dot_rows: int) -> tuple[tuple[int, int], ...]:
    """(first query row, query rows) of each tl.dot, checked: the shared plan (`chunks.binary_chunks`) at
    `dot_rows // heads` rows a chunk (tl.dot shapes are powers of two)."""
    next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
    heads = check_range("heads", heads, 1, 1 << 10)
    dot_rows = check_range("dot_rows", dot_rows, 1, 1 << 12)
    per_dot = max(1, dot_rows // heads)
    if per_dot & (per_dot - 1):
        raise ValueError(f"dot_rows={dot_rows}: dot_rows/heads must be a power of two (heads={heads})")
    return binary_chunks(next_n, per_dot)


def blocks_per_program(batch: int, col_blocks: int, num_sms: int) -> int:
    """KV blocks per program: at least two programs an SM, 4 to 32 blocks each.

    Measured (H200): at B=16, L=8K 16 blocks (128 programs) ran 15-40% slower than 4-8;
    at B=128, L=64K 16, 32 and 64 blocks were within 5% (n=1 slowest at 64). Fewer
    blocks per program repeat the Q load and the pipeline fill more often.
    """
    batch = check_range("batch", batch, 1, 1 << 20)
    col_blocks = check_range("col_blocks", col_blocks, 0, 1 << 24)
    num_sms = check_range("num_sms", num_sms, 1, 1 << 12)
    return max(4, min(32, -(-batch * col_blocks // (2 * num_sms))))


def _paged_mqa_logits_kernel(
    q_ptr,  # fp8 [B, n, H, D] contiguous
    kv_ptr,  # fp8 view of the fused cache: block p starts at byte p * 64 * (D + 4)
    w_ptr,  # f32 [B * n, H]
    ctx_ptr,  # i32 [B, n]
    table_ptr,  # i32 [B, table_stride]
    out_ptr,  # f32 [B * n, out_stride]
    table_stride,
    out_stride,
    max_context_len,
    col_blocks,  # ceil(max_context_len / 64): output column blocks per row
    blocks_per_prog,
    NEXT_N: tl.constexpr,
    N_POW2: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    PLAN: tl.constexpr,  # ((first row, rows), ...) from chunk_plan
    RESIDENT_WEIGHTS: tl.constexpr,  # keep weights in registers, or reload them each step
):
    req = tl.program_id(0).to(tl.int64)
    lo = tl.program_id(1) * blocks_per_prog
    hi = tl.minimum(lo + blocks_per_prog, col_blocks)
    row0 = req * NEXT_N  # the request's first row of q, weights, lens and out
    col_hi = tl.minimum(hi * BLOCK, max_context_len)  # this program's columns end here
    table_row = table_ptr + req * table_stride

    rows_all = tl.arange(0, N_POW2)
    ctx_all = tl.load(ctx_ptr + row0 + rows_all, mask=rows_all < NEXT_N, other=0)
    scored_hi = tl.minimum(hi, tl.cdiv(tl.max(ctx_all, axis=0), BLOCK))

    # Q, weights and context lens of every chunk: loaded once, resident over the range
    # (Triton keeps the loop-invariant Q operands in shared memory).
    qs = ()
    ws = ()
    ctxs = ()
    dims = tl.arange(0, D)
    for c in tl.static_range(len(PLAN)):
        q_rows = tl.arange(0, PLAN[c][1] * H)
        first_row = (row0 + PLAN[c][0]) * H
        qs = qs + (tl.load(q_ptr + (first_row + q_rows)[:, None] * D + dims[None, :]),)
        if RESIDENT_WEIGHTS:
            ws = ws + (tl.load(w_ptr + first_row + q_rows),)
        ctxs = ctxs + (tl.load(ctx_ptr + row0 + PLAN[c][0] + tl.arange(0, PLAN[c][1])),)

    tokens = tl.arange(0, BLOCK)
    block_bytes = BLOCK * (D + 4)
    scale_offsets = BLOCK * D + tokens * 4  # a block's f32 scales follow its BLOCK x D values
    # Triton's pipeliner prefetches only loads that feed a dot (the page ids and K), so
    # the scales get a manual software pipeline: one block ahead, their page two ahead.
    page_next = tl.load(table_row + lo, mask=lo < scored_hi, other=0).to(tl.int64)
    scale_next = tl.load((kv_ptr + page_next * block_bytes + scale_offsets).to(tl.pointer_type(tl.float32)))
    page_next = tl.load(table_row + lo + 1, mask=lo + 1 < scored_hi, other=0).to(tl.int64)
    for blk in tl.range(lo, scored_hi):
        page = tl.load(table_row + blk).to(tl.int64)
        k = tl.load(kv_ptr + page * block_bytes + tokens[:, None] * D + dims[None, :])
        k_scale = scale_next
        scale_next = tl.load((kv_ptr + page_next * block_bytes + scale_offsets).to(tl.pointer_type(tl.float32)))
        page_next = tl.load(table_row + blk + 2, mask=blk + 2 < scored_hi, other=0).to(tl.int64)
        pos = blk * BLOCK + tokens
        for c in tl.static_range(len(PLAN)):
            q_rows = tl.arange(0, PLAN[c][1] * H)
            if RESIDENT_WEIGHTS:
                w = ws[c]
            else:
                w = tl.load(w_ptr + (row0 + PLAN[c][0]) * H + q_rows)
            s = tl.dot(k, tl.trans(qs[c]))  # [BLOCK, rows * H] on FP8 tensor cores, fp32 accumulation
            s = tl.maximum(s, 0.0) * w[None, :]
            logits = tl.sum(tl.reshape(s, (BLOCK, PLAN[c][1], H)), axis=2) * k_scale[:, None]
            logits = tl.where(pos[:, None] < ctxs[c][None, :], logits, float("-inf"))
            out_rows = row0 + PLAN[c][0] + tl.arange(0, PLAN[c][1])
            tl.store(out_ptr + out_rows[None, :] * out_stride + pos[:, None], logits, mask=pos[:, None] < col_hi)

    # Blocks past the request's longest context: every row is -inf there.
    out_rows = row0 + rows_all
    ninf = tl.full((N_POW2, BLOCK), float("-inf"), tl.float32)
    for blk in range(tl.maximum(scored_hi, lo), hi):
        pos = blk * BLOCK + tokens
        mask = (rows_all[:, None] < NEXT_N) & (pos[None, :] < col_hi)
        tl.store(out_ptr + out_rows[:, None] * out_stride + pos[None, :], ninf, mask=mask)


# The kernel's runtime arguments as `_launch` passes them: the types and the 16-byte alignment an
# ahead-of-time compile assumes (the three strides are multiples of 16 at the study's shapes).
POINTER_ARGS = {
    "q_ptr": "*fp8e4nv",
    "kv_ptr": "*fp8e4nv",
    "w_ptr": "*fp32",
    "ctx_ptr": "*i32",
    "table_ptr": "*i32",
    "out_ptr": "*fp32",
}
INT_ARGS = ("table_stride", "out_stride", "max_context_len", "col_blocks", "blocks_per_prog")
ALIGNED_INT_ARGS = ("table_stride", "out_stride", "max_context_len")


def kernel_constexprs(next_n: int, heads: int, head_dim: int, config: KernelConfig) -> dict[str, Any]:
    """The compile-time arguments of one shape and config: what `_launch` and `compile_for` pass."""
    return {
        "NEXT_N": next_n,
        "N_POW2": triton.next_power_of_2(next_n),
        "H": heads,
        "D": head_dim,
        "BLOCK": BLOCK_SIZE,
        "PLAN": chunk_plan(next_n, heads, config.dot_rows),
        "RESIDENT_WEIGHTS": config.resident_weights,
    }


def compile_for(arch: int, next_n: int, heads: int, head_dim: int, config: KernelConfig) -> Any:
    """Compile the kernel ahead of time for `sm_<arch>` (no GPU needed, `jit.compile_ahead`); Triton's
    CompiledKernel. Every argument is checked first (`arch` among `AOT_ARCHS`), so Triton never sees one
    it would fail on with an error of its own."""
    check_choice("arch", arch, AOT_ARCHS)
    check_range("next_n", next_n, 1, MAX_NEXT_N)
    check_choice("heads", heads, TritonNativeBackend.heads)
    check_choice("head_dim", head_dim, TritonNativeBackend.head_dims)
    if not isinstance(config, KernelConfig):
        raise ValueError(f"config={config!r:.60}: expected a KernelConfig")

    return compile_ahead(
        _paged_mqa_logits_kernel,
        arch,
        {**POINTER_ARGS, **dict.fromkeys(INT_ARGS, "i32")},
        kernel_constexprs(next_n, heads, head_dim, config),
        {"num_warps": config.num_warps, "num_stages": config.num_stages},
        aligned={*POINTER_ARGS, *ALIGNED_INT_ARGS},
    )


@functools.cache
def _log_choice(next_n: int, heads: int, head_dim: int, config: KernelConfig) -> None:
    """Say once per shape which config the rule picked (timing records carry `describe()`)."""
    LOG.info("triton logits: next_n=%d H=%d D=%d -> %s", next_n, heads, head_dim, config.describe())


def paged_mqa_logits_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    config: KernelConfig | None = None,
    check_values: bool = True,
    out: torch.Tensor | None = None,
    *,
    cache_dtype: str,
) -> torch.Tensor:
    """DeepGEMM's calling convention; every output element is written (-inf past each context).

    `check_values=False` skips the host-syncing scan of lens and block ids (for timing
    loops, whose launches were checked once before); without the scan an id outside the
    cache makes the kernel read outside it. `out` lets a test pass a poisoned output to
    prove that every element is written.
    """
    backend = TritonNativeBackend()
    call = LogitsCall(q, kv_cache, weights, context_lens, block_table, max_context_len, cache_dtype=cache_dtype)
    check_native_call(backend, call, check_values=check_values, out=out, max_next_n=MAX_NEXT_N, block_size=BLOCK_SIZE)
    if config is not None and not isinstance(config, KernelConfig):
        raise ValueError(f"config: expected a KernelConfig or None, got {type(config).__name__}")
    call = ready_native_call(backend, call, check_values=check_values)
    if config is None:
        _, next_n, heads, dim = call.q.shape
        capability = torch.cuda.get_device_capability(q.device) if q.device.type == "cuda" else None
        config = INTERPRETER_CONFIG if interpreter_enabled() else choose_config(next_n, heads, dim, capability)
        _log_choice(next_n, heads, dim, config)
    out, _ = _launch(call, config, out)
    return out


def _launch(call: LogitsCall, config: KernelConfig, out: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
    """Launch a checked call of contiguous tensors (`ready_native_call`'s); also return Triton's compiled kernel
    (its registers and SASS are `cubin.resource_counts`')."""
    q, kv_cache, weights, context_lens, block_table, max_context_len = call.args
    batch, next_n, heads, dim = q.shape
    if out is None:
        out = torch.empty(batch * next_n, max_context_len, dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, None
    col_blocks = -(-max_context_len // BLOCK_SIZE)
    bpp = config.blocks_per_program
    if bpp <= 0:
        sms = num_sms(q.device.index or 0) if q.device.type == "cuda" else 132
        bpp = blocks_per_program(batch, col_blocks, sms)
    grid = (batch, -(-col_blocks // bpp))
    kernel = jitted(_paged_mqa_logits_kernel)[grid](
        q,
        kv_cache.view(torch.float8_e4m3fn),
        weights,
        context_lens,
        block_table,
        out,
        block_table.stride(0),
        out.stride(0),
        max_context_len,
        col_blocks,
        bpp,
        **kernel_constexprs(next_n, heads, dim, config),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out, kernel


@register_backend
class TritonNativeBackend(LogitsBackend):
    """Our Triton kernel: any next_n natively, each KV tile read once per request."""

    name = "triton"
    family = "dsa_lab"
    label = "Triton (ours)"
    marker = "s"
    color = "#9467bd"
    presets = ("smoke", "h200-full", "sm100", "h200-serving:spot-check")  # the serving study: a few points
    packages: ClassVar[tuple[str, ...]] = ("triton",)
    resume_fields: ClassVar[tuple[str, ...]] = ("triton",)
    cleans_tail: ClassVar[bool] = True
    # Any rows natively, float32 logits, relu and a weighted FMA a head; each program takes a fixed run of one
    # request's KV blocks (`blocks_per_program`); Nsight Compute on the H200: 2.3 % of flatten's re-reads reach DRAM.
    model_traits: ClassVar[Mapping[str, ModelTraits]] = dict.fromkeys(
        ("sm90", "sm100"), ModelTraits(1, 4, 2.0, program_blocks=blocks_per_program, flatten_dram_share=0.023)
    )
    # Fitted on the shipped H200 study sweep (tests/test_model.py names the run, fits again and holds these to it).
    model_fits: ClassVar[Mapping[str, KernelFit]] = {
        "native": KernelFit(0.85, 0.525, 6.0, 1.5, 0.7),
        "flatten": KernelFit(0.65, 0.35, 4.5, 3.0, 0.5),
        "atom": KernelFit(0.7, 0.675, 5.0, 1.5, 0.7),
    }
    config_space: ClassVar[ConfigSpace] = ConfigSpace(KernelConfig, choose_config, paged_mqa_logits_triton)
    aot_archs: ClassVar[tuple[int, ...]] = AOT_ARCHS

    def compile_ahead(self, arch: int, next_n: int, heads: int, head_dim: int, config: str = RULE) -> tuple[str, Any]:
        """The rule's config for that target (`choose_config` at its capability), with `config`'s knobs set."""
        knobs = self.config_space.parse(self.name, config)
        chosen = dataclasses.replace(choose_config(next_n, heads, head_dim, (arch // 10, arch % 10)), **knobs)
        return chosen.describe(), compile_for(arch, next_n, heads, head_dim, chosen)

    def availability(self, device: torch.device) -> Availability:
        if triton is None:
            return Availability(False, TRITON_IMPORT_ERROR)
        device = torch.device(device)
        if device.type == "cpu":
            return interpreter_state()
        if device.type != "cuda" or not torch.cuda.is_available():
            return Availability(False, f"needs a CUDA device or the Triton interpreter on CPU, got {device}")
        if interpreter_enabled():  # interpreted on GPU tensors: slow, but it must be consistent
            return interpreter_state()
        capability = torch.cuda.get_device_capability(device)
        if capability < MIN_CUDA_CAPABILITY:
            return Availability(
                False, f"FP8 tl.dot needs compute capability >= {MIN_CUDA_CAPABILITY}, this GPU has {capability}"
            )
        return Availability(True, "")
