"""The step's top-k: the reference selection and its tie-aware comparison (`select`), and the implementations
a timed step runs, each declared once (`registry`): `vllm` (vLLM 0.33's own decode top-k, `vllm_kernels`),
`torch` (a masked copy and `torch.topk`, not vLLM's: `torch_masked`), and our own selections, not vLLM's:
`triton-radix` (`triton_radix`) and `cuda-radix` (`cuda_radix`), a row a CTA, and `cuda-split` (`cuda_split`:
`kernels.split_select`, a row over many CTAs, what `gluon-fused` selects with). Importing the package registers
all five."""

from dsa_lab.topk import cuda_radix, cuda_split, torch_masked, triton_radix, vllm_kernels  # noqa: F401  (register)
from dsa_lab.topk.registry import TopkAvailability, TopkCall, TopkImpl, get_topk, register_topk, topk_names, vllm_topk
from dsa_lab.topk.select import (
    DEFAULT_TOPK,
    MAX_TOPK,
    SelectionAgreement,
    compare_selections,
    topk_in_context,
    topk_per_row,
)

__all__ = [
    "DEFAULT_TOPK",
    "MAX_TOPK",
    "SelectionAgreement",
    "TopkAvailability",
    "TopkCall",
    "TopkImpl",
    "compare_selections",
    "get_topk",
    "register_topk",
    "topk_in_context",
    "topk_names",
    "topk_per_row",
    "vllm_topk",
]
