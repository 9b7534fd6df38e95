"""Profile a grid of configurations: torch.profiler in this process, Nsight Compute over the target.

Configurations that fail correctness, or that a backend cannot run, are recorded with
the reason and skipped; the grid goes on. One ncu run per backend covers the whole grid
in one target process (`target.py`), so CUDA start-up and inputs are paid once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from dsa_lab import store
from dsa_lab.errors import as_int, check_choice, check_int_sequence, check_range
from dsa_lab.kernels import get_backend
from dsa_lab.metadata import STRATEGIES
from dsa_lab.profiling.ncu import (
    CHIPS,
    NcuStatus,
    NcuUnavailable,
    missing_metrics,
    ncu_command,
    ncu_failure,
    query_metric_names,
    require_ncu,
    usable_metrics,
)
from dsa_lab.profiling.ncu_tables import METRICS, attach_configs, parse_ncu_csv, summarize_ncu
from dsa_lab.profiling.step import profile_inputs, random_fp8_cache, reference_logits
from dsa_lab.profiling.torch_profile import compare_in_one_trace, profile_decode_step
from dsa_lab.topk import DEFAULT_TOPK, MAX_TOPK
from dsa_lab.workload import MAX_NEXT_N, MAX_SEQ_LEN, uniform_batch

MAX_PROFILE_BATCH = 4096
KERNELS_PER_STEP_CAP = 17  # ncu --launch-count per step: the marker + up to 16 kernels in the logits calls
TARGET_MARGIN_S = 45.0  # of an ncu run's timeout: ncu and CUDA start-up, the config in flight, teardown
TRACE_STRATEGIES = ("native", "flatten")


@dataclass(frozen=True)
class ProfileSpec:
    """The grid: backends x batch sizes x next_n x strategies, at one context length."""

    backends: tuple[str, ...]
    strategies: tuple[str, ...]
    batches: tuple[int, ...]
    context_len: int
    next_ns: tuple[int, ...]
    seed: int = 0
    topk: int = DEFAULT_TOPK
    repeats: int = 1  # ncu steps per configuration
    trace: bool = True

    def __post_init__(self) -> None:
        """Every value checked (ints are never truncated); backend names are checked where they
        are looked up, so an unknown one is recorded as skipped with the allowed names."""
        for strategy in self.strategies:
            check_choice("strategy", strategy, STRATEGIES)
        if not (self.backends and self.strategies and self.batches and self.next_ns):
            raise ValueError("backends, strategies, batches and next_ns: each needs at least one value")
        if isinstance(self.backends, str) or not all(isinstance(name, str) for name in self.backends):
            raise ValueError(f"backends={self.backends!r}: need a tuple of backend names")
        object.__setattr__(self, "batches", check_int_sequence("batches", self.batches, 1, MAX_PROFILE_BATCH))
        object.__setattr__(self, "next_ns", check_int_sequence("next_ns", self.next_ns, 1, MAX_NEXT_N))
        object.__setattr__(self, "context_len", check_range("context_len", self.context_len, max(self.next_ns), MAX_SEQ_LEN))
        object.__setattr__(self, "seed", as_int("seed", self.seed))
        object.__setattr__(self, "topk", check_range("topk", self.topk, 1, MAX_TOPK))
        object.__setattr__(self, "repeats", check_range("repeats", self.repeats, 1, 1000))
        check_choice("trace", self.trace, (False, True))

    @property
    def trace_point(self) -> tuple[int, int]:
        """(batch, next_n) of the comparison trace: the largest batch, next_n 4 if swept."""
        return max(self.batches), 4 if 4 in self.next_ns else max(self.next_ns)

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


@dataclass
class ProfileRun:
    """What one profile produced; `folder` is None for runs held in memory only."""

    kernels: pd.DataFrame
    phases: pd.DataFrame
    ncu: pd.DataFrame
    configs: list[dict[str, Any]]
    provenance: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    raw_ncu: str = ""
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (folder, problem) of stored runs passed over

    @property
    def ncu_summary(self) -> pd.DataFrame:
        return summarize_ncu(self.ncu)


def _skip(backend: str, strategy: str, batch: int, context_len: int, next_n: int, tool: str, reason: str) -> dict[str, Any]:
    return {
        "tool": tool, "backend": backend, "strategy": strategy, "batch_size": batch, "context_len": context_len,
        "next_n": next_n, "status": "skipped", "reason": reason,
    }  # fmt: skip


def backend_problem(name: str, device: torch.device) -> str | None:
    """Why a backend cannot run on `device` (unknown name, or unavailable), or None."""
    try:
        backend = get_backend(name)
    except ValueError as err:
        return str(err)
    state = backend.availability(device)
    return None if state.ok else f"backend {name!r} unavailable on {device}: {state.reason}"


def run_torch_sweep(
    spec: ProfileSpec,
    device: torch.device,
    trace_dir: Path | None = None,
    log: Callable[[str], None] = print,
    budget_s: float | None = None,
) -> ProfileRun:
    """torch.profiler over the grid, in grid order; refused, unsupported or failing configurations
    are recorded with the reason, not fatal. Configurations not started within `budget_s` are
    recorded as skipped, so a slow compile cannot eat the time of what follows."""
    started = time.perf_counter()
    kernels, phases, configs = [], [], []
    usable = []
    for name in spec.backends:
        problem = backend_problem(name, device)
        if problem:
            log(f"skip backend {name}: {problem}")
            configs += [_skip(name, s, b, spec.context_len, n, "torch", problem) for b in spec.batches for n in spec.next_ns for s in spec.strategies]
        else:
            usable.append(name)
    for batch_size in spec.batches if usable else ():
        cache = random_fp8_cache(uniform_batch(batch_size, spec.context_len, 1), spec.seed, device)
        for next_n in spec.next_ns:
            inputs = profile_inputs(uniform_batch(batch_size, spec.context_len, next_n), spec.seed, device, cache)
            reference = reference_logits(inputs)
            for name in usable:
                ok = []
                for strategy in spec.strategies:
                    if budget_s is not None and time.perf_counter() - started > budget_s:
                        configs.append(_skip(name, strategy, batch_size, spec.context_len, next_n, "torch", f"time budget of {budget_s:g} s spent"))
                        continue
                    try:
                        result = profile_decode_step(inputs, strategy, name, topk=spec.topk, reference=reference)
                    except (ValueError, RuntimeError) as err:  # refused, unsupported, unavailable, or a failing kernel
                        reason = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
                        log(f"skip {name} {strategy} B={batch_size} n={next_n}: {reason}")
                        configs.append(_skip(name, strategy, batch_size, spec.context_len, next_n, "torch", reason))
                        continue
                    ok.append(strategy)
                    kernels.append(result.kernels)
                    phases.append(result.phases)
                    configs.append({"tool": "torch", **result.config, "status": "profiled", "reason": ""})
                    step_us = float(result.phases["device_us"].sum())
                    log(f"torch {name} {strategy} B={batch_size} n={next_n}: {result.config['logits_calls']} logits call(s), step {step_us:.1f} us")
                wanted = [s for s in TRACE_STRATEGIES if s in ok]
                if spec.trace and trace_dir is not None and (batch_size, next_n) == spec.trace_point and wanted:
                    compare_in_one_trace(inputs, wanted, name, trace_dir / f"trace_{name}.json.gz", spec.topk)
            del inputs, reference
        del cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return ProfileRun(_concat(kernels), _concat(phases), pd.DataFrame(), configs)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _target_args(spec: ProfileSpec, backend: str, manifest: Path, budget_s: float) -> list[str]:
    return [
        sys.executable, "-m", "dsa_lab.profile", "--ncu-target", "--backend", backend,
        "--strategy", *spec.strategies, "--batch", *map(str, spec.batches), "--context-len", str(spec.context_len),
        "--next-n", *map(str, spec.next_ns), "--manifest", str(manifest), "--repeats", str(spec.repeats),
        "--seed", str(spec.seed), "--topk", str(spec.topk), "--time-budget-s", f"{budget_s:g}",
    ]  # fmt: skip


def _child_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


@dataclass
class NcuOutcome:
    kernels: pd.DataFrame
    configs: list[dict[str, Any]]
    raw: str
    metrics: list[str]
    dropped: list[str]


def run_ncu_sweep(
    spec: ProfileSpec, status: NcuStatus, device: torch.device, timeout_s: float = 300.0, log: Callable[[str], None] = print
) -> NcuOutcome:
    """One ncu run per backend over the grid (kernel replay, logits kernels only)."""
    ncu = require_ncu(status)
    if device.type != "cuda":
        raise NcuUnavailable(f"ncu profiles CUDA kernels; device is {device} (use --torch on a machine without a GPU)")
    chip = CHIPS.get(torch.cuda.get_device_capability(device))
    metrics, dropped = usable_metrics(list(METRICS.values()), query_metric_names(ncu, chip) if chip else set())
    frames, configs, raw = [], [], []
    for backend in spec.backends:
        problem = backend_problem(backend, device)
        if problem:
            configs += [_skip(backend, s, b, spec.context_len, n, "ncu", problem) for b in spec.batches for n in spec.next_ns for s in spec.strategies]
            continue
        kernels, manifest, output = run_ncu_backend(ncu, spec, backend, metrics, dropped, timeout_s, log)
        raw.append(f"### ncu run for backend {backend}\n{output}")
        frames.append(kernels)
        configs += [{"tool": "ncu", **{k: v for k, v in c.items() if k != "index"}} for c in manifest.get("configs", [])]
    return NcuOutcome(_concat(frames), configs, "\n".join(raw), metrics, dropped)


def run_ncu_backend(
    ncu: str, spec: ProfileSpec, backend: str, metrics: list[str], dropped: list[str], timeout_s: float, log: Callable[[str], None]
) -> tuple[pd.DataFrame, dict[str, Any], str]:
    """ncu over the target for one backend: (kernel rows with configs, the manifest, ncu's output).

    Metrics ncu reports as unknown move from `metrics` to `dropped` and the run is retried.
    """
    steps = len(spec.batches) * len(spec.next_ns) * len(spec.strategies) * spec.repeats
    with tempfile.TemporaryDirectory(prefix="dsa_lab_ncu_") as tmp:
        manifest_path = Path(tmp) / "manifest.json"
        target = _target_args(spec, backend, manifest_path, max(30.0, timeout_s - TARGET_MARGIN_S))
        for _ in range(3):  # retried only when ncu names metrics it does not know
            command = ncu_command(ncu, metrics, target, launch_count=steps * KERNELS_PER_STEP_CAP)
            log(f"ncu {backend}: {len(metrics)} metrics, up to {steps} steps")
            started = time.perf_counter()
            try:
                proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=_child_env())
                output, code = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as err:
                output = _text(err.stdout) + _text(err.stderr)
                code = -1
                log(f"ncu {backend}: stopped after {timeout_s:g} s; keeping what it printed")
            missing = {name.split(".")[0] for name in missing_metrics(output)}  # ncu may quote a regex form
            unknown = [m for m in metrics if m.split(".")[0] in missing]
            if not unknown:
                break
            metrics[:] = [m for m in metrics if m not in unknown]
            dropped += unknown
        log(f"ncu {backend}: exit {code} after {time.perf_counter() - started:.0f} s")
        manifest = _read_manifest(manifest_path)
    kernels = attach_configs(parse_ncu_csv(output), manifest)
    if kernels.empty:
        failure = ncu_failure(output, code) or "ncu profiled no logits kernel"
        log(f"ncu {backend}: {failure}")
        for config in manifest.get("configs", []):
            if config.get("status") == "profiled":
                config.update(status="failed", reason=failure)
    return kernels, manifest, output


def _read_manifest(path: Path) -> dict[str, Any]:
    """The target's manifest (absent when it never started); a damaged one names the file."""
    if not path.exists():
        return {"configs": [], "steps": []}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise store.RunFormatError(f"{path}: the ncu target's manifest is not valid JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise store.RunFormatError(f"{path}: the ncu target's manifest is not a JSON object")
    return manifest


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value
