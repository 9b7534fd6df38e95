"""`triton-radix`: our own per-row radix select in Triton. Not vLLM's top-k: the selection half of a fused step.

Issue 27's two-phase design writes a row's logits where they stay in L2 and selects from them in the same
launch. Before any kernel is fused, this measures the selection alone against vLLM's decode top-k on the same
logits: one program per row reads its first `length` scores three times to fix the k-th score's 32-bit
order-preserving key by digits of 11, 11 and 10 bits (a histogram a pass, `tl.histogram`), then once more to
write the positions above that key and the first of those equal to it, in position order. A row of at most k
tokens writes its positions and -1 after. Four passes over a row: what a fused kernel would have to beat.
"""

from __future__ import annotations

from typing import Any

import torch

from dsa_lab.kernels.jit import interpreter_enabled, interpreter_state, jitted
from dsa_lab.topk.registry import TopkAvailability, TopkCall, TopkImpl, check_call, register_topk

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # the implementation then reports itself unavailable, with this reason
    triton = None
    TRITON_IMPORT_ERROR = f"triton is not importable ({exc})"
else:
    TRITON_IMPORT_ERROR = ""

BLOCK = 4096  # scores a program reads at once
NUM_WARPS = 8


def _radix_topk_kernel(  # noqa: PLR0913  (a kernel's arguments are its signature)
    logits, stride, lengths, out, width, K: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.load(lengths + row).to(tl.int32), width)
    n = tl.maximum(n, 0)
    base = logits + row * stride
    dest = out + row * K
    lanes = tl.arange(0, BLOCK)
    if n <= K:
        for start in range(0, K, BLOCK):
            cols = start + lanes
            tl.store(dest + cols, tl.where(cols < n, cols, -1), mask=cols < K)
    else:
        sign = tl.full((), 0x80000000, tl.uint32)  # keys order as the floats do
        every = tl.full((), 0xFFFFFFFF, tl.uint32)
        prefix = tl.zeros((), tl.uint32)
        remaining = K
        for digit in tl.static_range(3):  # 11, 11 and 10 bits, from the top
            shift = 21 - 11 * digit + digit // 2
            digits = 2047 >> (digit // 2)  # the bits this pass reads (the last: 10)
            high = tl.full((), ((1 << (11 * digit)) - 1) << (32 - 11 * digit), tl.uint32)  # the digits fixed
            hist = tl.zeros((2048,), tl.int32)
            for start in range(0, n, BLOCK):
                cols = start + lanes
                inside = cols < n
                bits = tl.load(base + cols, mask=inside, other=0.0).to(tl.uint32, bitcast=True)
                key = tl.where((bits >> 31) == 1, bits ^ every, bits | sign)
                keep = inside & ((key & high) == prefix)
                hist += tl.histogram(tl.where(keep, (key >> shift) & digits, 0), 2048)
                hist -= tl.where(tl.arange(0, 2048) == 0, tl.sum((~keep).to(tl.int32)), 0)
            above = tl.sum(hist) - tl.cumsum(hist, 0)  # scores of this prefix in a higher bin
            here = (above < remaining) & (above + hist >= remaining)
            chosen = tl.max(tl.where(here, tl.arange(0, 2048), -1))
            remaining -= tl.sum(tl.where(here, above, 0))
            prefix = prefix | (chosen.to(tl.uint32) << shift)
        taken_above = 0
        taken_equal = 0
        for start in range(0, n, BLOCK):
            cols = start + lanes
            inside = cols < n
            bits = tl.load(base + cols, mask=inside, other=0.0).to(tl.uint32, bitcast=True)
            key = tl.where((bits >> 31) == 1, bits ^ every, bits | sign)
            over = inside & (key > prefix)
            equal = inside & (key == prefix)
            slot_over = taken_above + tl.cumsum(over.to(tl.int32), 0) - 1
            slot_equal = taken_equal + tl.cumsum(equal.to(tl.int32), 0) - 1
            tl.store(dest + slot_over, cols, mask=over)
            tl.store(dest + (K - remaining) + slot_equal, cols, mask=equal & (slot_equal < remaining))
            taken_above += tl.sum(over.to(tl.int32))
            taken_equal += tl.sum(equal.to(tl.int32))


class _RadixCall(TopkCall):
    kernel = "triton radix select (one program a row, 4 passes)"

    def __init__(self, rows: int, k: int, device: torch.device) -> None:
        self.k = k
        self.out = torch.empty(rows, k, dtype=torch.int32, device=device)

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        check_call(logits, lengths, self.out.shape[0])
        rows, width = logits.shape
        jitted(_radix_topk_kernel)[(rows,)](
            logits, logits.stride(0), lengths, self.out, width, K=self.k, BLOCK=BLOCK, num_warps=NUM_WARPS
        )
        return self.out


@register_topk
class TritonRadixTopk(TopkImpl):
    name = "triton-radix"
    label = "our Triton radix select (not vLLM's)"
    runs_on = "a CUDA GPU, or the CPU through Triton's interpreter"

    def availability(self, device: torch.device) -> TopkAvailability:
        if triton is None:
            return TopkAvailability(False, TRITON_IMPORT_ERROR)
        device = torch.device(device)
        if device.type == "cpu" or interpreter_enabled():
            state = interpreter_state()
            return TopkAvailability(state.ok, state.reason)
        if device.type != "cuda" or not torch.cuda.is_available():
            return TopkAvailability(False, f"needs a CUDA device or the Triton interpreter on CPU, got {device}")
        return TopkAvailability(True, "")

    def environment(self) -> dict[str, Any]:
        return {"triton_version": getattr(triton, "__version__", None), "block": BLOCK, "num_warps": NUM_WARPS}

    def prepare(self, rows: int, width: int, k: int, device: torch.device) -> TopkCall:
        return _RadixCall(rows, k, torch.device(device))
