"""Our selection with each row spread over many CTAs (`csrc/split_select.cu`): the second half of issue 27's fused
step (`gluon/fused.py`), and a top-k of its own (`topk.cuda_split`, `cuda-split`). Not vLLM's top-k.

Round 14 found a row on one SM bound by issue (`cuda-radix`); here each CTA takes one chunk of one row, in two
launches that never wait for each other: every score counted into a histogram merged through L2 atomics finds the
bin of the row's k-th score, then each CTA stages what lies above and inside that bin and writes it out with one
atomic a list, and the last CTA of the row picks what the bin owes exactly (lab notes round 15). Built on first use
(`nvcc`) into `build/split_select/`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from dsa_lab.kernels.convention import num_sms
from dsa_lab.kernels.nvcc import CudaSource

SPLIT_SELECT = CudaSource(Path(__file__).parent / "csrc" / "split_select.cu", "DSA_LAB_SPLIT_SELECT")
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
    library.dsa_split_select.argtypes += [pointer, pointer, pointer, pointer, ctypes.c_char_p, ctypes.c_size_t]
    library.dsa_split_select.restype = i32
    library.dsa_split_select_state_ints.argtypes, library.dsa_split_select_state_ints.restype = [i32], i32
    library.dsa_split_select_capacity.argtypes, library.dsa_split_select_capacity.restype = [], i32
    return library


class SplitSelect:
    """One step shape's selection, `(logits, lengths, max_seq_len) -> int32 [rows, k]` (-1 past a short row, in no
    order): its output, its state (zeroed here; each call leaves it zero), its candidates and `fallbacks` (rows
    whose threshold bin overflowed the candidates, so selected from the whole row, summed over calls), made once."""

    kernel = "cuda split select (a row over many CTAs: count, then collect)"  # recorded with every timed row

    def __init__(self, rows: int, k: int, device: torch.device) -> None:
        self.library, self.rows, self.k = _bind(SPLIT_SELECT.load(device)), rows, k
        self.sms = num_sms(device.index if device.index is not None else torch.cuda.current_device())
        self.out = torch.empty((rows, k), dtype=torch.int32, device=device)
        self.state = torch.zeros(self.library.dsa_split_select_state_ints(rows), dtype=torch.int32, device=device)
        capacity = self.library.dsa_split_select_capacity()
        self.candidates = torch.empty((rows, capacity), dtype=torch.int32, device=device)
        self.fallbacks = torch.zeros(1, dtype=torch.int32, device=device)
        self.message = ctypes.create_string_buffer(256)

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        """Checked by the caller (`topk.registry.check_call`'s contract): float32 rows with contiguous columns,
        int32 lengths, on this device."""
        stream = torch.cuda.current_stream(logits.device).cuda_stream
        chunk = chunk_for(self.rows, min(max_seq_len, logits.shape[1]), self.sms)
        status = self.library.dsa_split_select(
            logits.data_ptr(), logits.stride(0), lengths.data_ptr(), self.rows, logits.shape[1], self.k,
            max_seq_len, chunk, self.out.data_ptr(), self.state.data_ptr(),
            self.candidates.data_ptr(), self.fallbacks.data_ptr(), stream, self.message, len(self.message),
        )  # fmt: skip
        if status:
            raise RuntimeError(f"split select: {self.message.value.decode(errors='replace')}")
        return self.out
