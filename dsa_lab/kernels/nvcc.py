"""Our CUDA sources (`csrc/*.cu` of the kernels and the top-k), compiled on first use by the nvcc on PATH for the
GPU in use.

Each source builds into its own folder (`build/<stem>/`, git-ignored, or the folder an environment variable
names), one library per source hash and architecture, so an edited kernel is never run from a stale build.
Provenance records the source's sha256, nvcc's version and the flags.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsa_lab.kernels.descriptor import Availability
from dsa_lab.paths import build_dir

FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC")
COMPILE_TIMEOUT_S = 300.0


@functools.cache
def nvcc_version() -> str:
    """nvcc's last version line, '' when there is no nvcc on PATH."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return ""
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""


@dataclass(frozen=True)
class CudaSource:
    """One of our `.cu` files, built as `libdsa_<stem>-<sha>-sm<arch>.so` under `build/<stem>/` (or `$<build_env>`)."""

    path: Path
    build_env: str  # the environment variable that names another build folder

    def folder(self) -> Path:
        return build_dir(self.path.stem, self.build_env)

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def compile(self, arch: str, folder: Path | None = None) -> Path:
        """The library for `sm_<arch>` (e.g. '90'), compiled now unless this source's build is there."""
        folder = self.folder() if folder is None else folder
        path = folder / f"libdsa_{self.path.stem}-{self.sha256()[:16]}-sm{arch}.so"
        if path.is_file():
            return path
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            raise FileNotFoundError(f"no build at {path} and no nvcc on PATH to make it")
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".partial{os.getpid()}")
        command = [nvcc, *FLAGS, f"-arch=sm_{arch}", "-o", str(partial), str(self.path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode:
            partial.unlink(missing_ok=True)
            raise RuntimeError(
                f"nvcc failed on {self.path.name} (exit {done.returncode}): {done.stderr.strip()[-800:]}"
            )
        os.replace(partial, path)
        return path

    def load(self, device: torch.device) -> ctypes.CDLL:
        """The library for `device`'s architecture, compiled first when needed."""
        major, minor = torch.cuda.get_device_capability(device)
        return _load(str(self.compile(f"{major}{minor}")))

    def availability(self, device: torch.device, capability: tuple[int, int], needs: str) -> Availability:
        """Whether it runs on `device`: a CUDA GPU of at least `capability` (`needs` says why), with nvcc or a build."""
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return Availability(False, f"a CUDA kernel: needs a CUDA device, got {device}")
        if torch.cuda.get_device_capability(device) < capability:
            return Availability(False, f"needs compute capability >= {capability[0]}.{capability[1]} ({needs})")
        if not nvcc_version() and not any(self.folder().glob(f"libdsa_{self.path.stem}-{self.sha256()[:16]}-*.so")):
            return Availability(False, f"no nvcc on PATH and no build of this source under {self.folder()}")
        return Availability(True, "")

    def environment(self) -> dict[str, Any]:
        return {"source_sha256": self.sha256(), "nvcc": nvcc_version(), "flags": list(FLAGS)}


@functools.cache
def _load(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path)
