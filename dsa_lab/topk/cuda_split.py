"""`cuda-split`: our selection with each row spread over many CTAs (`kernels.split_select`, what `gluon-fused`
selects with), as a top-k any backend's logits can be timed with. Not vLLM's top-k."""

from __future__ import annotations

from typing import Any

import torch

from dsa_lab.kernels.split_select import SPLIT_SELECT, SplitSelect
from dsa_lab.topk.registry import TopkAvailability, TopkCall, TopkImpl, check_call, register_topk


class _SplitSelectCall(TopkCall):
    kernel = SplitSelect.kernel

    def __init__(self, rows: int, k: int, device: torch.device) -> None:
        self.rows, self.select = rows, SplitSelect(rows, k, device)

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        check_call(logits, lengths, self.rows)
        return self.select(logits, lengths, max_seq_len)


@register_topk
class CudaSplitTopk(TopkImpl):
    name = "cuda-split"
    label = "our CUDA split select (not vLLM's)"
    runs_on = "a CUDA GPU of compute capability 7.0 or more, with nvcc on PATH for its first use"

    def availability(self, device: torch.device) -> TopkAvailability:
        state = SPLIT_SELECT.availability(device, (7, 0), "written for Volta and later")
        return TopkAvailability(state.ok, state.reason)

    def environment(self) -> dict[str, Any]:
        return SPLIT_SELECT.environment()

    def prepare(self, rows: int, width: int, k: int, device: torch.device) -> TopkCall:
        return _SplitSelectCall(rows, k, torch.device(device))
