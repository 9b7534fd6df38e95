"""What a backend's arithmetic on a platform asks of the harness, decided here and nowhere else.

Two facts per (backend, compute capability major), each with the reason written beside it, declared
by the backend (`LogitsBackend.numerics`) and read here:

- `k_scales`: the format the FP8 cache's per-token K scales must have for the kernel to
  read them exactly: 'float32' (any scale) or 'ue8m0' (a power of two, which the kernel
  reads as its exponent byte). A workload's cache is shared by every backend of the run,
  so that their checks and times compare like with like; it is built 'ue8m0' when any
  backend of the run needs it here (`cache_k_scales`): a power of two is a valid float32
  scale for every other kernel and for the reference. MXFP4 scales are UE8M0 by format.
- `tolerance`: the bound of the harness's one correctness measure (`bench.check`, the
  norm ratio against the float64-exact reference). The spec's `check_tolerance` (1e-3)
  holds unless the kernel's own arithmetic is coarser here; then this value does, and
  every row records which bound it was checked against and why.

A backend with no entry for this device's capability, or not available on this device
(its points are skipped), gets the defaults: float32 scales and the spec's tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsa_lab.errors import probe
from dsa_lab.kernels import LogitsBackend, get_backend
from dsa_lab.kernels.descriptor import DEFAULT_NUMERICS, K_SCALE_FORMATS, Numerics

DEFAULT = DEFAULT_NUMERICS
__all__ = ["DEFAULT", "K_SCALE_FORMATS", "Numerics", "backend_numerics", "cache_k_scales", "numerics_record"]


def _capability_major(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def backend_numerics(backend: LogitsBackend | str, device: str | torch.device) -> Numerics:
    """What `backend` needs on `device` (its capability decides, `LogitsBackend.numerics`); DEFAULT where
    nothing differs."""
    backend = get_backend(backend) if isinstance(backend, str) else backend
    return probe(backend.name, "its numerics", lambda: _numerics(backend, torch.device(device)))


def _numerics(backend: LogitsBackend, device: torch.device) -> Numerics:
    if not backend.numerics:
        return DEFAULT
    if not backend.availability(device).ok:  # it does not run here: its points are skipped
        return DEFAULT
    numerics = backend.numerics.get(_capability_major(device), DEFAULT)
    if not isinstance(numerics, Numerics):
        raise TypeError(f"declares {type(numerics).__name__} for this capability, not a Numerics")
    return numerics


def cache_k_scales(cache_dtype: str, backends: Sequence[str], device: str | torch.device) -> str:
    """The K scale format of a workload's cache, shared by `backends`: 'ue8m0' when any needs it here
    (and always for MXFP4, whose block scales are UE8M0 by format), else 'float32'."""
    if cache_dtype == "mxfp4":
        return "ue8m0"
    needs = {backend_numerics(name, device).k_scales for name in backends}
    return "ue8m0" if "ue8m0" in needs else "float32"


def numerics_record(
    backends: Sequence[str], cache_dtypes: Sequence[str], spec_tolerance: float, device: str | torch.device
) -> dict[str, object]:
    """What a run's provenance records: each backend's scale format and check bound here, and the
    scale format each cache dtype's workloads are built with."""
    per_backend = {}
    for name in backends:
        numerics = backend_numerics(name, device)
        tolerance, reason = numerics.check_tolerance(spec_tolerance)
        per_backend[name] = {"k_scales": numerics.k_scales, "check_tolerance": tolerance, "reason": reason}
    return {
        "backends": per_backend,
        "cache_k_scales": {dtype: cache_k_scales(dtype, backends, device) for dtype in cache_dtypes},
    }
