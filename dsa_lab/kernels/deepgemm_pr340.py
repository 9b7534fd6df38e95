"""DeepGEMM PR #340 (SM90 FP8 paged MQA logits for next_n = 3), a backend beside the vendored DeepGEMM.

On Hopper, DeepGEMM's released kernel takes next_n in {1, 2, 4}; the open PR #340 adds 3 (a
two-row MMA plus a one-row tail) on top of the DeepGEMM mainline it branched from, which has
{1, 2} and no two-CTA next_n = 4. It is not released, so this project never ships or builds
it: a user builds it (docs/triton_kernel.md, "DeepGEMM PR #340") and points `DSA_LAB_DEEPGEMM_PR340`
at the folder holding that `deep_gemm` package. The package is imported under a private name,
so it lives in one process beside the vendored `deep_gemm` and both can be timed in one run.
Its origin (repository, commit, what it was built with) is read from the `ORIGIN` file the
builder writes beside its `__init__.py` and goes into every run's provenance.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from dsa_lab.kernels.deepgemm import SM90_MAJOR, SM90_TRAITS, DeepGemmBackend
from dsa_lab.kernels.registry import ModelTraits, register_backend

ENV_VAR = "DSA_LAB_DEEPGEMM_PR340"
ORIGIN_FILE = "ORIGIN"
MODULE_NAME = "dsa_lab_deepgemm_pr340"  # never `deep_gemm`: the vendored build owns that name
PR340_SM90_NATIVE = (1, 2, 3)


def import_pr340(root: str | None = None) -> tuple[ModuleType | None, str]:
    """The PR #340 build under `root` (default: $DSA_LAB_DEEPGEMM_PR340) and its origin, or None and why not."""
    root = os.environ.get(ENV_VAR, "") if root is None else root
    if not root:
        return None, f"{ENV_VAR} is not set (the folder holding a deep_gemm package built from DeepGEMM PR #340)"
    package = Path(root) / "deep_gemm"
    init = package / "__init__.py"
    if not init.is_file():
        return None, f"{ENV_VAR}={root}: no deep_gemm/__init__.py there"
    if MODULE_NAME in sys.modules:
        module = sys.modules[MODULE_NAME]
    else:
        spec = importlib.util.spec_from_file_location(MODULE_NAME, init, submodule_search_locations=[str(package)])
        assert spec is not None and spec.loader is not None  # a file location always has a loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[MODULE_NAME] = module
        try:
            spec.loader.exec_module(module)
        except Exception as err:  # ImportError, or an extension built for another torch
            del sys.modules[MODULE_NAME]
            return None, f"{ENV_VAR}={root}: importing deep_gemm failed: {type(err).__name__}: {err}"
    origin_file = package / ORIGIN_FILE
    origin = origin_file.read_text().strip() if origin_file.is_file() else f"unrecorded build ({init.parent})"
    return module, origin


@register_backend
class DeepGemmPR340Backend(DeepGemmBackend):
    """DeepGEMM PR #340's `fp8_fp4_paged_mqa_logits` on SM90: next_n in {1, 2, 3} natively."""

    name = "deepgemm-pr340"
    label = "DeepGEMM PR #340"
    marker = "X"
    color = "#e377c2"
    in_vllm = False  # no vLLM release calls it
    presets = ("h200-full",)  # SM90 only; its points are skipped (with the reason) where no build is pointed at
    supported_majors: ClassVar[tuple[int, ...]] = (SM90_MAJOR,)
    native_sizes: ClassVar[Mapping[int, tuple[int, ...]]] = {SM90_MAJOR: PR340_SM90_NATIVE}
    model_traits: ClassVar[Mapping[str, ModelTraits]] = {"sm90": SM90_TRAITS}
    versions: ClassVar[tuple[str, ...]] = ()  # a build has no version of its own (`version_note` names its commit)
    resume_fields: ClassVar[tuple[str, ...]] = ("deepgemm_pr340_origin",)

    def _import(self) -> tuple[ModuleType | None, str]:
        return import_pr340()

    def environment(self) -> dict[str, Any]:
        module, origin = import_pr340()
        found = module is not None
        return {
            "deepgemm_pr340": getattr(module, "__version__", "unknown") if found else None,
            "deepgemm_pr340_origin": origin if found else None,
        }

    def version_note(self, environment: Mapping[str, Any]) -> str | None:
        """'deepgemm-pr340 @1a2b3c4': a build has no version of its own, its origin names the commit."""
        commit = re.search(r"@([0-9a-f]{7})", environment.get("deepgemm_pr340_origin") or "")
        return f"{self.name} @{commit.group(1)}" if commit else None

    def _sm90_slots(self, next_n: int, num_sms: int) -> int:
        """One slot an SM at every next_n (this mainline has no two-CTA next_n = 4)."""
        return num_sms
