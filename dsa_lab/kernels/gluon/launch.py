"""The Gluon paged MQA-logits backend for Hopper (SM90): checks, the schedule, descriptors and the launch.

The device code is `kernel.py` (warp-specialised, persistent, TMA loads, over the
work-balanced schedule of `schedule.py`), the config space and its resources `config.py`.
Columns past a request's last 64-token block are left unwritten, as DeepGEMM leaves them
(`cleans_tail = False`), so the step's time does not grow with `max_context_len`;
`clean_tail=True` writes -inf there too (`schedule.fill_tail`, a second launch). Gluon has no
interpreter: `tests/test_gluon_aot.py` (and `dsa-lab env --aot`) compiles the kernel for sm_90 on a
CPU machine, and on the H200 `tests/test_gluon_gpu.py` holds it to the reference at the edge cases and
`dsa-lab bench --backend gluon` at every point it times (docs/triton_kernel.md, "Developing a kernel").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from dsa_lab.batch.cache import BLOCK_SIZE
from dsa_lab.errors import UnsupportedShape, check_choice
from dsa_lab.kernels.convention import LogitsCall, check_native_call, num_sms, ready_native_call
from dsa_lab.kernels.descriptor import RULE, Availability, ConfigSpace, KernelFit, LogitsBackend, ModelTraits
from dsa_lab.kernels.gluon.config import (
    MAX_NEXT_N,
    GluonConfig,
    check_config_fits,
    choose_gluon_config,
    consumer_registers,
    launch_registers,
    query_box_rows,
    query_rows,
)
from dsa_lab.kernels.gluon.schedule import MAX_PROGRAMS, BalancedSchedule, balanced_schedule, fill_tail
from dsa_lab.kernels.jit import compile_ahead
from dsa_lab.kernels.registry import register_backend

try:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from dsa_lab.kernels.gluon.kernel import paged_mqa_logits_gluon_kernel
except ImportError as exc:  # the backend then reports itself unavailable, with this reason
    paged_mqa_logits_gluon_kernel = None
    GLUON_IMPORT_ERROR = f"triton.experimental.gluon (Hopper) is not importable ({exc})"
else:
    GLUON_IMPORT_ERROR = ""

REQUIRED_CAPABILITY = (9, 0)  # wgmma and setmaxnreg: sm_90a only (SM100 has tcgen05 instead)
COMPILE_ARCHS = (90,)

# The kernel's runtime arguments after its four descriptors, with the types the launch gives them;
# the AOT compile (`compile_for`, which the AOT test and `dsa-lab env --aot` run) types them from these.
POINTER_ARGS = {
    "ctx_ptr": "*i32", "table_ptr": "*i32", "out_ptr": "*fp32", "ranges_ptr": "*i32", "blocks_ptr": "*i32",
    "pages_ptr": "*i32",
}  # fmt: skip
INT_ARGS = ("table_stride", "out_stride", "max_context_len")


def kernel_constexprs(next_n: int, heads: int, head_dim: int, config: GluonConfig) -> dict[str, Any]:
    """The compile-time arguments of one launch (shared with tests/test_gluon_aot.py)."""
    return {
        "NEXT_N": next_n,
        "H": heads,
        "D": head_dim,
        "BLOCK": BLOCK_SIZE,
        "Q_ROWS": query_rows(next_n, heads, config),
        "Q_BOX": query_box_rows(next_n, heads, config),
        "Q_SLOTS": config.query_slots,
        "STAGES": config.stages,
        "CONSUMERS": config.consumers,
        "PLAN": config.plan,
        "MMA_COLUMNS": config.mma_columns,
        "GROUP_COLUMNS": config.group_columns,
        "RESIDENT_WEIGHTS": config.resident_weights,
        "CONSUMER_REGS": consumer_registers(config),
        "LOADER_REGS": config.loader_registers,
    }


def launch_options(config: GluonConfig) -> dict[str, int]:
    return {"num_warps": 4, "maxnreg": launch_registers(config.consumers)}


def descriptor_blocks(next_n: int, heads: int, head_dim: int, config: GluonConfig) -> dict[str, tuple[str, list[int]]]:
    """Element type and box of each TMA descriptor: Q and weights (`query_box_rows` query rows), a K tile, its scales."""
    rows = query_box_rows(next_n, heads, config)
    return {
        "q_desc": ("fp8e4nv", [rows * heads, head_dim]),
        "w_desc": ("fp32", [rows, heads]),
        "kv_desc": ("fp8e4nv", [BLOCK_SIZE, head_dim]),
        "sc_desc": ("fp32", [1, BLOCK_SIZE]),
    }


def descriptor_layouts(next_n: int, heads: int, head_dim: int, config: GluonConfig) -> dict[str, Any]:
    """Shared-memory layouts: 128-byte swizzle for Q and K (wgmma operands), none for the f32 vectors
    (weights and scales are read back as flat vectors)."""
    from triton.experimental.gluon import language as gl

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
    """Compile the kernel ahead of time for `sm_<arch>` (no GPU needed); Triton's CompiledKernel.

    `arch` must be 90: wgmma and setmaxnreg exist on sm_90a only.
    """
    check_choice("arch", arch, COMPILE_ARCHS)
    if not isinstance(config, GluonConfig):
        raise ValueError(f"config: expected a GluonConfig, got {type(config).__name__}")
    check_config_fits(config, next_n, heads, head_dim)
    if paged_mqa_logits_gluon_kernel is None:
        raise RuntimeError(GLUON_IMPORT_ERROR)
    constexprs = kernel_constexprs(next_n, heads, head_dim, config)
    signature = kernel_signature(next_n, heads, head_dim, config)
    return compile_ahead(paged_mqa_logits_gluon_kernel, arch, signature, constexprs, launch_options(config), gluon=True)


def availability(device: torch.device) -> Availability:
    """Can the Gluon kernel run on `device`? Gluon has no interpreter, and wgmma is SM90-only."""
    if paged_mqa_logits_gluon_kernel is None:
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
            False,
            f"the Gluon kernel uses wgmma (sm_90a only): needs compute capability {REQUIRED_CAPABILITY}, "
            f"this GPU has {capability}",
        )
    return Availability(True, "")


def check_gluon_config(q: torch.Tensor, config: GluonConfig | None) -> None:
    """A given config must be a GluonConfig whose ring and Q buffers fit in shared memory at q's shape."""
    if config is None:
        return
    if not isinstance(config, GluonConfig):
        raise ValueError(f"config: expected a GluonConfig or None, got {type(config).__name__}")
    _, next_n, heads, dim = q.shape
    check_config_fits(config, next_n, heads, dim)


def check_schedule(schedule: BalancedSchedule | None, context_lens: torch.Tensor) -> None:
    """A given schedule must be a BalancedSchedule made for this batch on this device (host checks only)."""
    if schedule is None:
        return
    if not isinstance(schedule, BalancedSchedule):
        raise ValueError(
            f"schedule: expected a BalancedSchedule (GluonNativeBackend.schedule) or None, got {type(schedule).__name__}"
        )
    batch = context_lens.shape[0]
    if schedule.blocks.shape != (batch,) or schedule.ranges.device != context_lens.device:
        raise ValueError(
            f"schedule: made for {schedule.blocks.shape[0]} requests on {schedule.ranges.device}; "
            f"this launch has {batch} on {context_lens.device}"
        )
    if not 1 <= schedule.programs <= MAX_PROGRAMS:
        raise ValueError(f"schedule: {schedule.programs} programs; allowed 1 to {MAX_PROGRAMS}")


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
    schedule: BalancedSchedule | None = None,
    clean_tail: bool = False,
) -> torch.Tensor:
    """DeepGEMM's calling convention. Every column of a request's scored blocks is written (-inf past
    each row's context); later columns only with `clean_tail=True`.

    `check_values=False` skips the host-syncing scan of lens and block ids (timed loops, whose
    launches were checked once before). `out` lets a check pass a poisoned output. `schedule`
    (`GluonNativeBackend.schedule`) is made here when not given, on the device, with no sync.
    """
    backend = GluonNativeBackend()
    call = LogitsCall(q, kv_cache, weights, context_lens, block_table, max_context_len, cache_dtype=cache_dtype)
    check_native_call(backend, call, check_values=check_values, out=out, max_next_n=MAX_NEXT_N, block_size=BLOCK_SIZE)
    check_gluon_config(q, config)
    check_choice("clean_tail", clean_tail, (False, True))
    check_schedule(schedule, context_lens)
    call = ready_native_call(backend, call, check_values=check_values)
    batch, next_n, heads, dim = call.q.shape
    if batch * -(-max_context_len // BLOCK_SIZE) >= 1 << 31:  # the schedule counts blocks in int32
        raise UnsupportedShape(
            f"max_context_len={max_context_len}: {batch} requests x {-(-max_context_len // BLOCK_SIZE)} blocks "
            f"exceed the schedule's 2**31 blocks"
        )
    config = config or choose_gluon_config(next_n, heads, dim)
    if schedule is None:
        schedule = balanced_schedule(call.context_lens, call.block_table, num_sms(q.device.index or 0))
    out = launch(call, config, schedule, out)[0]
    if clean_tail:
        fill_tail(out, schedule, next_n)
    return out


def launch(
    call: LogitsCall, config: GluonConfig, schedule: BalancedSchedule, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, Any]:
    """Launch a checked call of contiguous tensors (`ready_native_call`'s), one CTA per range of the schedule; also
    return Triton's compiled kernel."""
    q, kv_cache, weights, context_lens, block_table, max_context_len = call.args
    batch, next_n, heads, dim = q.shape
    if out is None:
        out = torch.empty(batch * next_n, max_context_len, dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, None
    blocks = descriptor_blocks(next_n, heads, dim, config)
    layouts = descriptor_layouts(next_n, heads, dim, config)
    num_blocks = kv_cache.shape[0]
    rows_per_page = BLOCK_SIZE + BLOCK_SIZE * 4 // dim  # 64 K rows, then the scales' bytes as rows of D
    fp8 = kv_cache.view(torch.float8_e4m3fn).view(num_blocks * rows_per_page, dim)
    f32 = kv_cache.view(num_blocks, BLOCK_SIZE * (dim + 4)).view(torch.float32)
    q2 = q.view(batch * next_n * heads, dim)
    descriptors = [
        TensorDescriptor.from_tensor(tensor, blocks[name][1], layouts[name])
        for name, tensor in (("q_desc", q2), ("w_desc", weights), ("kv_desc", fp8), ("sc_desc", f32))
    ]
    kernel = paged_mqa_logits_gluon_kernel[(schedule.programs,)](
        *descriptors,
        context_lens,
        block_table,
        out,
        schedule.ranges,
        schedule.blocks,
        schedule.pages,
        block_table.stride(0),
        out.stride(0),
        max_context_len,
        **kernel_constexprs(next_n, heads, dim, config),
        **launch_options(config),
    )
    return out, kernel


@register_backend
class GluonNativeBackend(LogitsBackend):
    """Our warp-specialised Gluon kernel (SM90): any next_n natively, each KV tile read once per
    request, the KV blocks balanced over the SMs whatever the spread of the contexts."""

    name = "gluon"
    family = "dsa_lab"
    label = "Gluon (ours)"
    marker = "P"
    color = "#bcbd22"
    presets = ("smoke", "h200-full", "step")  # SM90 only
    packages: ClassVar[tuple[str, ...]] = ("triton",)
    resume_fields: ClassVar[tuple[str, ...]] = ("triton",)
    cleans_tail: ClassVar[bool] = False  # DeepGEMM's convention: columns past a request's last block are left
    # Any rows natively, float32 logits, relu and a weighted FMA a head; the schedule balances the real KV blocks.
    model_traits: ClassVar[Mapping[str, ModelTraits]] = {"sm90": ModelTraits(1, 4, 2.0)}
    # Fitted on the shipped H200 sweep that timed it (issue 13's; tests/test_model.py names it and fits again).
    model_fits: ClassVar[Mapping[str, KernelFit]] = {
        "native": KernelFit(0.8, 0.5, 8.0, 8.0),
        "flatten": KernelFit(0.95, 0.3, 7.0, 8.0),
    }
    config_space: ClassVar[ConfigSpace] = ConfigSpace(GluonConfig, choose_gluon_config, paged_mqa_logits_gluon)
    aot_archs: ClassVar[tuple[int, ...]] = COMPILE_ARCHS

    def compile_ahead(self, arch: int, next_n: int, heads: int, head_dim: int, config: str = RULE) -> tuple[str, Any]:
        chosen = self.config_space.config(self.config_space.parse(self.name, config), next_n, heads, head_dim)
        return chosen.describe(), compile_for(arch, next_n, heads, head_dim, chosen)

    def availability(self, device: torch.device) -> Availability:
        return availability(device)

    def schedule(self, context_lens: torch.Tensor, block_size: int, block_table: torch.Tensor) -> BalancedSchedule:
        """The work-balanced split of this launch's KV blocks over the SMs, with each CTA's first page
        ids, made on the device."""
        if block_size != BLOCK_SIZE:
            raise ValueError(f"block_size={block_size!r}: backend 'gluon' allows {(BLOCK_SIZE,)}")
        table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
        return balanced_schedule(context_lens.contiguous(), table, num_sms(context_lens.device.index or 0))
