"""`cuda-radix`: our own per-row radix select in CUDA (`csrc/row_select.cu`). Not vLLM's top-k.

Issue 27's two-phase design selects from logits that stay in L2; before anything is fused, its selection is
timed alone against vLLM's decode top-k on the same logits. Lab-notes round 14 ruled out Triton for it
(`triton-radix`: `tl.histogram` costs each score the bin count); this one counts in shared memory, a plain
atomic a score, one CTA of 1024 threads a row: 1.3-3.1 times vLLM's on the H100 (round 14), so a measured
baseline for a fused step, not an option. Built on first use (`kernels.nvcc`) into `build/row_select/`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import torch

from dsa_lab.kernels.nvcc import CudaSource
from dsa_lab.topk.registry import TopkAvailability, TopkCall, TopkImpl, check_call, register_topk

ROW_SELECT = CudaSource(Path(__file__).parent / "csrc" / "row_select.cu", "DSA_LAB_ROW_SELECT")


def _bind(library: ctypes.CDLL) -> ctypes.CDLL:
    pointer, i32 = ctypes.c_void_p, ctypes.c_int
    library.dsa_row_select.argtypes = [pointer, ctypes.c_int64, pointer, i32, i32, i32, pointer, pointer]
    library.dsa_row_select.argtypes += [ctypes.c_char_p, ctypes.c_size_t]
    library.dsa_row_select.restype = i32
    return library


class _RowSelectCall(TopkCall):
    kernel = "cuda radix select (one 1024-thread CTA a row, 4 passes)"  # recorded with every timed row

    def __init__(self, library: ctypes.CDLL, rows: int, k: int, device: torch.device) -> None:
        self.library, self.rows, self.k = library, rows, k
        self.out = torch.empty((rows, k), dtype=torch.int32, device=device)
        self.message = ctypes.create_string_buffer(256)

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        check_call(logits, lengths, self.rows)
        stream = torch.cuda.current_stream(logits.device).cuda_stream
        status = self.library.dsa_row_select(
            logits.data_ptr(), logits.stride(0), lengths.data_ptr(), self.rows, logits.shape[1], self.k,
            self.out.data_ptr(), stream, self.message, len(self.message),
        )  # fmt: skip
        if status:
            raise RuntimeError(f"cuda-radix: {self.message.value.decode(errors='replace')}")
        return self.out


@register_topk
class CudaRadixTopk(TopkImpl):
    name = "cuda-radix"
    label = "our CUDA radix select (not vLLM's)"
    runs_on = "a CUDA GPU of compute capability 7.0 or more, with nvcc on PATH for its first use"

    def availability(self, device: torch.device) -> TopkAvailability:
        state = ROW_SELECT.availability(device, (7, 0), "written for Volta and later")
        return TopkAvailability(state.ok, state.reason)

    def environment(self) -> dict[str, Any]:
        return ROW_SELECT.environment()

    def prepare(self, rows: int, width: int, k: int, device: torch.device) -> TopkCall:
        device = torch.device(device)
        return _RowSelectCall(_bind(ROW_SELECT.load(device)), rows, k, device)
