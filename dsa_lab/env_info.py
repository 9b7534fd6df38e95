"""What this machine is: versions, GPU, decode-policy platform and usable kernel backends.

`environment_facts(backends)` is the provenance every stored result carries (no hostname): every
backend's own facts (`LogitsBackend.environment`). A backend whose library is foreign code (a user's
build: DeepGEMM PR #340) imports it, and records it, only for a run that names that backend, and for
`dsa-lab env`, which says so (`LogitsBackend.foreign_code`). Every string `dsa-lab env` prints from
outside (versions, origins, reasons) is escaped for rich, so a bracket in an ORIGIN file is text,
never markup.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import os
import platform as host_platform
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from dsa_lab.errors import probe
from dsa_lab.kernels import backend_names, external, get_backend, vllm_backend
from dsa_lab.policy.query import CAPABILITY_FAMILIES, CDNA_BY_GFX, Platform
from dsa_lab.topk import get_topk, topk_names


def _declared(field: str) -> tuple[str, ...]:
    """Every registered backend's `field` (packages, versions, resume fields), each name once."""
    return tuple(dict.fromkeys(name for backend in backend_names() for name in getattr(get_backend(backend), field)))


PACKAGES = (*_declared("packages"), "vllm")  # Python packages a run's provenance names by installed version
LIBRARY_KEYS = ("torch", *PACKAGES, *_declared("versions"))  # the libraries a notebook's provenance record names
VERSION_KEYS = (*LIBRARY_KEYS, "cuda")  # what a chart's footer names
EXTERNAL = "external_backends"  # {backend: {path, sha256, via}} of the run's backends from outside the package
# The facts a resumed run must keep (`store.opening.check_resume`): the GPU, driver, CUDA, torch, python, what
# every backend declares (`LogitsBackend.resume_fields`) and the files of external backends.
RESUME_FIELDS = (
    "gpu_name",
    "gpu_capability",
    "driver",
    "cuda",
    "torch",
    *_declared("resume_fields"),
    "python",
    EXTERNAL,
)


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_driver() -> str | None:
    """The driver version from `nvidia-smi`, or None where there is none (or it fails)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if lines else None


def device_name(device: torch.device) -> str:
    """The GPU's name ('NVIDIA H200') for a CUDA device, else 'cpu': what runs and charts are labelled with."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _gpu_facts() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"gpu_name": None, "gpu_capability": None, "gpu_sm_count": None}
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu_name": props.name,
        "gpu_capability": f"{props.major}.{props.minor}",
        "gpu_sm_count": props.multi_processor_count,
    }


def detect_platform() -> Platform:
    """This machine as vLLM's decode policies see it (`policy.Platform`): torch's device capability (or
    HIP's GPU arch) and whether deep_gemm imports (as vLLM finds it); aiter counts when
    VLLM_ROCM_USE_AITER is on and the package is installed."""
    has_deep_gemm = vllm_backend().library_imports()
    if not torch.cuda.is_available():
        return Platform("other", has_deep_gemm)
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        aiter = os.environ.get("VLLM_ROCM_USE_AITER", "0").lower() in ("1", "true")
        found = aiter and importlib.util.find_spec("aiter") is not None
        return Platform("rocm", has_deep_gemm, CDNA_BY_GFX.get(arch, 0), found)
    major, _ = torch.cuda.get_device_capability()
    return Platform(CAPABILITY_FAMILIES.get(major, "other"), has_deep_gemm)


def environment_facts(backends: Iterable[str] = ()) -> dict[str, Any]:
    """GPU, driver, CUDA/HIP, library versions (every backend's own, `LogitsBackend.environment`),
    python and OS. A backend's foreign code is imported only when `backends` (the run's) names it:
    importing a user's build is what a run asks for, not what a variable allows. The external backends
    among `backends` are recorded with their module's file and sha256 (`EXTERNAL`)."""
    return _facts(frozenset(backends))


@functools.cache
def _facts(requested: frozenset[str]) -> dict[str, Any]:
    """Cached (importing deep_gemm is slow)."""
    backends = {  # a backend's environment() that raises is named (errors.probe), not a traceback of every run
        key: value
        for name in backend_names()
        for key, value in probe(name, "environment()", lambda name=name: _environment(name, name in requested)).items()
    }
    return {
        **_gpu_facts(),
        "driver": _nvidia_driver(),
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "torch": torch.__version__,
        **{package: _package_version(package) for package in (*_declared("packages"), "vllm")},  # external's too
        **backends,
        "topk": {name: get_topk(name).environment() for name in topk_names()},  # the step's top-k builds
        EXTERNAL: external.origins(requested),
        "python": host_platform.python_version(),
        "os": host_platform.platform(),
        "policy_platform": detect_platform().family,
        "dsa_lab": _package_version("dsa_lab"),
    }


environment_facts.cache_clear = _facts.cache_clear  # type: ignore[attr-defined]  # what tests call to reset it


def _environment(name: str, requested: bool) -> dict[str, Any]:
    facts = get_backend(name).environment(requested=requested)
    if not isinstance(facts, dict):
        raise TypeError(f"returned {type(facts).__name__}, not a dict")
    return facts


def version_line(environment: Mapping[str, Any]) -> str:
    """'torch 2.11.0, triton 3.6.0, vllm 0.33.0, deep_gemm 2.8.1, cuda 13.0': what a chart's footer names."""
    parts = [f"{key} {environment[key]}" for key in VERSION_KEYS if environment.get(key)]
    notes = (get_backend(name).version_note(environment) for name in backend_names())
    return ", ".join([*parts, *(note for note in notes if note)])


def _print_env(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    entry_notes, entry_errors = external.load_entry_points()  # env lists every backend: entry points' too
    for error in [*external.environment_failures(), *entry_errors]:
        console.print(f"[red]external backend not loaded[/]: {escape(error)}")
    facts = environment_facts(backend_names())
    for note in [*filter(None, (get_backend(name).foreign_code() for name in backend_names())), *entry_notes]:
        console.print(escape(note))
    for name, origin in facts[EXTERNAL].items():
        console.print(f"external backend {escape(name)}: {escape(origin['path'])} (sha256 {origin['sha256'][:12]}, "
                      f"{escape(origin['via'])})")  # fmt: skip
    plat = Platform(facts["policy_platform"], facts["deep_gemm"] is not None)
    console.print(f"[bold]policy platform[/]: family={plat.family} has_deep_gemm={plat.has_deep_gemm}")
    if facts["gpu_name"] is None:
        console.print("[bold]GPU[/]: no GPU (torch.cuda.is_available() is False)")
    else:
        console.print(
            f"[bold]GPU[/]: {escape(str(facts['gpu_name']))}  capability {facts['gpu_capability']}  "
            f"{facts['gpu_sm_count']} SMs  driver {escape(str(facts['driver']))}"
        )
    versions = Table(title="versions")
    versions.add_column("component")
    versions.add_column("version")
    backend_facts = [key for name in backend_names() for key in get_backend(name).environment(requested=False)]
    for key in ("python", "torch", "cuda", "hip", *PACKAGES, *backend_facts, "dsa_lab", "os"):
        versions.add_row(key, escape(str(facts[key])))
    console.print(versions)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backends = Table(title=f"kernel backends on {device}")
    backends.add_column("backend")
    backends.add_column("available")
    backends.add_column("native next_n")
    backends.add_column("config knobs (--config)")
    backends.add_column("why not")
    for name in backend_names():
        backend = get_backend(name)
        state = backend.availability(device)
        native = backend.native_next_n(device) if state.ok else None
        shown = "any" if native is None else ",".join(map(str, sorted(native)))
        knobs = ", ".join(backend.config_space.knobs) if backend.config_space else "rule only"
        available = "[green]yes[/]" if state.ok else "[red]no[/]"
        backends.add_row(escape(name), available, shown if state.ok else "", escape(knobs), escape(state.reason))
    console.print(backends)
    topks = Table(title=f"the step's top-k on {device} (the axis topk_impl)")
    for column in ("top-k", "what it is", "available", "why not"):
        topks.add_column(column)
    for name in topk_names():
        impl, state = get_topk(name), get_topk(name).availability(device)
        available = "[green]yes[/]" if state.ok else "[red]no[/]"
        topks.add_row(escape(name), escape(impl.label), available, escape(state.reason))
    console.print(topks)
    return 0


AOT_COLUMNS = {  # report field -> column: what the cubin holds (`cubin.resource_counts`)
    "registers": "regs",
    "stack_bytes": "stack B",
    "local_bytes": "local B",
    "sass_local_accesses": "LDL/STL",
    "shared_bytes": "smem B",
    "ptx_wgmma_e4m3": "wgmma",
    "sass_qgmma_e4m3": "QGMMA",
    "ptx_tcgen05_f8": "tcgen05",
    "setmaxnreg": "setmaxnreg",
    "tma_loads": "TMA",
}
AOT_CAPTION = (
    "wgmma: FP8 wgmma in the PTX; QGMMA: FP8 MMAs in the SASS; tcgen05: SM100's FP8 MMAs in the PTX; "
    "LDL/STL: local-memory accesses (spills) in the SASS; TMA: TMA loads in the SASS"
)


def _print_aot(args: argparse.Namespace) -> int:
    """`dsa-lab env --aot`: each backend's kernel compiled for sm_<arch> at each next_n, no GPU needed."""
    import json

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from dsa_lab import axes
    from dsa_lab.kernels import aot

    backends = axes.axis("backend").parse(args.backend) if args.backend else aot.aot_backends(args.arch)
    next_ns = axes.axis("next_n").parse(args.next_n)
    reports = aot.resource_table(backends, args.arch, next_ns, args.heads, args.head_dim, args.config)
    if args.json:
        for report in reports:
            print(json.dumps(report))
        return 0
    title = f"compiled ahead of time for sm_{args.arch} (H={args.heads}, D={args.head_dim}; no GPU)"
    table = Table(title=title, caption=AOT_CAPTION)
    table.add_column("backend")
    table.add_column("n", justify="right")
    table.add_column("config", overflow="fold")
    for column in AOT_COLUMNS.values():
        table.add_column(column, justify="right")
    errors = []
    for report in reports:
        if "error" in report:
            errors.append(f"{report['backend']} next_n={report['next_n']}: {report['error'].splitlines()[-1]}")
            continue
        counts = [",".join(map(str, v)) if isinstance(v := report[field], list) else str(v) for field in AOT_COLUMNS]
        table.add_row(escape(report["backend"]), str(report["next_n"]), escape(report["config"]), *counts)
    console = Console(highlight=False)
    console.print(table)
    for error in errors:
        console.print(f"[red]not compiled[/]: {escape(error)}")
    return 1 if errors else 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("env", help="versions, GPU, policy platform and which kernel backends run here")
    aot = parser.add_argument_group("--aot: our kernels compiled ahead of time for a GPU target, no GPU needed")
    aot.add_argument(
        "--aot",
        action="store_true",
        help="compile each backend's kernel at each --next-n and print what its cubin holds (registers, spills, "
        "shared memory, MMA instructions) instead of the environment",
    )
    aot.add_argument("--arch", type=int, default=90, help="the target, sm_<arch> (default 90)")
    aot.add_argument("--backend", metavar="LIST", help="backends (default: every one that builds for --arch)")
    aot.add_argument("--next-n", dest="next_n", default="1,2,3,4,8", metavar="LIST", help="default 1,2,3,4,8")
    aot.add_argument("--config", default="rule", help="a value of the config axis: rule, or knob=value/knob=value")
    aot.add_argument("--heads", type=int, default=64)
    aot.add_argument("--head-dim", type=int, default=128)
    aot.add_argument("--json", action="store_true", help="one JSON report a line")
    parser.set_defaults(func=lambda args: _print_aot(args) if args.aot else _print_env(args))
