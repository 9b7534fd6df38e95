"""`dsa-lab bench` and `dsa-lab profile`: two modes of one harness, one grammar of flags.

Both take a grid the same way: a `--preset`, each axis overridable with a comma-separated
list (`--next-n 1,2,4 --context 8K,mixed:1K-64K --strategy all`), `--seed`, and
`--device auto|cpu|cuda|cuda:N`; unknown values are rejected with the allowed ones. Both
write a run folder, `--out PATH` or `ROOT/<device>/[profiles/]<run-id>`.

bench: `--max-minutes` (held even against a hung kernel: `--point-timeout`), `--max-points`,
`--resume` (the spec comes from the run's provenance), `--retry-errors`; ends with a table
in µs. An interrupt exits 130 and prints the command that resumes the run.
profile: `--tool torch,ncu`, `--topk`, `--repeats`, `--torch-budget`, `--ncu-timeout`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

GRID_AXES = ("backend", "strategy", "batch", "context", "next_n", "cache_dtype", "heads", "head_dim")  # = point.AXES
PRESET_NAMES = ("ci", "smoke", "h200-full", "sm100")  # = point.PRESETS
TOOLS = ("torch", "ncu")
INTERRUPTED = 130


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the grammar both modes share


def add_grid_flags(parser: argparse.ArgumentParser, default_root: str = "data") -> None:
    """The flags that choose a grid, a device and a run folder (the same for bench and profile)."""
    grid = parser.add_argument_group("grid (comma-separated lists)")
    grid.add_argument("--preset", choices=PRESET_NAMES, default=None, help="base axes (default: ci)")
    for axis in GRID_AXES:
        extra = " or 'all'" if axis == "strategy" else ""
        grid.add_argument(f"--{axis.replace('_', '-')}", dest=axis, default=None, metavar="LIST",
                          help=f"{axis} values, comma-separated{extra}")  # fmt: skip
    grid.add_argument("--seed", type=int, default=None)
    where = parser.add_argument_group("device and run folder")
    where.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda or cuda:N (default: auto)")
    where.add_argument("--out", default=None, help="run folder (default: ROOT/<device>/<run-id>)")
    where.add_argument("--root", default=default_root, help=f"where run folders live (default: {default_root})")
    where.add_argument("--run-id", default=None, help="one folder name (default: <preset or mode>-<UTC time>)")


def resolve_device(text: str) -> Any:
    """'auto' -> cuda when a GPU is visible, else cpu; otherwise `errors.as_device` (a device that exists here)."""
    import torch

    from dsa_lab.errors import as_device

    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return as_device("--device", text)
    except ValueError as err:
        raise ValueError(f"{err} (or 'auto')") from None


def spec_from_args(args: argparse.Namespace, base: Any = None) -> Any:
    """The grid: `base` (or the preset) with every axis given on the command line replaced."""
    from dsa_lab.bench.point import parse_values, preset

    spec = base if base is not None else preset(args.preset or "ci")
    overrides: dict[str, Any] = {
        axis: parse_values(axis, getattr(args, axis)) for axis in GRID_AXES if getattr(args, axis) is not None
    }
    if args.seed is not None:
        overrides["seed"] = args.seed
    return spec.with_axes(**overrides) if overrides else spec


def _grid_given(args: argparse.Namespace) -> bool:
    return args.preset is not None or args.seed is not None or any(getattr(args, a) is not None for a in GRID_AXES)


def run_dir_from_args(args: argparse.Namespace, device: Any, prefix: str, sub: str | None = None) -> Path:
    """--out as given, else ROOT/<device>/[sub/]<run-id>, the run id one plain folder name (no '/' or '..')."""
    from dsa_lab import store
    from dsa_lab.env_info import device_name

    if args.out is not None:
        return Path(args.out)
    run_id = store.new_run_id(prefix) if args.run_id is None else args.run_id
    try:
        folder = store.run_folder(args.root, store.device_label(device_name(device)), run_id)
    except ValueError as err:
        raise ValueError(f"--run-id: {err}") from None
    return folder.parent / sub / folder.name if sub else folder


# ---------------------------------------------------------------- bench


def check_folder_flags(args: argparse.Namespace) -> None:
    """--out and --root name folders (an empty one would silently mean the working directory); --run-id
    goes with --root, not with --out (which names the folder itself)."""
    for flag, value in (("--out", args.out), ("--root", args.root)):
        if value is not None and not str(value).strip():
            raise ValueError(f"{flag}={value!r}: give a folder")
    if args.out is not None and args.run_id is not None:
        raise ValueError(f"--run-id={args.run_id!r} with --out={args.out!r}: --out names the run folder itself; "
                         "give --out, or --root and --run-id")  # fmt: skip


def _check_limits(args: argparse.Namespace) -> None:
    from dsa_lab.errors import check_positive, check_range

    check_folder_flags(args)
    if args.retry_errors and not args.resume:
        raise ValueError("--retry-errors: re-runs the error rows of a run being resumed; give --resume too")
    for flag, value, check in (
        ("--max-points", args.max_points, lambda name, v: check_range(name, v, 1, 1 << 31)),
        ("--max-minutes", args.max_minutes, lambda name, v: check_positive(name, v, allow_zero=True)),
        ("--max-seconds-per-point", args.max_seconds_per_point, check_positive),
        ("--point-timeout", args.point_timeout, check_positive),
    ):
        if value is not None:
            check(flag, value)


def bench_spec(args: argparse.Namespace, run_dir: Path | None) -> Any:
    """The grid of a bench command: on --resume without grid flags, the run's own spec."""
    import dataclasses

    from dsa_lab import store
    from dsa_lab.bench.point import SweepSpec

    if args.resume and not _grid_given(args) and run_dir is not None:
        store.require_run(run_dir)
        path = run_dir / store.PROVENANCE_FILE
        try:
            spec = SweepSpec.from_dict(store.read_provenance(path).get("spec"))
        except store.RunFormatError:
            raise
        except ValueError as err:
            raise store.RunFormatError(f"{path}: its spec cannot be read back ({err})") from None
    else:
        spec = spec_from_args(args)
    timing = spec.timing
    if args.graph:
        timing = dataclasses.replace(timing, use_graph=True)
    if args.warm_l2:
        timing = dataclasses.replace(timing, cold_l2=False)
    if args.max_seconds_per_point is not None:
        timing = dataclasses.replace(timing, max_seconds=args.max_seconds_per_point)
    return spec.with_axes(timing=timing) if timing != spec.timing else spec


def results_table(results: Any) -> str:
    """The timed points as µs medians: a row per (backend, strategy, batch, context), a column per next_n."""
    import pandas as pd

    ok = results[results["status"] == "ok"]
    if ok.empty:
        return "no point was timed ok"
    table = ok.pivot_table(index=["backend", "strategy", "batch", "context"], columns="next_n",
                           values="median_ms", aggfunc="first", sort=False) * 1e3  # fmt: skip
    table.columns = [f"n={n}" for n in table.columns]
    with pd.option_context("display.width", 200, "display.max_rows", 1000, "display.max_columns", 30):
        return "median kernel time per decode step (µs):\n" + table.to_string(float_format="{:.1f}".format, na_rep="-")


def numerics_notes(spec: Any, device: Any) -> list[str]:
    """One line per backend whose numerics here differ from the defaults (`bench.numerics`): what the
    user of an SM100 GPU should know before reading the rows (scale format, check bound, why)."""
    from dsa_lab.bench.numerics import numerics_record

    record = numerics_record(spec.backend, spec.cache_dtype, spec.check_tolerance, device)
    return [
        f"numerics: {name} on {device}: K scales {entry['k_scales']}, checked to {entry['check_tolerance']:g} "
        f"({entry['reason']})"
        for name, entry in record["backends"].items()
        if entry["k_scales"] != "float32" or entry["check_tolerance"] != spec.check_tolerance
    ]


def _cmd_bench(args: argparse.Namespace) -> int:
    from dsa_lab import store
    from dsa_lab.bench.sweep import DEFAULT_POINT_TIMEOUT_S, estimate_seconds, resume_command, run_sweep, skipped_here

    _check_limits(args)
    device = resolve_device(args.device)
    run_dir = Path(args.out) if args.out is not None else None
    if args.resume and run_dir is None and args.run_id is None:
        raise ValueError("--resume: name the run to continue with --out PATH (or --root and --run-id)")
    if run_dir is None and not args.dry_run:
        run_dir = run_dir_from_args(args, device, args.preset or "ci")
    spec = bench_spec(args, run_dir)
    points = spec.points()
    if args.dry_run:
        skipped = skipped_here(spec, device)
        print(f"{len(points)} points ({skipped} skipped here on {device.type}); "
              f"estimated H200 time ~{estimate_seconds(spec) / 60:.1f} min")  # fmt: skip
        for line in numerics_notes(spec, device):
            print(line)
        return 0
    if args.preset == "sm100" and device.type == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        if major != 10:
            _log(f"dsa-lab bench: note: preset sm100 on a GPU of compute capability {major}.{minor} (not SM100)")
    print(f"sweep: {len(points)} points; backends {spec.backend}; batch {spec.batch}; context {spec.context}; "
          f"next_n {spec.next_n}; strategies {spec.strategy}; device {device}", flush=True)  # fmt: skip
    for line in numerics_notes(spec, device):
        print(line, flush=True)
    summary = run_sweep(
        spec, run_dir, device, resume=args.resume, retry_errors=args.retry_errors, max_points=args.max_points,
        max_minutes=args.max_minutes, point_timeout_s=args.point_timeout or DEFAULT_POINT_TIMEOUT_S,
        ceilings=args.measure_ceilings, progress=not args.no_progress,
        extra_provenance={"preset": args.preset or "ci", "command": list(sys.argv)},
    )  # fmt: skip
    print(
        f"run {summary.run_dir}: {summary.recorded_now} points now, {summary.recorded_before} before, "
        f"{summary.remaining} left of {summary.total}; {summary.counts}; stop: {summary.stop_reason}"
    )
    if summary.stop_reason == "interrupted":
        _log(f"dsa-lab bench: interrupted; the points so far are kept. Resume with: {resume_command(summary.run_dir)}")
        return INTERRUPTED
    print(results_table(store.load_run(summary.run_dir).results))
    if summary.remaining:
        print(f"{summary.remaining} points left; continue with: {resume_command(summary.run_dir)}")
    return 0


# ---------------------------------------------------------------- profile


def _tools(text: str) -> tuple[str, ...]:
    from dsa_lab.errors import check_choice

    tools = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not tools:
        raise ValueError("--tool: give at least one of torch, ncu (comma-separated)")
    for tool in tools:
        check_choice("--tool", tool, TOOLS)
    return tools


def _cmd_profile(args: argparse.Namespace) -> int:
    import pandas as pd

    from dsa_lab import store
    from dsa_lab.errors import check_positive
    from dsa_lab.profiling.ncu import NcuUnavailable, detect_ncu
    from dsa_lab.profiling.runs import profile_provenance, write_tables
    from dsa_lab.profiling.sweep import ProfileRun, ProfileSettings, run_ncu, run_torch

    tools = _tools(args.tool)
    check_folder_flags(args)
    for flag, value in (("--torch-budget", args.torch_budget), ("--ncu-timeout", args.ncu_timeout)):
        if value is not None:
            check_positive(flag, value)
    device = resolve_device(args.device)
    spec = spec_from_args(args)
    settings = ProfileSettings(args.topk, args.repeats, not args.no_trace)
    status = detect_ncu() if "ncu" in tools else None
    ncu_skipped = None
    if status is not None:
        if not status.usable:
            ncu_skipped = "; ".join(status.problems)
        elif device.type != "cuda":
            ncu_skipped = f"ncu profiles CUDA kernels; device is {device}"
        if ncu_skipped and tools == ("ncu",):
            raise NcuUnavailable(ncu_skipped)
        _log(
            f"dsa-lab profile: Nsight Compute {'skipped: ' + ncu_skipped if ncu_skipped else 'path: ' + status.reason}"
        )
    out = run_dir_from_args(args, device, "profile", sub="profiles")
    store.check_new_folder(out)
    with store.run_lock(out):
        provenance = profile_provenance(out.name, device, spec, settings, status)
        provenance["ncu_skipped"] = ncu_skipped
        store.create_run(out, provenance)
        empty = pd.DataFrame()
        run = run_torch(spec, device, settings, out, _log, args.torch_budget) if "torch" in tools else ProfileRun(
            empty, empty, empty, [])  # fmt: skip
        write_tables(run, out)  # written now and again after ncu, so a cut-short ncu run keeps these
        if status is not None and not ncu_skipped:
            outcome = run_ncu(spec, settings, status, device, out, args.ncu_timeout, _log)
            run.ncu, run.raw_ncu, run.configs = outcome.kernels, outcome.raw, run.configs + outcome.configs
            store.update_provenance(out, ncu_metrics=outcome.metrics, ncu_metrics_dropped=outcome.dropped,
                                    ncu_reports=[p.name for p in outcome.reports])  # fmt: skip
            write_tables(run, out)
    _print_profile(run)
    print(f"profile run written to {out}")
    return 0


def _print_profile(run: Any) -> None:
    import pandas as pd

    from dsa_lab.profiling.torch_profile import summarize_torch

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        torch_summary = summarize_torch(run.kernels)
        if not torch_summary.empty:
            print(torch_summary.drop(columns=["device_name"]).to_string(index=False, float_format="{:.4g}".format))
        ncu_summary = run.ncu_summary
        if not ncu_summary.empty:
            shown = ["backend", "strategy", "batch", "next_n", "duration_ns", "dram_read_per_unique", "l2_hit_pct",
                     "tensor_gmma_pct", "tensor_hmma_pct", "effective_tbps"]  # fmt: skip
            print(
                ncu_summary[[c for c in shown if c in ncu_summary]].to_string(index=False, float_format="{:.4g}".format)
            )
    for config in run.configs:
        if config.get("status") not in ("profiled", "same_as"):
            print(f"{config['tool']} {config['backend']} {config['strategy']} B={config['batch']} L={config['context']} "
                  f"n={config['next_n']}: {config['status']}: {config['reason']}")  # fmt: skip


# ---------------------------------------------------------------- registration


def register_cli(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="check and time a grid of decode points into a run folder (resumable)",
                           description=__doc__.split("\n\n")[0], allow_abbrev=False)  # fmt: skip
    add_grid_flags(bench)
    run = bench.add_argument_group("running")
    run.add_argument("--resume", action="store_true", help="continue the run in --out (its spec from its provenance)")
    run.add_argument(
        "--retry-errors", action="store_true", help="with --resume: run points whose last row is an error again"
    )
    run.add_argument(
        "--max-minutes", type=float, default=None, help="stop after this long, even inside a point (resumable)"
    )
    run.add_argument("--max-points", type=int, default=None, help="stop after this many new points (resumable)")
    run.add_argument("--point-timeout", type=float, default=None,
                     help="seconds one point may take (JIT compile, check, timing) before it is an error (default 300)")  # fmt: skip
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--dry-run", action="store_true", help="count the points and estimate the H200 time; run nothing")
    timing = bench.add_argument_group("timing")
    timing.add_argument("--graph", action="store_true", help="time CUDA-graph replays (warm L2)")
    timing.add_argument("--warm-l2", action="store_true", help="do not flush L2 between timed calls")
    timing.add_argument("--max-seconds-per-point", type=float, default=None, help="timing budget of one point")
    timing.add_argument(
        "--measure-ceilings", action="store_true", help="measure read bandwidth and FP8 GEMM rate first"
    )
    bench.set_defaults(func=_cmd_bench)

    profile = sub.add_parser(
        "profile", help="profile a grid of decode points: torch.profiler tables, Nsight Compute counters",
        description="Profile one decode step per point of a grid: kernel tables and a Chrome trace from "
        "torch.profiler; DRAM bytes, L2 hit rate, occupancy and tensor-pipe use from Nsight Compute "
        "(reports kept as .ncu-rep). Every point is checked against the reference first.",
        allow_abbrev=False,
    )  # fmt: skip
    add_grid_flags(profile)
    tools = profile.add_argument_group("profiling")
    tools.add_argument("--tool", default="torch,ncu", help="torch, ncu or torch,ncu (default: both)")
    tools.add_argument("--topk", type=int, default=2048, help="top-k of the profiled step (default 2048)")
    tools.add_argument("--repeats", type=int, default=1, help="ncu steps per point")
    tools.add_argument("--torch-budget", type=float, help="seconds after which torch.profiler starts no new point")
    tools.add_argument("--ncu-timeout", type=float, default=300.0, help="seconds per backend's ncu run")
    tools.add_argument("--no-trace", action="store_true", help="skip the native-vs-flatten Chrome trace")
    profile.set_defaults(func=_cmd_profile)
