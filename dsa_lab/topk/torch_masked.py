"""`torch`: a masked copy up to the longest context, then `torch.topk`. Not vLLM's top-k.

It runs anywhere torch runs and picks the same sets as `select.topk_per_row` (ties aside), so it is the
labelled stand-in where vLLM's kernels cannot run (a CPU, a GPU before SM90). It moves about three times
the bytes of a kernel that reads each row's prefix once (the copy is written, then read), and on an H200 it
took 10-25 times vLLM's own top-k: a step timed with it is not the step vLLM runs, and says so.
"""

from __future__ import annotations

import torch

from dsa_lab.topk.registry import TopkCall, TopkImpl, register_topk
from dsa_lab.topk.select import topk_in_context


class _MaskedCall(TopkCall):
    kernel = "torch.topk on a masked copy"

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        return topk_in_context(logits, lengths, self.k, min(max_seq_len, logits.shape[1]))


@register_topk
class TorchTopk(TopkImpl):
    name = "torch"
    label = "torch's top-k (not vLLM's)"
    runs_on = "any device torch runs on"

    def environment(self) -> dict[str, object]:
        return {"torch": torch.__version__}

    def prepare(self, rows: int, width: int, k: int, device: torch.device) -> TopkCall:
        return _MaskedCall(k)
