"""What a backend's arithmetic on a platform asks of the harness, decided here and nowhere else.

Two facts per (backend, compute capability major), each with the reason written beside it:

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
from dataclasses import dataclass

import torch

from dsa_lab.errors import check_choice
from dsa_lab.kernels import LogitsBackend, get_backend
from dsa_lab.kernels.deepgemm import SM100_MAJOR

K_SCALE_FORMATS = ("float32", "ue8m0")


@dataclass(frozen=True)
class Numerics:
    """A backend's numerics on one platform: K scale format, tolerance (None: the spec's), why."""

    k_scales: str = "float32"
    tolerance: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        check_choice("k_scales", self.k_scales, K_SCALE_FORMATS)
        if self.tolerance is not None and not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance={self.tolerance!r}: must lie in (0, 1) or be None (the spec's)")

    def check_tolerance(self, spec_tolerance: float) -> tuple[float, str]:
        """The bound a point is checked against, and why: never tighter than the spec's."""
        if self.tolerance is None or self.tolerance <= spec_tolerance:
            return spec_tolerance, "the spec's check_tolerance"
        return self.tolerance, self.reason


DEFAULT = Numerics()

# (backend, compute capability major) -> what its kernel there needs. One line per platform
# whose arithmetic differs from the float32 reference convention; everything else is DEFAULT.
NUMERICS: dict[tuple[str, int], Numerics] = {
    ("deepgemm", SM100_MAJOR): Numerics(
        "ue8m0",
        1e-2,
        "DeepGEMM on SM100 (vLLM 0.33's varlen call): weights and logits are bf16 and the head sum runs in "
        "bf16, about 2e-3 from the float64-exact reference; it reads each K scale as a UE8M0 byte, so the "
        "cache holds power-of-two scales, as vLLM writes it there",
    ),
}


def _capability_major(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def backend_numerics(backend: LogitsBackend | str, device: str | torch.device) -> Numerics:
    """What `backend` needs on `device` (its capability decides); DEFAULT where nothing differs."""
    backend = get_backend(backend) if isinstance(backend, str) else backend
    if not any(name == backend.name for name, _ in NUMERICS):
        return DEFAULT
    device = torch.device(device)
    if not backend.availability(device).ok:  # it does not run here: its points are skipped
        return DEFAULT
    return NUMERICS.get((backend.name, _capability_major(device)), DEFAULT)


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
