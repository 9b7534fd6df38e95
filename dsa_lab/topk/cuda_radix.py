"""`cuda-radix`: our own per-row radix select in CUDA (`csrc/row_select.cu`). Not vLLM's top-k.

Issue 27's two-phase design selects from logits that stay in L2; before anything is fused, its selection is
timed alone against vLLM's decode top-k on the same logits. Lab-notes round 14 ruled out Triton for it
(`triton-radix`: `tl.histogram` costs each score the bin count); this one counts in shared memory, a plain
atomic a score, one CTA of 1024 threads a row: 1.3-3.1 times vLLM's on the H100 (round 14), so a measured
baseline for a fused step, not an option.

It is compiled on first use by the nvcc on PATH for the GPU in use, into `build/row_select/` (git-ignored; or
the folder `DSA_LAB_ROW_SELECT` names), one library per source hash and architecture, so an edited kernel is
never run from a stale build. Provenance records the source's sha256, nvcc's version and the flags.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch

from dsa_lab.paths import build_dir
from dsa_lab.topk.registry import TopkAvailability, TopkCall, TopkImpl, check_call, register_topk

SOURCE = Path(__file__).parent / "csrc" / "row_select.cu"
BUILD_ENV = "DSA_LAB_ROW_SELECT"
FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC")
COMPILE_TIMEOUT_S = 300.0


def build_folder() -> Path:
    """Where builds live: `$DSA_LAB_ROW_SELECT`, else the checkout's `build/row_select/`."""
    return build_dir("row_select", BUILD_ENV)


def source_sha256() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


@functools.cache
def nvcc_version() -> str:
    """nvcc's last version line, '' when there is no nvcc on PATH."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return ""
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""


def compile_library(arch: str, folder: Path) -> Path:
    """The library for `sm_<arch>` (e.g. '90'), compiled now unless this source's build is there."""
    path = folder / f"libdsa_row_select-{source_sha256()[:16]}-sm{arch}.so"
    if path.is_file():
        return path
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError(f"no build at {path} and no nvcc on PATH to make it")
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".partial{os.getpid()}")
    command = [nvcc, *FLAGS, f"-arch=sm_{arch}", "-o", str(partial), str(SOURCE)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    if done.returncode:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"nvcc failed on {SOURCE.name} (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    os.replace(partial, path)
    return path


@functools.cache
def _library(path: str) -> ctypes.CDLL:
    library = ctypes.CDLL(path)
    pointer, i32 = ctypes.c_void_p, ctypes.c_int
    library.dsa_row_select.argtypes = [pointer, ctypes.c_int64, pointer, i32, i32, i32, pointer, pointer]
    library.dsa_row_select.argtypes += [ctypes.c_char_p, ctypes.c_size_t]
    library.dsa_row_select.restype = i32
    return library


class _RowSelectCall(TopkCall):
    kernel = "cuda radix select (one 1024-thread CTA a row, 4 passes)"  # recorded with every timed row

    def __init__(self, library: ctypes.CDLL, rows: int, k: int, device: torch.device) -> None:
        self.library, self.rows, self.k = library, rows, k
        self.out = torch.empty((rows, k), dtype=torch.int32, device=device)
        self.message = ctypes.create_string_buffer(256)

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        check_call(logits, lengths, self.rows)
        stream = torch.cuda.current_stream(logits.device).cuda_stream
        status = self.library.dsa_row_select(
            logits.data_ptr(), logits.stride(0), lengths.data_ptr(), self.rows, logits.shape[1], self.k,
            self.out.data_ptr(), stream, self.message, len(self.message),
        )  # fmt: skip
        if status:
            raise RuntimeError(f"cuda-radix: {self.message.value.decode(errors='replace')}")
        return self.out


@register_topk
class CudaRadixTopk(TopkImpl):
    name = "cuda-radix"
    label = "our CUDA radix select (not vLLM's)"
    runs_on = "a CUDA GPU of compute capability 7.0 or more, with nvcc on PATH for its first use"

    def availability(self, device: torch.device) -> TopkAvailability:
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return TopkAvailability(False, f"a CUDA kernel: needs a CUDA device, got {device}")
        if torch.cuda.get_device_capability(device) < (7, 0):
            return TopkAvailability(False, "needs compute capability >= 7.0 (__match_any_sync)")
        if not nvcc_version() and not any(build_folder().glob(f"libdsa_row_select-{source_sha256()[:16]}-*.so")):
            return TopkAvailability(False, f"no nvcc on PATH and no build of this source under {build_folder()}")
        return TopkAvailability(True, "")

    def environment(self) -> dict[str, Any]:
        return {"source_sha256": source_sha256(), "nvcc": nvcc_version(), "flags": list(FLAGS)}

    def prepare(self, rows: int, width: int, k: int, device: torch.device) -> TopkCall:
        device = torch.device(device)
        major, minor = torch.cuda.get_device_capability(device)
        library = _library(str(compile_library(f"{major}{minor}", build_folder())))
        return _RowSelectCall(library, rows, k, device)
