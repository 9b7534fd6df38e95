"""`dsa-lab bench`: run (or resume) a sweep into a run folder `data/<device>/<run_id>/`.

Axes come from a preset, each overridable with a comma-separated flag
(`--next-n 1,2,4 --context 8K,mixed:1K-64K`); unknown values are rejected with the
allowed ones. `--max-minutes` stops cleanly between points; `--resume` continues a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from dsa_lab import store
from dsa_lab.bench.sweep import AXES, PRESETS, SweepSpec, estimate_seconds, expand, preset, run_sweep, skip_reason
from dsa_lab.env_info import device_name
from dsa_lab.errors import as_device, check_positive, check_range

INT_AXES = ("batch", "next_n", "heads", "head_dim")


def _values(axis: str, text: str) -> tuple:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"--{axis.replace('_', '-')}: give at least one value")
    if axis in INT_AXES:
        try:
            return tuple(int(part) for part in parts)
        except ValueError:
            raise ValueError(f"--{axis.replace('_', '-')}={text!r}: values must be integers") from None
    return tuple(parts)


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    spec = preset(args.preset)
    overrides = {axis: _values(axis, getattr(args, axis)) for axis in AXES if getattr(args, axis) is not None}
    if args.seed is not None:
        overrides["seed"] = args.seed
    timing = spec.timing
    if args.graph:
        timing = dataclasses.replace(timing, use_graph=True)
    if args.warm_l2:
        timing = dataclasses.replace(timing, cold_l2=False)
    if args.max_seconds_per_point is not None:
        timing = dataclasses.replace(timing, max_seconds=args.max_seconds_per_point)
    return spec.with_axes(**overrides, timing=timing)


def _run_dir(args: argparse.Namespace, device: torch.device) -> Path:
    """--out as given, else ROOT/<device>/<run-id> with --run-id one plain folder name (no '/' or '..')."""
    if args.out:
        return Path(args.out)
    run_id = store.new_run_id(args.preset) if args.run_id is None else args.run_id
    try:
        return store.run_folder(args.root, store.device_label(device_name(device)), run_id)
    except ValueError as err:
        raise ValueError(f"--run-id: {err}") from None


def _check_limits(args: argparse.Namespace) -> None:
    for flag, value, check in (
        ("--max-points", args.max_points, lambda name, v: check_range(name, v, 1, 1 << 31)),
        ("--max-minutes", args.max_minutes, lambda name, v: check_positive(name, v, allow_zero=True)),
        ("--max-seconds-per-point", args.max_seconds_per_point, check_positive),
    ):
        if value is not None:
            check(flag, value)


def _cmd_bench(args: argparse.Namespace) -> int:
    _check_limits(args)
    device = as_device("--device", args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    spec = spec_from_args(args)
    points = expand(spec)
    if args.dry_run:
        skipped = sum(skip_reason(p, device) is not None for p in points)
        print(f"{len(points)} points ({skipped} skipped here on {device.type}); "
              f"estimated H200 time ~{estimate_seconds(spec) / 60:.1f} min")  # fmt: skip
        return 0
    print(f"sweep: {len(points)} points; backends {spec.backend}; batch {spec.batch}; context {spec.context}; "
          f"next_n {spec.next_n}; strategies {spec.strategy}; device {device}")  # fmt: skip
    run_dir = _run_dir(args, device)
    if args.resume and not (run_dir / store.PROVENANCE_FILE).exists():
        raise ValueError(f"--resume: {run_dir} holds no run to resume (no {store.PROVENANCE_FILE})")
    summary = run_sweep(
        spec, run_dir, device, resume=args.resume, max_points=args.max_points, max_minutes=args.max_minutes,
        ceilings=args.measure_ceilings, progress=not args.no_progress,
        extra_provenance={"preset": args.preset, "command": list(sys.argv)},
    )  # fmt: skip
    print(
        f"run {summary.run_dir}: {summary.recorded_now} points now, {summary.recorded_before} before, "
        f"{summary.remaining} left of {summary.total}; {summary.counts}; stop: {summary.stop_reason}"
    )
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="check and time a sweep of decode points into a run folder")
    parser.add_argument("--preset", choices=PRESETS, default="ci", help="base axes (default: ci)")
    for axis in AXES:
        parser.add_argument(f"--{axis.replace('_', '-')}", dest=axis, default=None, help=f"comma-separated {axis} values")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--out", default=None, help="run folder (default: ROOT/<device>/<run-id>)")
    parser.add_argument("--root", default="data", help="where run folders live (default: data)")
    parser.add_argument("--run-id", default=None, help="default: <preset>-<UTC time>")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out / --run-id")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this long (resumable)")
    parser.add_argument("--max-points", type=int, default=None, help="stop after this many new points (resumable)")
    parser.add_argument("--graph", action="store_true", help="time CUDA-graph replays (warm L2)")
    parser.add_argument("--warm-l2", action="store_true", help="do not flush L2 between timed calls")
    parser.add_argument("--max-seconds-per-point", type=float, default=None, help="timing budget of one point")
    parser.add_argument("--measure-ceilings", action="store_true", help="measure read bandwidth and FP8 GEMM rate first")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--dry-run", action="store_true", help="count the points and estimate the H200 time; run nothing")
    parser.set_defaults(func=_cmd_bench)
