"""Paged-MQA-logits backends. Importing this package registers every built-in backend, then those of the
files `DSA_LAB_BACKEND_MODULES` names (`kernels.external`; an entry point's only when its name is asked for).

A backend of your own needs only this face: `LogitsBackend` (the descriptor), `register_backend`, `LogitsCall`
(what its `logits` takes: one call in DeepGEMM's convention) and `check_logits_args` / `check_logits_values`
(that convention's checks, `kernels.convention`)."""

from dsa_lab.kernels import (
    deepgemm,  # noqa: F401  (registers "deepgemm"; imports deep_gemm lazily, so never fails here)
    deepgemm_pr340,  # noqa: F401  (registers "deepgemm-pr340": a user's build of DeepGEMM PR #340, if pointed at)
    gluon,  # noqa: F401  (registers "gluon": SM90 only; elsewhere it says why not)
    reference,  # noqa: F401  (registers "reference")
    triton_native,  # noqa: F401  (registers "triton"; without triton it reports itself unavailable)
)
from dsa_lab.kernels.convention import LogitsCall, check_logits_args, check_logits_values
from dsa_lab.kernels.descriptor import Availability, LogitsBackend
from dsa_lab.kernels.external import ExternalBackendError, load_backend_files, load_environment
from dsa_lab.kernels.registry import (
    backend_names,
    baseline_backend,
    family_of,
    fused_backends,
    get_backend,
    modeled_backends,
    preset_backends,
    register_backend,
    vllm_backend,
)

load_environment()

__all__ = [
    "Availability",
    "ExternalBackendError",
    "LogitsBackend",
    "LogitsCall",
    "backend_names",
    "baseline_backend",
    "check_logits_args",
    "check_logits_values",
    "family_of",
    "fused_backends",
    "get_backend",
    "load_backend_files",
    "modeled_backends",
    "preset_backends",
    "register_backend",
    "vllm_backend",
]
