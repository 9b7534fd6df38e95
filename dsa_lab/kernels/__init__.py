"""Paged-MQA-logits backends. Importing this package registers every backend."""

from dsa_lab.kernels import reference  # noqa: F401  (registers "reference")
from dsa_lab.kernels import deepgemm  # noqa: F401  (registers "deepgemm"; imports deep_gemm lazily, so never fails here)
from dsa_lab.kernels import triton_native  # noqa: F401  (registers "triton"; without triton it reports itself unavailable)
from dsa_lab.kernels.registry import (
    Availability,
    LogitsBackend,
    backend_names,
    baseline_backend,
    get_backend,
    register_backend,
)

__all__ = [
    "Availability",
    "LogitsBackend",
    "backend_names",
    "baseline_backend",
    "get_backend",
    "register_backend",
]
