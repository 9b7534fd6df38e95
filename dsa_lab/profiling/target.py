"""The process Nsight Compute runs: the harness's grid walked once, each point's logits calls opened to ncu.

`python -m dsa_lab.profiling --ncu-target --grid GRID.json --manifest M.json ...` walks the
grid (`bench.walk`: the same points, plans and inputs as every mode), checks each point
with the harness's measure, warms it up, and runs its step `repeats` times with the phases
as NVTX ranges and each backend call between cudaProfilerStart/Stop, so `ncu
--profile-from-start off` sees only the logits kernels. A marker kernel before each step
numbers it. A point whose launches equal one already profiled (flatten at next_n = 1 is
native) is recorded `same_as` it instead of being profiled twice. The manifest (JSON)
records every point, what ran and why anything did not.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.walk import walk
from dsa_lab.profiling.step import phased_decode
from dsa_lab.profiling.sweep import ProfileSettings, check_visit, point_config
from dsa_lab.profiling.torch_profile import sync


@dataclass(frozen=True)
class TargetPlan:
    """What one ncu run covers: a grid (one backend), where to write the manifest, and its limits."""

    spec: SweepSpec
    manifest: Path
    settings: ProfileSettings = ProfileSettings()
    time_budget_s: float = 240.0


@contextmanager
def profiler_window() -> Iterator[None]:
    """cudaProfilerStart/Stop: what ncu `--profile-from-start off` profiles."""
    torch.cuda.profiler.start()
    try:
        yield
    finally:
        torch.cuda.profiler.stop()


def run_target(
    plan: TargetPlan,
    device: torch.device | None = None,
    marker: Callable[[int, torch.device], None] | None = None,
    window: Callable[[], AbstractContextManager[object]] = profiler_window,
) -> dict[str, Any]:
    """Run every point of `plan`; write and return the manifest.

    Defaults are the GPU, the Triton marker and cudaProfilerStart/Stop windows; tests
    pass a CPU device, a recording marker and `nullcontext` to check the bookkeeping.
    """
    if device is None:
        device = torch.device("cuda")
    if marker is None:
        from dsa_lab.profiling.marker import launch_marker as marker
    spec, settings = plan.spec, plan.settings
    nvtx = device.type == "cuda"
    manifest: dict[str, Any] = {"backends": list(spec.backend), "configs": [], "steps": [], "complete": False}
    started = time.perf_counter()
    seen: dict[tuple, int] = {}  # (workload, next_n, backend, launch signature) -> index of the profiled config
    for visit in walk(spec.points(), spec, device):
        point = visit.point
        config = {"index": len(manifest["configs"]), **point_config(visit, device, "ncu"), "same_as": None}
        manifest["configs"].append(config)
        if visit.skip or visit.error:
            config.update(status="skipped" if visit.skip else "error", reason=visit.skip or visit.error)
            continue
        if time.perf_counter() - started > plan.time_budget_s:
            config.update(status="skipped", reason=f"time budget of {plan.time_budget_s:g} s spent")
            continue
        key = (point.workload_key, point.next_n, point.backend, visit.plan.signature)
        if key in seen:
            twin = seen[key]
            config.update(
                status="same_as", same_as=twin, reason=f"launches identical to {manifest['configs'][twin]['strategy']}"
            )
            continue
        try:
            config["rel_err"], refused = check_visit(visit, spec, device)
            if refused:
                config.update(status="failed", reason=refused)
                continue
            phased_decode(visit.inputs, visit.plan, visit.backend, settings.topk)  # warm-up, value checks included
        except (ValueError, RuntimeError) as err:  # unsupported, unavailable, or a failing kernel
            config.update(status="error", reason=f"{type(err).__name__}: {err}")
            continue
        seen[key] = config["index"]
        for repeat in range(settings.repeats):
            number = len(manifest["steps"])
            sync(device)
            with window():
                marker(number, device)
            phased_decode(
                visit.inputs, visit.plan, visit.backend, settings.topk, nvtx=nvtx, logits_window=window, check=False
            )
            sync(device)
            manifest["steps"].append({"marker": number, "config": config["index"], "repeat": repeat})
        config["status"] = "profiled"
        _write(plan.manifest, manifest)
    manifest["complete"] = True
    _write(plan.manifest, manifest)
    return manifest


def _write(path: Path, manifest: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, default=str))
    tmp.replace(path)


def target_main(args: Sequence[str]) -> int:
    """Entry for `python -m dsa_lab.profiling --ncu-target ...` (prints nothing on stdout: ncu's CSV goes there)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dsa_lab.profiling --ncu-target")
    parser.add_argument("--ncu-target", action="store_true", required=True)
    parser.add_argument("--grid", type=Path, required=True, help="the grid as JSON (SweepSpec.to_dict)")
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--topk", type=int, default=ProfileSettings().topk)
    parser.add_argument("--time-budget-s", type=float, default=240.0)
    ns = parser.parse_args(args)
    if not torch.cuda.is_available():
        print("ncu target: no CUDA device; the ncu target profiles GPU kernels only", file=sys.stderr)
        return 2
    try:
        spec = SweepSpec.from_dict(json.loads(ns.grid.read_text(encoding="utf-8")))
        run_target(TargetPlan(spec, ns.manifest, ProfileSettings(ns.topk, ns.repeats, False), ns.time_budget_s))
    except (ValueError, RuntimeError, OSError) as err:
        print(f"ncu target: error: {err}", file=sys.stderr)
        return 2
    return 0
