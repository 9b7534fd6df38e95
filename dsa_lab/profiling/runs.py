"""Profile runs on disk and in memory: store-format provenance, tables, loading, the CPU fallback.

A profile run is a store run folder (`provenance.json` from `dsa_lab.store.folders`, with
`kind: profile` and the harness's grid as `spec`) holding tables instead of timings:
`torch_kernels.parquet`, `torch_phases.parquet`, `ncu_kernels.parquet` (one row per logits
kernel, its point attached), `nsight_times.parquet` (`--tool nsight`: nsight-python's CUPTI
timer beside the harness's, `profiling.nsight_timing`), `ncu_raw.txt.gz` (ncu's own output),
`ncu_<backend>.ncu-rep` (the reports, for the Nsight Compute GUI) and Chrome traces
`trace_<backend>.json.gz`. Profile runs live under `data/<device>/profiles/<run_id>/`, out
of the way of `dsa-lab runs`, which lists timings.

Columns carry the harness's names (`dsa_lab.axes` and the plan's: batch, context,
heads, launches, strategy_kv_bytes, flops...). Runs stored before the harness was merged
used other names (batch_size, context_len, num_heads, logits_calls, modeled_kv_bytes,
useful_flops, device); `load_profile_run` renames them (`LEGACY_NAMES`), so old and new
runs read alike.

Nothing damaged is passed over silently: `scan_profile_runs` returns the folders it
ignored with the file and the problem (a provenance that cannot be read, or one without
`kind: profile` beside a profile run's files: tables, ncu output, reports, traces), a loaded
run carries them (`ProfileRun.ignored`) so a notebook can say which file it ignored and why,
and `find_profile_runs`, which returns only the runs, warns naming each one it passed over.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from dsa_lab import axes
from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.presets import preset
from dsa_lab.env_info import device_name
from dsa_lab.kernels import vllm_backend
from dsa_lab.model.gpus import ARCH_MAJORS
from dsa_lab.profiling.ncu import NcuStatus
from dsa_lab.profiling.sweep import ProfileRun, ProfileSettings, run_torch
from dsa_lab.store import folders as store
from dsa_lab.store.provenance import build_provenance, git_state
from dsa_lab.store.writes import write_atomic

KIND = "profile"
TABLES = {
    "torch_kernels": "torch.profiler: one row per (config, phase, kernel, grid)",
    "torch_phases": "torch.profiler: one row per (config, phase)",
    "ncu_kernels": "Nsight Compute: one row per profiled logits kernel, config attached",
    "nsight_times": "nsight-python (CUPTI) and the harness's timer on the same inputs: one row per point",
}
RAW_NCU = "ncu_raw.txt.gz"
CPU_LABEL = "CPU reference, not H200"
LEGACY_NAMES = {  # column names of profile runs stored before the harness was merged -> the harness's
    "batch_size": "batch",
    "context_len": "context",
    "num_heads": "heads",
    "logits_calls": "launches",
    "modeled_kv_bytes": "strategy_kv_bytes",
    "useful_flops": "flops",
    "device": "device_name",
}
LEGACY_SPEC = {
    "backends": "backend",
    "strategies": "strategy",
    "batches": "batch",
    "context_len": "context",
    "next_ns": "next_n",
}


def profile_provenance(
    run_id: str, device: torch.device, spec: SweepSpec, settings: ProfileSettings, status: NcuStatus | None
) -> dict[str, Any]:
    return build_provenance(
        run_id,
        device.type,
        device_name(device),
        "measured",
        spec.seed,
        "torch.profiler (one step after a warm-up) + Nsight Compute CLI (kernel replay, caches flushed)",
        spec.to_dict(),
        extra={
            "kind": KIND,
            "profile": dataclasses.asdict(settings),
            "ncu": status.as_dict() if status else None,
            "tables": TABLES,
        },
        backends=spec.backend,
    )


def _modern(frame: pd.DataFrame) -> pd.DataFrame:
    """A profile table under the harness's column names (older runs' names renamed, axes added since filled in)."""
    if "logits_calls" in frame.columns and "launches" in frame.columns:
        frame = frame.rename(columns={"launches": "kernel_launches"})  # old torch tables: kernel launch counts
    frame = frame.rename(columns={old: new for old, new in LEGACY_NAMES.items() if old in frame.columns})
    if "context" in frame.columns:
        frame["context"] = frame["context"].map(str)
    return axes.complete(frame) if not frame.empty else frame


def _modern_config(config: dict[str, Any]) -> dict[str, Any]:
    out = {LEGACY_NAMES.get(key, key): value for key, value in config.items()}
    if "context" in out:
        out["context"] = str(out["context"])
    return out


def _modern_spec(spec: Any) -> Any:
    if not isinstance(spec, dict) or "batches" not in spec:
        return spec
    out = {LEGACY_SPEC.get(key, key): value for key, value in spec.items()}
    out["context"] = [str(out["context"])]
    return out


def write_tables(run: ProfileRun, folder: Path) -> None:
    """Write the run's tables next to its provenance (atomically, one file each)."""
    tables = [("torch_kernels", run.kernels), ("torch_phases", run.phases), ("ncu_kernels", run.ncu)]
    for name, frame in [*tables, *([("nsight_times", run.nsight)] if not run.nsight.empty else [])]:
        write_atomic(folder / f"{name}.parquet", lambda handle, frame=frame: frame.to_parquet(handle, index=False))
    if run.raw_ncu:
        raw = gzip.compress(run.raw_ncu.encode("utf-8"))
        write_atomic(folder / RAW_NCU, lambda handle: handle.write(raw))
    store.update_provenance(folder, configs=run.configs)


@dataclass(frozen=True)
class ProfileRunScan:
    """Profile run folders found under a root (newest first) and those ignored, with why."""

    runs: list[Path]
    ignored: list[tuple[str, str]]  # (folder, problem naming the file)


def scan_profile_runs(root: str | Path) -> ProfileRunScan:
    """Every folder under `root` (any depth) with a provenance.json: profile runs are kept;
    timing runs are not profile runs and are left out; a damaged provenance is *ignored*
    with its problem (it might have been a profile run, and a reader must be told), and so is
    a folder holding profile tables whose provenance is not of kind 'profile'."""
    runs: list[tuple[str, Path]] = []
    ignored: list[tuple[str, str]] = []
    for path in sorted(Path(root).rglob(store.PROVENANCE_FILE)):
        try:
            provenance = store.read_provenance(path)
        except store.RunFormatError as err:
            ignored.append((str(path.parent), str(err)))
            continue
        if provenance.get("kind") == KIND:
            runs.append((provenance["created"], path.parent))
        elif files := profile_files(path.parent):
            ignored.append(
                (
                    str(path.parent),
                    f"{path}: holds a profile run's files ({', '.join(files[:3])}), but its kind is "
                    f"{provenance.get('kind')!r}, not {KIND!r}",
                )
            )
    return ProfileRunScan([folder for _, folder in sorted(runs, key=lambda item: item[0], reverse=True)], ignored)


def profile_files(folder: Path) -> list[str]:
    """The files in `folder` only a profile run writes: its tables, ncu's raw output and reports, Chrome traces."""
    names = {f"{name}.parquet" for name in TABLES} | {RAW_NCU}
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name in names or (p.name.startswith("ncu_") and p.suffix == ".ncu-rep") or p.name.startswith("trace_")
    )


def find_profile_runs(root: str | Path) -> list[Path]:
    """Profile run folders under `root` (any depth), newest first; each folder passed over as damaged is named in
    a warning (`scan_profile_runs` returns them)."""
    scan = scan_profile_runs(root)
    for folder, problem in scan.ignored:
        warnings.warn(f"find_profile_runs: ignored {folder}: {problem}", stacklevel=2)
    return scan.runs


def _read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several types for corrupt files
        raise store.RunFormatError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from None


def _read_raw_ncu(path: Path) -> str:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return handle.read()
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as err:
        raise store.RunFormatError(f"{path}: not a readable gzip text file ({type(err).__name__}: {err})") from None


def load_profile_run(folder: str | Path) -> ProfileRun:
    """Read a stored profile run; a table that was not produced loads as an empty frame, a
    damaged one raises `store.RunFormatError` naming the file."""
    folder = Path(folder)
    provenance = store.read_provenance(folder / store.PROVENANCE_FILE)
    if provenance.get("kind") != KIND:
        raise store.RunFormatError(f"{folder}: a {provenance.get('kind', 'timing')!r} run, not a profile run")
    configs = provenance.get("configs", [])
    if not isinstance(configs, list) or not all(isinstance(c, dict) for c in configs):
        raise store.RunFormatError(f"{folder / store.PROVENANCE_FILE}: 'configs' must be a list of objects")

    def table(name: str) -> pd.DataFrame:
        path = folder / f"{name}.parquet"
        return _modern(_read_table(path)) if path.is_file() else pd.DataFrame()

    raw_text = _read_raw_ncu(folder / RAW_NCU) if (folder / RAW_NCU).is_file() else ""
    provenance = {**provenance, "spec": _modern_spec(provenance.get("spec"))}
    configs = [_modern_config(c) for c in configs]
    return ProfileRun(
        table("torch_kernels"),
        table("torch_phases"),
        table("ncu_kernels"),
        configs,
        provenance,
        folder,
        raw_text,
        nsight=table("nsight_times"),
    )


def cpu_reference_run(
    batch: int = 2, context: str | int = 256, next_ns: tuple[int, ...] | None = None, topk: int = 64, seed: int = 0
) -> ProfileRun:
    """torch.profiler tables of the reference backend on this CPU, held in memory, labelled as such
    (`next_ns` None: the next_n SM90 DeepGEMM runs natively, as the shipped H200 profiles cover).

    Kineto's log level is raised (unless set) so that its per-session chatter and its
    expected complaint about the missing GPU stay out of notebooks.
    """
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    next_ns = vllm_backend().native_sizes_on(ARCH_MAJORS["sm90"]) if next_ns is None else next_ns
    spec = preset("ci").with_axes(
        batch=(batch,), context=(str(context),), next_n=tuple(next_ns), heads=(64,), head_dim=(128,), seed=seed
    )
    settings = ProfileSettings(topk=topk, trace=False)
    run = run_torch(spec, torch.device("cpu"), settings, None, log=lambda message: None)
    run.provenance = {
        "kind": KIND,
        "source": "measured",
        "device": "cpu",
        "device_name": CPU_LABEL,
        "run_id": "cpu-reference-in-memory",
        "created": pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds"),
        "git": git_state(),
        "spec": spec.to_dict(),
        "profile": dataclasses.asdict(settings),
        "ncu_skipped": "no GPU here: Nsight Compute needs CUDA kernels",
    }
    return run


def shipped_or_cpu_reference(root: str | Path, **cpu: Any) -> ProfileRun:
    """The newest readable profile run stored under `root`, else a fresh `cpu_reference_run(**cpu)`.

    Folders passed over (damaged provenance, unreadable tables) are in the result's
    `ignored` as (folder, problem), for the notebook to show (`ignored_note`).
    """
    scan = scan_profile_runs(root) if Path(root).is_dir() else ProfileRunScan([], [])
    ignored = list(scan.ignored)
    for folder in scan.runs:
        try:
            run = load_profile_run(folder)
        except store.RunFormatError as err:
            ignored.append((str(folder), str(err)))
            continue
        run.ignored = ignored
        return run
    run = cpu_reference_run(**cpu)
    run.ignored = ignored
    return run


def ignored_note(run: ProfileRun) -> str:
    """One line per stored folder the run's loader ignored, with why ('' when none was)."""
    return "\n".join(f"ignored {folder}: {problem}" for folder, problem in run.ignored)
