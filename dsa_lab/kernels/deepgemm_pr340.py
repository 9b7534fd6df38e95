"""DeepGEMM PR #340 (SM90 FP8 paged MQA logits for next_n = 3), a backend beside the vendored DeepGEMM.

On Hopper, DeepGEMM's released kernel takes next_n in {1, 2, 4}; the open PR #340 adds 3 (a
two-row MMA plus a one-row tail) on top of the DeepGEMM mainline it branched from, which has
{1, 2} and no two-CTA next_n = 4. It is not released, so this project never ships or builds
it: a user builds it (docs/triton_kernel.md, "DeepGEMM PR #340") and points `DSA_LAB_DEEPGEMM_PR340`
at the folder holding that `deep_gemm` package. The package is imported under a private name,
so it lives in one process beside the vendored `deep_gemm` and both can be timed in one run.
Its origin (repository, commit, what it was built with) is read from the `ORIGIN` file the
builder writes beside its `__init__.py` and goes into the provenance of every run that times it.

Foreign code runs only when asked: the build is imported when the `deepgemm-pr340` backend
is asked whether it can run (a sweep that names it, `dsa-lab env`, which says so), never
by merely setting the variable. The import is bounded: it is first tried in a child
process with a time limit (`IMPORT_TIMEOUT_S`), so a build that hangs, exits or crashes
at import is named and left out without taking the sweep down; then in this process,
where anything it raises (`SystemExit` and `KeyboardInterrupt` included) is caught and
named. One build a process: a second folder is refused by name, since both would be the
same module and provenance would name the wrong one.
"""

from __future__ import annotations

import codecs
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from dsa_lab.kernels.deepgemm import SM90_MAJOR, SM90_TRAITS, DeepGemmBackend
from dsa_lab.kernels.descriptor import KernelFit, ModelTraits
from dsa_lab.kernels.registry import register_backend

ENV_VAR = "DSA_LAB_DEEPGEMM_PR340"
ORIGIN_FILE = "ORIGIN"
MODULE_NAME = "dsa_lab_deepgemm_pr340"  # never `deep_gemm`: the vendored build owns that name
PR340_SM90_NATIVE = (1, 2, 3)
IMPORT_TIMEOUT_S = 120.0  # the child process's import of the build (deep_gemm loads its extension and torch)
MAX_ORIGIN_CHARS = 2000
_LOADED: dict[str, str] = {}  # the one build imported in this process: {"root": ..., "origin": ...}
_IMPORT = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location({name!r}, {init!r}, submodule_search_locations=[{package!r}])\n"
    "module = importlib.util.module_from_spec(spec)\nsys.modules[{name!r}] = module\nspec.loader.exec_module(module)\n"
    "print({done!r})\n"
)
IMPORTED = "dsa_lab: the build imported"  # the child's last line: its import ran to the end


def read_origin(package: Path) -> str:
    """The build's ORIGIN as one line of plain text (control characters as spaces, cut at
    `MAX_ORIGIN_CHARS`), or what stands in for it, naming the file."""
    path = package / ORIGIN_FILE
    if not path.is_file():
        return f"unrecorded build ({package})"
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_ORIGIN_CHARS * 4 + 1)  # enough for the cut; a longer file is cut below
        text = codecs.getincrementaldecoder("utf-8")().decode(data, final=len(data) <= MAX_ORIGIN_CHARS * 4)
    except (OSError, UnicodeDecodeError) as err:
        return f"unrecorded build ({package}; its {path} is unreadable: {type(err).__name__})"
    text = " ".join(re.sub(r"[\x00-\x1f\x7f-\x9f]", " ", text).split())
    return text if len(text) <= MAX_ORIGIN_CHARS else text[:MAX_ORIGIN_CHARS] + " ... (cut)"


def _probe(root: str, package: Path, init: Path) -> str | None:
    """Import the build in a child process first: why it cannot be imported here, or None."""
    code = _IMPORT.format(name=MODULE_NAME, init=str(init), package=str(package), done=IMPORTED)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, errors="replace", timeout=IMPORT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"{ENV_VAR}={root}: importing deep_gemm did not finish within {IMPORT_TIMEOUT_S:g} s (tried in a child process)"
    except OSError as err:
        return f"{ENV_VAR}={root}: could not start a child process to import deep_gemm: {err}"
    if done.returncode != 0 or IMPORTED not in done.stdout.splitlines()[-1:]:
        last = next(iter(done.stderr.strip().splitlines()[-1:]), "")
        how = f"exit {done.returncode}" if done.returncode >= 0 else f"signal {-done.returncode}"
        return f"{ENV_VAR}={root}: importing deep_gemm ended its process ({how}{': ' + last if last else ''})"
    return None


def import_pr340(root: str | None = None) -> tuple[ModuleType | None, str]:
    """The PR #340 build under `root` (default: $DSA_LAB_DEEPGEMM_PR340) and its origin, or None and why not."""
    root = os.environ.get(ENV_VAR, "") if root is None else root
    if not root:
        return None, f"{ENV_VAR} is not set (the folder holding a deep_gemm package built from DeepGEMM PR #340)"
    package = Path(root).expanduser().resolve() / "deep_gemm"
    init = package / "__init__.py"
    if not init.is_file():
        return None, f"{ENV_VAR}={root}: no deep_gemm/__init__.py there"
    if _LOADED:
        if _LOADED["root"] != str(package.parent):
            return None, (
                f"{ENV_VAR}={root}: this process already imported the PR #340 build in {_LOADED['root']}; "
                "a second build cannot be imported beside it (start a new process)"
            )
        return sys.modules[MODULE_NAME], _LOADED["origin"]
    why = _probe(root, package, init)
    if why is not None:
        return None, why
    spec = importlib.util.spec_from_file_location(MODULE_NAME, init, submodule_search_locations=[str(package)])
    assert spec is not None and spec.loader is not None  # a file location always has a loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as err:  # ImportError, an extension built for another torch, sys.exit, KeyboardInterrupt
        del sys.modules[MODULE_NAME]
        return None, f"{ENV_VAR}={root}: importing deep_gemm failed: {type(err).__name__}: {err}"
    _LOADED.update(root=str(package.parent), origin=read_origin(package))
    return module, _LOADED["origin"]


@register_backend
class DeepGemmPR340Backend(DeepGemmBackend):
    """DeepGEMM PR #340's `fp8_fp4_paged_mqa_logits` on SM90: next_n in {1, 2, 3} natively."""

    name = "deepgemm-pr340"
    label = "DeepGEMM PR #340"
    marker = "h"  # a hexagon: "X" is the modeled glyph (plots.style.MODELED_MARKER)
    color = "#e377c2"
    in_vllm = False  # no vLLM release calls it
    presets = ("h200-full", "step")  # SM90 only; its points are skipped (with the reason) where no build is pointed at
    supported_majors: ClassVar[tuple[int, ...]] = (SM90_MAJOR,)
    native_sizes: ClassVar[Mapping[int, tuple[int, ...]]] = {SM90_MAJOR: PR340_SM90_NATIVE}
    model_traits: ClassVar[Mapping[str, ModelTraits]] = {"sm90": SM90_TRAITS}
    # Fitted on the shipped H200 sweep that timed it (issue 13's; tests/test_model.py names it and fits again).
    model_fits: ClassVar[Mapping[str, KernelFit]] = {
        "native": KernelFit(0.8, 0.45, 7.0, 8.0),
        "flatten": KernelFit(0.9, 0.325, 6.0, 8.0),
        "atom": KernelFit(1.0, 0.45, 5.0, 8.0),
    }
    versions: ClassVar[tuple[str, ...]] = ()  # a build has no version of its own (`version_note` names its commit)
    resume_fields: ClassVar[tuple[str, ...]] = ("deepgemm_pr340_origin",)

    def _import(self) -> tuple[ModuleType | None, str]:
        return import_pr340()

    def environment(self, requested: bool = True) -> dict[str, Any]:
        """The build's version and ORIGIN, imported only for a run that names this backend (None otherwise)."""
        module, origin = import_pr340() if requested else (None, "")
        found = module is not None
        return {
            "deepgemm_pr340": getattr(module, "__version__", "unknown") if found else None,
            "deepgemm_pr340_origin": origin if found else None,
        }

    def foreign_code(self) -> str | None:
        root = os.environ.get(ENV_VAR)
        if not root:
            return None
        return (
            f"{ENV_VAR}={root}: a user's build of DeepGEMM PR #340, foreign code (env imports that build to report "
            f"on it; bench and profile import it only when --backend names {self.name})"
        )

    def version_note(self, environment: Mapping[str, Any]) -> str | None:
        """'deepgemm-pr340 @1a2b3c4': a build has no version of its own, its origin names the commit."""
        commit = re.search(r"@([0-9a-f]{7})", environment.get("deepgemm_pr340_origin") or "")
        return f"{self.name} @{commit.group(1)}" if commit else None

    def _sm90_slots(self, next_n: int, num_sms: int) -> int:
        """One slot an SM at every next_n (this mainline has no two-CTA next_n = 4)."""
        return num_sms
