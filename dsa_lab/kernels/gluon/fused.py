"""`gluon-fused`: issue 27's decode step as one backend whose unit is the step (`fuses_topk`).

Gluon's logits kernel writes a launch's scores into a scratch the size of its scored columns, and our split
select (`kernels.split_select`: every row over many CTAs, a histogram merged through L2 atomics, then a collecting
pass) picks each row's best k from it in the same stream: three launches, no host synchronisation, one CUDA
graph. At B <= 16 the scratch is a few MB (3.6 MB on mixed 2K-128K contexts at next_n = 3), small enough to stay
in the H100's 50 MB L2 between the launches (whether any line reaches HBM was not measured); at serving batches
it is not. This is the L2 hand-off design of lab notes round 15, not yet the logits-and-histogram kernel the
round's next step names. Its picks are what vLLM's `SparseIndexerTopk` writes: int32 `[rows, k]`, -1 past a short
row, in no order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from dsa_lab.errors import BackendUnavailable
from dsa_lab.kernels.convention import LogitsCall
from dsa_lab.kernels.descriptor import RULE, Availability, KernelFit, ModelTraits
from dsa_lab.kernels.gluon.launch import GluonNativeBackend
from dsa_lab.kernels.registry import register_backend
from dsa_lab.kernels.split_select import SPLIT_SELECT, SplitSelect


@register_backend
class GluonFusedBackend(GluonNativeBackend):
    """Gluon's logits, then our split select over them while they sit in L2: the step in one call."""

    name = "gluon-fused"
    label = "Gluon + our split select (fused step)"
    marker = "*"
    color = "#17becf"
    presets = ("step",)
    fuses_topk = True
    # The performance model times a logits kernel; this backend's unit is the step, so it models nothing (and its
    # logits kernel is `gluon`'s, modeled there).
    model_traits: ClassVar[Mapping[str, ModelTraits]] = {}
    model_fits: ClassVar[Mapping[str, KernelFit]] = {}

    def __init__(self) -> None:
        self._selects: dict[tuple[int, int, int], SplitSelect] = {}

    def availability(self, device: torch.device) -> Availability:
        logits = super().availability(device)
        if not logits.ok:
            return logits
        select = SPLIT_SELECT.availability(device, (9, 0), "its logits kernel is SM90's")
        return Availability(select.ok, select.reason)

    def environment(self, requested: bool = True) -> dict[str, Any]:
        return {**super().environment(requested), "split_select": SPLIT_SELECT.environment()}

    def compile_ahead(self, arch: int, next_n: int, heads: int, head_dim: int, config: str = RULE) -> tuple[str, Any]:
        """Both halves for `sm_<arch>`: Gluon's kernel (Triton's CompiledKernel, returned) and the split select's
        library (nvcc on PATH), named in the description."""
        described, kernel = super().compile_ahead(arch, next_n, heads, head_dim, config)
        try:
            library = SPLIT_SELECT.compile(str(arch))
        except FileNotFoundError as err:
            raise BackendUnavailable(f"backend {self.name!r} compiles its select with nvcc: {err}") from None
        return f"{described} + {library.name}", kernel

    def step(self, call: LogitsCall, *, topk: int, max_seq_len: int) -> torch.Tensor:
        if call.q.device.type != "cuda":  # on CUDA each half checks itself (no per-call source hashing)
            raise BackendUnavailable(
                f"backend {self.name!r} unavailable on {call.q.device}: {self.availability(call.q.device).reason}"
            )
        logits = self.logits(call)
        rows = logits.shape[0]
        device = logits.device
        key = (device.index if device.index is not None else torch.cuda.current_device(), rows, topk)
        if key not in self._selects:  # made once a step shape: its state is zeroed then and left zero by each call
            self._selects[key] = SplitSelect(rows, topk, device)
        return self._selects[key](logits, call.context_lens.reshape(-1), max_seq_len)
