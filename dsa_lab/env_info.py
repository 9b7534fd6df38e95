"""What this machine is: versions, GPU, decode-policy platform and usable kernel backends.

`environment_facts(backends)` is the provenance every stored result carries (no hostname).
A user's DeepGEMM PR #340 build is foreign code: it is imported (and recorded) only for a
run that names the `deepgemm-pr340` backend, and by `dsa-lab env`, which says so. Every
string `dsa-lab env` prints from outside (versions, origins, reasons) is escaped for rich,
so a bracket in an ORIGIN file is text, never markup.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import os
import platform as host_platform
import shutil
import subprocess
from collections.abc import Iterable
from typing import Any

import torch


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


PR340_BACKEND = "deepgemm-pr340"


def environment_facts(backends: Iterable[str] = ()) -> dict[str, Any]:
    """GPU, driver, CUDA/HIP, library versions, python and OS; the PR #340 build's only when `backends`
    names it (importing foreign code is what a run asks for, not what a variable allows)."""
    return _facts(PR340_BACKEND in tuple(backends))


@functools.cache
def _facts(with_pr340: bool) -> dict[str, Any]:
    """Cached (importing deep_gemm is slow)."""
    from dsa_lab.kernels.deepgemm_pr340 import import_pr340
    from dsa_lab.policy import Platform, import_deep_gemm

    policy_platform = Platform.detect()
    deep_gemm, origin = import_deep_gemm()
    pr340, pr340_origin = import_pr340() if with_pr340 else (None, "")
    return {
        **_gpu_facts(),
        "driver": _nvidia_driver(),
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "torch": torch.__version__,
        "triton": _package_version("triton"),
        "vllm": _package_version("vllm"),
        "deep_gemm": getattr(deep_gemm, "__version__", "unknown") if deep_gemm else None,
        "deep_gemm_origin": origin if deep_gemm else None,
        "deepgemm_pr340": getattr(pr340, "__version__", "unknown") if pr340 else None,
        "deepgemm_pr340_origin": pr340_origin if pr340 else None,
        "python": host_platform.python_version(),
        "os": host_platform.platform(),
        "policy_platform": policy_platform.family,
        "dsa_lab": _package_version("dsa_lab"),
    }


environment_facts.cache_clear = _facts.cache_clear  # type: ignore[attr-defined]  # what tests call to reset it


def _print_env(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from dsa_lab.kernels import backend_names, get_backend
    from dsa_lab.kernels.deepgemm_pr340 import ENV_VAR
    from dsa_lab.policy import Platform

    facts = environment_facts([PR340_BACKEND])
    console = Console(highlight=False)
    if os.environ.get(ENV_VAR):
        console.print(f"[bold]{ENV_VAR}[/]: {escape(os.environ[ENV_VAR])} (env imports that build to report on it; "
                      "bench and profile import it only when --backend names deepgemm-pr340)")  # fmt: skip
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
    for key in (
        "python",
        "torch",
        "cuda",
        "hip",
        "triton",
        "vllm",
        "deep_gemm",
        "deep_gemm_origin",
        "deepgemm_pr340",
        "deepgemm_pr340_origin",
        "dsa_lab",
        "os",
    ):
        versions.add_row(key, escape(str(facts[key])))
    console.print(versions)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backends = Table(title=f"kernel backends on {device}")
    backends.add_column("backend")
    backends.add_column("available")
    backends.add_column("native next_n")
    backends.add_column("why not")
    for name in backend_names():
        backend = get_backend(name)
        state = backend.availability(device)
        native = backend.native_next_n(device) if state.ok else None
        shown = "any" if native is None else ",".join(map(str, sorted(native)))
        backends.add_row(escape(name), "[green]yes[/]" if state.ok else "[red]no[/]", shown if state.ok else "",
                         escape(state.reason))  # fmt: skip
    console.print(backends)
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("env", help="versions, GPU, policy platform and which kernel backends run here")
    parser.set_defaults(func=_print_env)
