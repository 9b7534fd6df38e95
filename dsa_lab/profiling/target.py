"""The process Nsight Compute runs: every configuration's decode step, logits calls opened to ncu.

`python -m dsa_lab.profile --ncu-target ...` builds one cache per batch size, then per
(next_n, strategy) checks the step against the reference, warms it up, and runs it
`repeats` times with the phases as NVTX ranges and each backend call between
cudaProfilerStart/Stop, so `ncu --profile-from-start off` (or `--nvtx --nvtx-include
"logits/"`) sees only the logits kernels. A marker kernel before each step numbers it.
A manifest (JSON) records every configuration, what ran and why anything did not.
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

from dsa_lab.decode import native_sizes_for, resolve_backend
from dsa_lab.env_info import device_name
from dsa_lab.kernels import LogitsBackend
from dsa_lab.metadata import DecodeMetadata, build_metadata
from dsa_lab.profiling.step import (
    check_correctness,
    phased_decode,
    profile_inputs,
    random_fp8_cache,
    reference_logits,
    useful_costs,
)
from dsa_lab.profiling.torch_profile import step_config, sync
from dsa_lab.topk import DEFAULT_TOPK
from dsa_lab.workload import DecodeBatch, uniform_batch


@dataclass(frozen=True)
class TargetPlan:
    """Which configurations one ncu run covers (one backend; batches x next_n x strategies)."""

    backend: str
    strategies: tuple[str, ...]
    batches: tuple[int, ...]
    context_len: int
    next_ns: tuple[int, ...]
    manifest: Path
    repeats: int = 1
    seed: int = 0
    topk: int = DEFAULT_TOPK
    time_budget_s: float = 240.0


@contextmanager
def profiler_window() -> Iterator[None]:
    """cudaProfilerStart/Stop: what ncu `--profile-from-start off` profiles."""
    torch.cuda.profiler.start()
    try:
        yield
    finally:
        torch.cuda.profiler.stop()


def _same_launches(a: DecodeMetadata, b: DecodeMetadata) -> bool:
    return len(a.launches) == len(b.launches) and all(
        torch.equal(x.token_rows, y.token_rows)
        and torch.equal(x.context_lens, y.context_lens)
        and torch.equal(x.block_table, y.block_table)
        for x, y in zip(a.launches, b.launches)
    )


def _config(kernel: LogitsBackend, batch: DecodeBatch, strategy: str, index: int, device: torch.device) -> dict[str, Any]:
    native = tuple(native_sizes_for(kernel, device))
    return {
        "index": index,
        **step_config(batch, device, strategy, kernel),
        "native_sizes": list(native),
        **useful_costs(batch, strategy, native),
        "status": "pending",
        "reason": "",
        "same_as": None,
    }


def run_target(
    plan: TargetPlan,
    device: torch.device | None = None,
    marker: Callable[[int, torch.device], None] | None = None,
    window: Callable[[], AbstractContextManager[object]] = profiler_window,
) -> dict[str, Any]:
    """Run every configuration of `plan`; write and return the manifest.

    Defaults are the GPU, the Triton marker and cudaProfilerStart/Stop windows; tests
    pass a CPU device, a recording marker and `nullcontext` to check the bookkeeping.
    """
    if device is None:
        device = torch.device("cuda")
    if marker is None:
        from dsa_lab.profiling.marker import launch_marker as marker
    nvtx = device.type == "cuda"
    kernel = resolve_backend(plan.backend)
    manifest: dict[str, Any] = {"backend": plan.backend, "device": device_name(device), "configs": [], "steps": [], "complete": False}
    started = time.perf_counter()
    for batch_size in plan.batches:
        cache = random_fp8_cache(uniform_batch(batch_size, plan.context_len, 1), plan.seed, device)
        for next_n in plan.next_ns:
            batch = uniform_batch(batch_size, plan.context_len, next_n)
            inputs = profile_inputs(batch, plan.seed, device, cache)
            reference = None
            seen: list[tuple[int, DecodeMetadata]] = []
            for strategy in plan.strategies:
                config = _config(kernel, batch, strategy, len(manifest["configs"]), device)
                manifest["configs"].append(config)
                if time.perf_counter() - started > plan.time_budget_s:
                    config.update(status="skipped", reason=f"time budget of {plan.time_budget_s:g} s spent")
                    continue
                try:
                    metadata = build_metadata(strategy, batch, cache.block_table, native_sizes_for(kernel, device))
                    config.update(logits_calls=len(metadata.launches), kernel_rows=metadata.kernel_rows)
                    twin = next((i for i, other in seen if _same_launches(metadata, other)), None)
                    if twin is not None:
                        config.update(status="same_as", same_as=twin, reason=f"launches identical to {manifest['configs'][twin]['strategy']}")
                        continue
                    reference = reference if reference is not None else reference_logits(inputs)
                    result = phased_decode(inputs, strategy, kernel, plan.topk)
                    config["rel_err"] = check_correctness(result, reference, f"{kernel.name} {strategy} {batch.describe()}")
                except (ValueError, RuntimeError) as err:  # refused, unsupported, unavailable, or a failing kernel
                    config.update(status="skipped", reason=str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}")
                    continue
                seen.append((config["index"], metadata))
                for repeat in range(plan.repeats):
                    number = len(manifest["steps"])
                    sync(device)
                    with window():
                        marker(number, device)
                    phased_decode(inputs, strategy, kernel, plan.topk, nvtx=nvtx, logits_window=window, check=False)
                    sync(device)
                    manifest["steps"].append({"marker": number, "config": config["index"], "repeat": repeat})
                config["status"] = "profiled"
                _write(plan.manifest, manifest)
            del inputs, reference
        del cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    manifest["complete"] = True
    _write(plan.manifest, manifest)
    return manifest


def _write(path: Path, manifest: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, default=str))
    tmp.replace(path)


def target_main(args: Sequence[str]) -> int:
    """Entry for `python -m dsa_lab.profile --ncu-target ...` (prints nothing on stdout: ncu's CSV goes there)."""
    import argparse

    from dsa_lab.metadata import STRATEGIES

    parser = argparse.ArgumentParser(prog="python -m dsa_lab.profile --ncu-target")
    parser.add_argument("--ncu-target", action="store_true", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--strategy", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--batch", nargs="+", type=int, required=True)
    parser.add_argument("--context-len", type=int, required=True)
    parser.add_argument("--next-n", nargs="+", type=int, required=True)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--topk", type=int, default=DEFAULT_TOPK)
    parser.add_argument("--time-budget-s", type=float, default=240.0)
    ns = parser.parse_args(args)
    if not torch.cuda.is_available():
        print("ncu target: no CUDA device; the ncu target profiles GPU kernels only", file=sys.stderr)
        return 2
    plan = TargetPlan(
        ns.backend, tuple(ns.strategy), tuple(ns.batch), ns.context_len, tuple(ns.next_n), ns.manifest,
        ns.repeats, ns.seed, ns.topk, ns.time_budget_s,
    )  # fmt: skip
    try:
        run_target(plan)
    except (ValueError, RuntimeError) as err:
        print(f"ncu target: error: {err}", file=sys.stderr)
        return 2
    return 0
