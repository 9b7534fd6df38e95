"""`cuda-split`: our top-k with each row spread over many CTAs (`csrc/split_select.cu`). Not vLLM's top-k.

Round 14 found a row on one SM bound by issue (`cuda-radix`); this selection gives each CTA one chunk of one
row, counts the top 12 bits of every score's key in two launches that never wait for each other (a histogram
merged through L2 atomics, then a collecting pass whose last CTA a row resolves the threshold bin), and is the
second half of issue 27's fused step (`gluon-fused`). Built on first use (`nvcc_build`) into `build/split_select/`.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from dsa_lab.topk.nvcc_build import CudaSource
from dsa_lab.topk.registry import TopkAvailability, TopkCall, TopkImpl, check_call, register_topk

SPLIT_SELECT = CudaSource("split_select", "DSA_LAB_SPLIT_SELECT")
CHUNKS = (2048, 4096, 8192, 16384, 32768)  # scores a CTA may take, the smallest that keeps the grid within
CTAS_PER_SM = 8  # ... this many CTAs an SM


def chunk_for(rows: int, longest: int, sms: int) -> int:
    """The scores a CTA takes: the smallest of `CHUNKS` whose grid (rows x chunks of the longest row) stays
    within `CTAS_PER_SM` an SM, else the largest. Short steps spread a row wide; long ones keep CTAs few."""
    for chunk in CHUNKS:
        if rows * -(-max(longest, 1) // chunk) <= CTAS_PER_SM * sms:
            return chunk
    return CHUNKS[-1]


def _bind(library: ctypes.CDLL) -> ctypes.CDLL:
    pointer, i32 = ctypes.c_void_p, ctypes.c_int
    library.dsa_split_select.argtypes = [pointer, ctypes.c_int64, pointer, i32, i32, i32, i32, i32, pointer]
    library.dsa_split_select.argtypes += [pointer, pointer, i32, pointer, ctypes.c_char_p, ctypes.c_size_t]
    library.dsa_split_select.restype = i32
    library.dsa_split_select_state_ints.argtypes = [i32]
    library.dsa_split_select_state_ints.restype = i32
    library.dsa_split_select_capacity.argtypes = []
    library.dsa_split_select_capacity.restype = i32
    return library


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


class SplitSelectCall(TopkCall):
    """One step shape's selection: its output, its zeroed state (each call leaves it zero) and candidates."""

    kernel = "cuda split select (a row over many CTAs: count, then collect)"  # recorded with every timed row

    def __init__(self, library: ctypes.CDLL, rows: int, k: int, device: torch.device) -> None:
        self.library, self.rows, self.k = library, rows, k
        self.sms = _sms(device.index if device.index is not None else torch.cuda.current_device())
        self.out = torch.empty((rows, k), dtype=torch.int32, device=device)
        self.state = torch.zeros(library.dsa_split_select_state_ints(rows), dtype=torch.int32, device=device)
        self.capacity = library.dsa_split_select_capacity()
        self.candidates = torch.empty((rows, self.capacity), dtype=torch.int32, device=device)
        self.message = ctypes.create_string_buffer(256)

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        check_call(logits, lengths, self.rows)
        stream = torch.cuda.current_stream(logits.device).cuda_stream
        chunk = chunk_for(self.rows, min(max_seq_len, logits.shape[1]), self.sms)
        status = self.library.dsa_split_select(
            logits.data_ptr(), logits.stride(0), lengths.data_ptr(), self.rows, logits.shape[1], self.k,
            max_seq_len, chunk, self.out.data_ptr(), self.state.data_ptr(), self.candidates.data_ptr(),
            self.capacity, stream, self.message, len(self.message),
        )  # fmt: skip
        if status:
            raise RuntimeError(f"cuda-split: {self.message.value.decode(errors='replace')}")
        return self.out


@register_topk
class CudaSplitTopk(TopkImpl):
    name = "cuda-split"
    label = "our CUDA split select (not vLLM's)"
    runs_on = "a CUDA GPU of compute capability 7.0 or more, with nvcc on PATH for its first use"

    def availability(self, device: torch.device) -> TopkAvailability:
        return SPLIT_SELECT.availability(device, (7, 0), "written for Volta and later")

    def environment(self) -> dict[str, Any]:
        return SPLIT_SELECT.environment()

    def prepare(self, rows: int, width: int, k: int, device: torch.device) -> TopkCall:
        device = torch.device(device)
        return SplitSelectCall(_bind(SPLIT_SELECT.load(device)), rows, k, device)
