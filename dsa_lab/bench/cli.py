"""`dsa-lab bench`, and the grammar of flags every mode of the harness shares (`dsa-lab profile` too).

A grid is chosen the same way in every mode: a `--preset`, each axis of `dsa_lab.axes` overridable
with a comma-separated list (`--next-n 1,2,4 --context 8K,mixed:1K-64K --strategy all`), `--seed`,
and `--device auto|cpu|cuda|cuda:N`; unknown values are rejected with the allowed ones. Every mode
writes a run folder, `--out PATH` or `ROOT/<device>/[profiles/]<run-id>` (`add_grid_flags`,
`spec_from_args`, `run_dir_from_args`; `dsa_lab.profiling.cli` defines `dsa-lab profile` with them);
without either, ROOT is the checkout's `scratch/` (ignored by git), and the run is labelled scratch,
as is every CPU run (`store.is_scratch`): study data goes to data/ only when asked for.

bench: `--max-minutes` (held even against a hung kernel: `--point-timeout`), `--max-points`,
`--resume` (the spec comes from the run's provenance), `--retry-errors`; ends with a table
in µs. Its exit code says how the sweep ended: 0 when every point was recorded or a limit the
user set (`--max-points`, `--max-minutes`) stopped it (the command that resumes it is printed);
130 on an interrupt; 3 when a point hung inside C (`bench.guard.HUNG_EXIT_CODE`); `STOPPED_SHORT`
(4) when the device was lost, a backend called `sys.exit` (`exited`) or the loop crashed (`crashed`,
whose traceback follows): never 0 for a run that stopped short of what was asked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dsa_lab import axes
from dsa_lab.bench.presets import PRESETS

INTERRUPTED = 130
STOPPED_SHORT = 4  # the sweep ended before its points were recorded, not by a limit the user set


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the grammar both modes share


def add_grid_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that choose a grid, a device and a run folder (the same for bench and profile)."""
    grid = parser.add_argument_group("grid (comma-separated lists)")
    grid.add_argument("--preset", choices=PRESETS, default=None, help="base axes (default: ci)")
    for axis in axes.AXES:
        grid.add_argument(axis.flag, dest=axis.name, default=None, metavar="LIST", help=axis.help)
    grid.add_argument("--seed", type=int, default=None)
    grid.add_argument("--backend-module", action="append", default=[], metavar="FILE",
                      help="a Python file registering backends of your own (repeatable; docs/add_a_kernel.md)")  # fmt: skip
    where = parser.add_argument_group("device and run folder")
    where.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda or cuda:N (default: auto)")
    where.add_argument("--out", default=None, help="run folder (default: ROOT/<device>/<run-id>)")
    where.add_argument(
        "--root",
        default=None,
        help="where run folders live, e.g. data for study data (default: scratch/, ignored by git)",
    )
    where.add_argument("--run-id", default=None, help="one folder name (default: <preset or mode>-<UTC time>)")


def load_backend_modules(args: argparse.Namespace) -> None:
    """Register the backends of every --backend-module file (`kernels.external`), after checking that the
    files of DSA_LAB_BACKEND_MODULES loaded; ExternalBackendError names the file and what is wrong."""
    from dsa_lab.kernels import external

    external.check_environment()
    external.load_backend_files(args.backend_module)


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
    from dsa_lab.bench.presets import preset

    spec = base if base is not None else preset(args.preset or "ci")
    given = [axis for axis in axes.AXES if getattr(args, axis.name) is not None]
    overrides: dict[str, Any] = {axis.name: axis.parse(getattr(args, axis.name)) for axis in given}
    if args.seed is not None:
        overrides["seed"] = args.seed
    return spec.with_axes(**overrides) if overrides else spec


def _grid_given(args: argparse.Namespace) -> bool:
    return args.preset is not None or args.seed is not None or any(getattr(args, a) is not None for a in axes.NAMES)


def run_dir_from_args(args: argparse.Namespace, device: Any, prefix: str, sub: str | None = None) -> Path:
    """--out as given, else ROOT/<device>/[sub/]<run-id>, the run id one plain folder name (no '/' or '..')."""
    from dsa_lab.env_info import device_name
    from dsa_lab.paths import scratch_dir
    from dsa_lab.store import folders as store

    if args.out is not None:
        return Path(args.out)
    run_id = store.new_run_id(prefix) if args.run_id is None else args.run_id
    try:
        folder = store.run_folder(args.root or scratch_dir(), store.device_label(device_name(device)), run_id)
    except ValueError as err:
        raise ValueError(f"--run-id: {err}") from None
    return folder.parent / sub / folder.name if sub else folder


def scratch_run(args: argparse.Namespace, device: Any) -> bool:
    """A run is scratch when no --out or --root placed it, or when it is not on a CUDA GPU."""
    from dsa_lab.store import folders as store

    return (args.out is None and args.root is None) or store.scratch_device(device.type)


# ---------------------------------------------------------------- bench


def check_folder_flags(args: argparse.Namespace) -> None:
    """--out and --root name folders (an empty one would silently mean the working directory); --out is absent
    or a folder (not a link, a device or a file) and its last part is the run id, a plain name, checked before
    anything is measured (a run `load_run` refuses is a study lost at the end); --run-id goes with --root, not
    with --out (which names the folder itself)."""
    from dsa_lab.paths import check_target
    from dsa_lab.store import folders as store

    for flag, value in (("--out", args.out), ("--root", args.root)):
        if value is not None and not str(value).strip():
            raise ValueError(f"{flag}={value!r}: give a folder")
    if args.out is not None:
        check_target(Path(args.out).expanduser(), "--out", folder=True)
        try:
            store.check_run_id(Path(args.out).name)
        except ValueError as err:
            raise ValueError(f"--out={args.out!r}: its last part is the run id; {err}") from None
    if args.out is not None and args.run_id is not None:
        raise ValueError(
            f"--run-id={args.run_id!r} with --out={args.out!r}: --out names the run folder itself; "
            "give --out, or --root and --run-id"
        )


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

    from dsa_lab.bench.point import SweepSpec
    from dsa_lab.store import folders as store
    from dsa_lab.store import opening

    if args.resume and not _grid_given(args) and run_dir is not None:
        opening.require_run(run_dir)
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
    if args.max_seconds_per_point is not None:  # a shorter budget shortens the minimum measuring time too
        budget = args.max_seconds_per_point
        timing = dataclasses.replace(timing, max_seconds=budget, min_seconds=min(timing.min_seconds, budget))
    return spec.with_axes(timing=timing) if timing != spec.timing else spec


def results_table(results: Any, noisy_rel_iqr: float) -> str:
    """The timed points as µs medians: a column per next_n, a row per backend, strategy and every other axis
    that varies in the run; a point stored as noisy (its IQR above `noisy_rel_iqr` of its median,
    `bench.timing`) is marked '~'."""
    import pandas as pd

    ok = results[results["status"] == "ok"].copy()
    if ok.empty:
        return "no point was timed ok"
    noisy = ok["noisy"].fillna(False).astype(bool) if "noisy" in ok else pd.Series(False, index=ok.index)
    ok["cell"] = [f"{m * 1e3:.1f}{'~' if n else ''}" for m, n in zip(ok["median_ms"], noisy)]
    rows = [name for name in axes.shown(ok) if name != "next_n"]
    table = ok.pivot_table(index=rows, columns="next_n", values="cell", aggfunc="first", sort=False)
    table.columns = [f"n={n}" for n in table.columns]
    note = ""
    if noisy.any():
        threads = sorted({int(t) for t in ok["torch_threads"].dropna()}) if "torch_threads" in ok else []
        note = (
            f"\n~ noisy: IQR above {noisy_rel_iqr:.0%} of the median ({int(noisy.sum())} of {len(ok)} points"
            + (f"; torch threads {threads}" if threads else "")
            + ")"
        )
    with pd.option_context("display.width", 200, "display.max_rows", 1000, "display.max_columns", 30):
        return "median kernel time per decode step (µs):\n" + table.fillna("-").to_string() + note


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
    from dsa_lab.bench.estimate import START_S, estimate, estimate_table, skipped_on
    from dsa_lab.bench.run_folder import resume_command
    from dsa_lab.bench.sweep import SHORT_STOPS
    from dsa_lab.store import folders as store

    _check_limits(args)
    load_backend_modules(args)
    device = resolve_device(args.device)
    run_dir = Path(args.out) if args.out is not None else None
    if args.resume and run_dir is None and args.run_id is None:
        raise ValueError("--resume: name the run to continue with --out PATH (or --root and --run-id)")
    if run_dir is None and not args.dry_run:
        run_dir = run_dir_from_args(args, device, args.preset or "ci")
    spec = bench_spec(args, run_dir)
    points = spec.points()
    if args.dry_run:
        skipped, parts = skipped_on(spec, device), estimate(spec)
        print(
            f"{len(points)} points ({skipped} skipped here on {device.type}); estimated H200 time "
            f"~{sum(p.seconds for p in parts) / 60:.1f} min (the sweep; start-up ~{START_S / 60:.1f} min more)"
        )
        print(estimate_table(parts))
        for line in numerics_notes(spec, device):
            print(line)
        return 0
    if args.preset == "sm100" and device.type == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        if major != 10:
            _log(f"dsa-lab bench: note: preset sm100 on a GPU of compute capability {major}.{minor} (not SM100)")
    print(
        f"sweep: {len(points)} points; backends {spec.backend}; batch {spec.batch}; context {spec.context}; "
        f"next_n {spec.next_n}; strategies {spec.strategy}; device {device}",
        flush=True,
    )
    for line in numerics_notes(spec, device):
        print(line, flush=True)
    try:
        summary = _run(args, spec, run_dir, device)
    except SystemExit as err:  # a backend called sys.exit: the sweep recorded it ('exited') and stopped
        _log(
            f"dsa-lab bench: the sweep stopped: a backend raised SystemExit({err.code!r}) (recorded as stop 'exited', "
            f"the point named in the run). Resume with: {resume_command(run_dir)}"
        )
        return STOPPED_SHORT
    print(
        f"run {summary.run_dir}: {summary.recorded_now} points now, {summary.recorded_before} before, "
        f"{summary.remaining} left of {summary.total}; {summary.counts}; stop: {summary.stop_reason}"
    )
    if summary.stop_reason == "interrupted":
        _log(f"dsa-lab bench: interrupted; the points so far are kept. Resume with: {resume_command(summary.run_dir)}")
        return INTERRUPTED
    print(results_table(store.load_run(summary.run_dir).results, spec.timing.noisy_rel_iqr))
    if summary.stop_reason in SHORT_STOPS:
        _log(
            f"dsa-lab bench: the sweep stopped short ({summary.stop_reason}); {summary.remaining} points left. "
            f"Resume with: {resume_command(summary.run_dir)}"
        )
        return STOPPED_SHORT
    if summary.remaining:
        print(f"{summary.remaining} points left; continue with: {resume_command(summary.run_dir)}")
    return 0


def _run(args: argparse.Namespace, spec: Any, run_dir: Path, device: Any) -> Any:
    """The sweep of a bench command (`bench.sweep.run_sweep`), its limits and provenance from the flags."""
    from dsa_lab.bench.sweep import DEFAULT_POINT_TIMEOUT_S, run_sweep

    return run_sweep(
        spec,
        run_dir,
        device,
        resume=args.resume,
        retry_errors=args.retry_errors,
        max_points=args.max_points,
        max_minutes=args.max_minutes,
        point_timeout_s=args.point_timeout or DEFAULT_POINT_TIMEOUT_S,
        ceilings=args.measure_ceilings,
        progress=not args.no_progress,
        extra_provenance={
            "preset": args.preset or "ci",
            "command": list(sys.argv),
            "scratch": scratch_run(args, device),
        },
    )


# ---------------------------------------------------------------- registration


def register_cli(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="check and time a grid of decode points into a run folder (resumable)",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
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
    run.add_argument(
        "--point-timeout",
        type=float,
        default=None,
        help="seconds one point may take (JIT compile, check, timing) before it is an error (default 300)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--dry-run", action="store_true", help="count the points and estimate the H200 time; run nothing")
    timing = bench.add_argument_group("timing")
    timing.add_argument(
        "--graph",
        action="store_true",
        help="the events timer replays CUDA graphs of 10 calls (warm L2); --timer graph replays one whole step",
    )
    timing.add_argument("--warm-l2", action="store_true", help="do not flush L2 between timed calls")
    timing.add_argument("--max-seconds-per-point", type=float, default=None, help="timing budget of one point")
    timing.add_argument(
        "--measure-ceilings", action="store_true", help="measure read bandwidth and FP8 GEMM rate first"
    )
    bench.set_defaults(func=_cmd_bench)
