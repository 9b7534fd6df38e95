"""`vllm`: vLLM 0.33.0's own decode top-k, with vLLM's own dispatch: the step a user pays for.

vLLM's `SparseIndexerTopk` ('auto') runs `cooperative_topk` up to 64 rows and `persistent_topk`
above (which picks its sampled, filtered or radix kernel by rows and the batch's longest context),
for k in {512, 1024, 2048}, each row bounded by its length and the whole step by `max_seq_len`,
the batch's longest context as a host int.

Two routes to the same kernels, the first that loads:
- vLLM's compiled ops (`vllm._custom_ops`), on a machine where vLLM's wheel loads, called with
  vLLM's own choice of op (`SparseIndexerTopk.resolve_backend`);
- a build of the kernels from vLLM 0.33.0's source distribution behind dsa_lab's C entry point
  (`csrc/vllm_topk_entry.cu`, whose launch rules are `csrc/vllm_topk_rules.h`), made by
  `scripts/build_vllm_topk.sh` into `build/vllm_topk/` (or the folder `DSA_LAB_VLLM_TOPK` names),
  for a machine whose torch is not vLLM's (the device's torch 2.11 against the wheel's 2.14).
  Its `build.json` (the sdist's sha256, the compiler, the entry point's hash) goes into provenance.

Both take raw device pointers on the current stream and synchronise nothing, so a step with this
top-k is timed between CUDA events or replayed in a CUDA graph.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from dsa_lab.paths import build_dir
from dsa_lab.topk.registry import TopkAvailability, TopkCall, TopkImpl, check_call, register_topk

BUILD_ENV = "DSA_LAB_VLLM_TOPK"
LIBRARY = "libdsa_vllm_topk.so"
BUILD_RECORD = "build.json"
WORKSPACE_BYTES = 1 << 20  # vLLM's RADIX_TOPK_WORKSPACE_SIZE
SIZES = (512, 1024, 2048)
KERNELS = {1: "cooperative", 2: "sampled", 3: "filtered", 4: "radix"}  # vllm_topk_rules.h's numbering
AUTO = 0  # the rules' policy: vLLM's 'auto' chain


class _Plan(ctypes.Structure):
    """`dsa_topk_plan` of vllm_topk_rules.h."""

    _fields_ = [
        ("kernel", ctypes.c_int),
        ("cluster", ctypes.c_int),
        ("vec", ctypes.c_int),
        ("smem", ctypes.c_uint32),
        ("chunk", ctypes.c_uint32),
        ("ctas_per_group", ctypes.c_uint32),
        ("groups", ctypes.c_uint32),
        ("length_bound", ctypes.c_uint32),
        ("workspace_bytes", ctypes.c_size_t),
    ]


def plan_name(plan: _Plan) -> str:
    """'cooperative (cluster 4)', 'sampled', 'filtered' or 'radix (4 groups x 8 CTAs)'."""
    name = KERNELS.get(plan.kernel, "refused")
    if plan.kernel == 1:
        return f"{name} (cluster {plan.cluster})"
    if plan.kernel == 4:
        return f"{name} ({plan.groups} groups x {plan.ctas_per_group} CTAs)"
    return name


def build_folder() -> Path:
    """Where the build lives: `$DSA_LAB_VLLM_TOPK`, else the checkout's `build/vllm_topk/`."""
    return build_dir("vllm_topk", BUILD_ENV)


@functools.cache
def _load_build(folder: str) -> tuple[ctypes.CDLL, dict[str, Any]]:
    """The build's library (its two entry points typed) and its record, with the library's own sha256."""
    path = Path(folder) / LIBRARY
    if not path.is_file():
        raise FileNotFoundError(
            f"no build of vLLM's top-k at {path}: run scripts/build_vllm_topk.sh (nvcc and the 0.33.0 sdist from "
            f"PyPI), or point {BUILD_ENV} at a folder holding {LIBRARY} and {BUILD_RECORD}"
        )
    record_path = Path(folder) / BUILD_RECORD
    record = json.loads(record_path.read_text(encoding="utf-8")) if record_path.is_file() else {}
    record["library_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    library = ctypes.CDLL(str(path))
    u32, size, text = ctypes.c_uint32, ctypes.c_size_t, ctypes.c_char_p
    library.dsa_vllm_topk_plan.argtypes = [u32, u32, u32, u32, u32, ctypes.c_uint64, ctypes.c_int]
    library.dsa_vllm_topk_plan.argtypes += [ctypes.POINTER(_Plan), text, size]
    library.dsa_vllm_topk_plan.restype = ctypes.c_int
    pointer = ctypes.c_void_p
    library.dsa_vllm_topk_run.argtypes = [pointer, pointer, pointer, pointer, size, u32, u32, u32, u32, u32]
    library.dsa_vllm_topk_run.argtypes += [ctypes.c_int, pointer, ctypes.POINTER(_Plan), text, size]
    library.dsa_vllm_topk_run.restype = ctypes.c_int
    return library, record


@functools.cache
def _vllm_ops() -> tuple[Any, str]:
    """vLLM's own dispatcher if its compiled ops load here, else (None, why not)."""
    try:
        from vllm import _custom_ops  # noqa: F401  (registers torch.ops._C)
        from vllm.model_executor.layers.indexer_topk import SparseIndexerTopk
    except Exception as err:  # an ABI mismatch raises OSError or ImportError, or worse
        return None, f"vllm._custom_ops does not load ({type(err).__name__}: {str(err)[:120]})"
    if not hasattr(torch.ops._C, "persistent_topk"):
        return None, "vllm._custom_ops loads but registers no persistent_topk"
    return SparseIndexerTopk("auto"), ""


class _BuildCall(TopkCall):
    """The build's entry point on preallocated output and workspace."""

    def __init__(self, library: ctypes.CDLL, rows: int, k: int, device: torch.device) -> None:
        self.library, self.rows, self.k = library, rows, k
        self.out = torch.empty((rows, k), dtype=torch.int32, device=device)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.plan = _Plan()
        self.message = ctypes.create_string_buffer(512)

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        check_call(logits, lengths, self.rows)
        stream = torch.cuda.current_stream(logits.device).cuda_stream
        status = self.library.dsa_vllm_topk_run(
            logits.data_ptr(),
            lengths.data_ptr(),
            self.out.data_ptr(),
            self.workspace.data_ptr(),
            WORKSPACE_BYTES,
            self.rows,
            logits.stride(0),
            logits.shape[1],
            self.k,
            max_seq_len,
            AUTO,
            stream,
            ctypes.byref(self.plan),
            self.message,
            len(self.message),
        )
        if status:
            raise RuntimeError(f"vLLM top-k (dsa_lab build): {self.message.value.decode(errors='replace')}")
        self.kernel = plan_name(self.plan)
        return self.out


class _OpsCall(TopkCall):
    """vLLM's compiled ops, the op chosen by vLLM's own `SparseIndexerTopk.resolve_backend`."""

    def __init__(self, dispatcher: Any, rows: int, k: int, device: torch.device) -> None:
        self.dispatcher, self.rows, self.k = dispatcher, rows, k
        self.out = torch.empty((rows, k), dtype=torch.int32, device=device)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        check_call(logits, lengths, self.rows)
        op = self.dispatcher.resolve_backend(logits, self.k, self.rows)
        if op not in ("cooperative", "persistent"):
            raise RuntimeError(f"vLLM top-k: vLLM resolved {op!r} here, not one of its decode top-k kernels")
        getattr(torch.ops._C, f"{op}_topk")(logits, lengths, self.out, self.workspace, self.k, max_seq_len)
        self.kernel = f"vllm._custom_ops.{op}_topk"
        return self.out


@register_topk
class VllmTopk(TopkImpl):
    name = "vllm"
    label = "vLLM's top-k"
    is_vllm = True
    sizes = SIZES
    runs_on = "CUDA, compute capability 9.0 and newer (vLLM's compiled ops, or dsa_lab's build of them)"

    def _route(self, device: torch.device) -> tuple[str, str]:
        """('ops' or 'build', '') where the kernels load on `device`, else ('', why not)."""
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return "", f"needs a CUDA device (got {device.type})"
        major, minor = torch.cuda.get_device_capability(device)
        if major < 9:
            return "", f"vLLM's decode top-k kernels need compute capability 9.0+, this GPU is {major}.{minor}"
        dispatcher, ops_reason = _vllm_ops()
        if dispatcher is not None:
            return "ops", ""
        try:
            _load_build(str(build_folder()))
        except (OSError, ValueError) as err:
            return "", f"{ops_reason}; {err}"
        return "build", ""

    def availability(self, device: torch.device) -> TopkAvailability:
        route, reason = self._route(device)
        return TopkAvailability(bool(route), reason)

    def environment(self) -> dict[str, Any]:
        if not torch.cuda.is_available():
            return {"vllm_topk": None}
        route, reason = self._route(torch.device("cuda"))
        if route == "ops":
            import vllm

            return {"vllm_topk": f"vllm._custom_ops (vllm {vllm.__version__})"}
        if route == "build":
            return {"vllm_topk": "dsa_lab build", "vllm_topk_build": _load_build(str(build_folder()))[1]}
        return {"vllm_topk": None, "vllm_topk_unavailable": reason}

    def prepare(self, rows: int, width: int, k: int, device: torch.device) -> TopkCall:
        self.require(device, k)
        route, _ = self._route(device)
        if route == "ops":
            return _OpsCall(_vllm_ops()[0], rows, k, torch.device(device))
        return _BuildCall(_load_build(str(build_folder()))[0], rows, k, torch.device(device))
