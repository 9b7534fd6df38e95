"""`dsa-lab profile`: the profiling modes of the harness over a grid, with the flags `dsa-lab bench` takes.

The grid, device and run folder come from the harness's one grammar (`bench.cli.add_grid_flags`:
`--preset`, a comma-separated list per axis, `--seed`, `--device`, `--out` or `--root`/`--run-id`);
profiling adds `--tool torch,ncu,nsight`, `--topk`, `--repeats`, `--torch-budget`, `--ncu-timeout`,
`--nsight-runs` and `--no-trace`. torch.profiler runs in this process (`profiling.sweep.run_torch`),
Nsight Compute over a target process (`profiling.sweep.run_ncu`), nsight-python's CUPTI timer beside
the harness's on the same inputs (`profiling.nsight_timing.run_nsight`); the run folder is
`ROOT/<device>/profiles/<run-id>`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pandas as pd

from dsa_lab import axes
from dsa_lab.bench.cli import (
    add_grid_flags,
    check_folder_flags,
    load_backend_modules,
    resolve_device,
    run_dir_from_args,
    scratch_run,
    spec_from_args,
)
from dsa_lab.bench.run_folder import check_storable
from dsa_lab.errors import check_choice, check_positive, check_range
from dsa_lab.profiling.ncu import NcuUnavailable, detect_ncu
from dsa_lab.profiling.runs import profile_provenance, write_tables
from dsa_lab.profiling.sweep import ProfileRun, ProfileSettings, run_ncu, run_torch
from dsa_lab.profiling.torch_profile import summarize_torch
from dsa_lab.store import folders as store
from dsa_lab.store import opening
from dsa_lab.topk import DEFAULT_TOPK

TOOLS = ("torch", "ncu", "nsight")
SHOWN_COUNTERS = (
    "duration_ns",
    "dram_read_per_unique",
    "l2_hit_pct",
    "tensor_gmma_pct",
    "tensor_hmma_pct",
    "effective_tbps",
)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _tools(text: str) -> tuple[str, ...]:
    tools = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not tools:
        raise ValueError(f"--tool: give at least one of {', '.join(TOOLS)} (comma-separated)")
    for tool in tools:
        check_choice("--tool", tool, TOOLS)
    return tools


def _cmd_profile(args: argparse.Namespace) -> int:
    tools = _tools(args.tool)
    check_folder_flags(args)
    for flag, value in (("--torch-budget", args.torch_budget), ("--ncu-timeout", args.ncu_timeout)):
        if value is not None:
            check_positive(flag, value)
    check_range("--nsight-runs", args.nsight_runs, 2, 10_000)
    load_backend_modules(args)
    device = resolve_device(args.device)
    spec = spec_from_args(args)
    for name in ("timed", "timer"):  # what bench times; a profile traces the step's phases (logits, top-k) eagerly
        other = [v for v in getattr(spec, name) if axes.axis(name).in_key(v)]
        if other:
            allowed = axes.axis(name).old_value
            raise ValueError(
                f"{name}={other[0]!r}: dsa-lab profile traces every phase of an eager step; allowed {allowed!r}"
            )
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
    nsight = _nsight_for(tools, device)
    out = run_dir_from_args(args, device, "profile", sub="profiles")
    check_storable(spec, out)  # a run that could not be read back is refused before its first point
    opening.check_new_folder(out)
    with opening.run_lock(out):
        provenance = profile_provenance(out.name, device, spec, settings, status)
        provenance.update(ncu_skipped=ncu_skipped, scratch=scratch_run(args, device))
        if nsight is not None:
            from dsa_lab.profiling.nsight_timing import nsight_version

            provenance["nsight"] = {"version": nsight_version(), "tool": "cupti", "runs": args.nsight_runs}
        opening.create_run(out, provenance)
        empty = pd.DataFrame()
        run = (
            run_torch(spec, device, settings, out, _log, args.torch_budget)
            if "torch" in tools
            else ProfileRun(empty, empty, empty, [])
        )
        write_tables(run, out)  # written now and again after ncu, so a cut-short ncu run keeps these
        if status is not None and not ncu_skipped:
            outcome = run_ncu(spec, settings, status, device, out, args.ncu_timeout, _log)
            run.ncu, run.raw_ncu, run.configs = outcome.kernels, outcome.raw, run.configs + outcome.configs
            store.update_provenance(
                out,
                ncu_metrics=outcome.metrics,
                ncu_metrics_dropped=outcome.dropped,
                ncu_reports=[p.name for p in outcome.reports],
            )
            write_tables(run, out)
        if nsight is not None:
            from dsa_lab.profiling.nsight_timing import run_nsight

            run.nsight, configs = run_nsight(spec, device, args.nsight_runs, _log, nsight=nsight)
            run.configs = run.configs + configs
            write_tables(run, out)
    _print_profile(run)
    print(f"profile run written to {out}")
    return 0


def _nsight_for(tools: tuple[str, ...], device: Any) -> Any:
    """nsight-python with CUPTI active when `nsight` is among the tools (None otherwise); an error saying
    why when it cannot run here."""
    if "nsight" not in tools:
        return None
    from dsa_lab.profiling.nsight_timing import NsightUnavailable, load_nsight

    if device.type != "cuda":
        raise NsightUnavailable(f"--tool nsight times CUDA kernels through CUPTI; device is {device}")
    return load_nsight()


NSIGHT_SHOWN = (
    "harness_median_ms",
    "nsight_mean_ns",
    "nsight_ci95_low_ns",
    "nsight_ci95_high_ns",
    "nsight_stable",
    "timer_over_nsight",
)


def _print_profile(run: ProfileRun) -> None:
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        torch_summary = summarize_torch(run.kernels)
        if not torch_summary.empty:
            print(torch_summary.drop(columns=["device_name"]).to_string(index=False, float_format="{:.4g}".format))
        ncu_summary = run.ncu_summary
        if not ncu_summary.empty:
            shown = [*axes.shown(ncu_summary), *(c for c in SHOWN_COUNTERS if c in ncu_summary)]
            print(ncu_summary[shown].to_string(index=False, float_format="{:.4g}".format))
        if not run.nsight.empty:
            print("nsight-python (CUPTI) beside the harness's timer; timer_over_nsight = harness median / nsight mean")
            shown = [*axes.shown(run.nsight), *NSIGHT_SHOWN]
            print(run.nsight[shown].to_string(index=False, float_format="{:.4g}".format))
    for config in run.configs:
        if config.get("status") not in ("profiled", "same_as"):
            print(
                f"{config['tool']} {config['backend']} {config['strategy']} B={config['batch']} L={config['context']} "
                f"n={config['next_n']}: {config['status']}: {config['reason']}"
            )


def register_cli(sub: argparse._SubParsersAction) -> None:
    profile = sub.add_parser(
        "profile",
        help="profile a grid of decode points: torch.profiler tables, Nsight Compute counters",
        description="Profile one decode step per point of a grid: kernel tables and a Chrome trace from "
        "torch.profiler; DRAM bytes, L2 hit rate, occupancy and tensor-pipe use from Nsight Compute "
        "(reports kept as .ncu-rep); with --tool nsight, nsight-python's CUPTI timer beside the harness's "
        "on the same inputs. Every point is checked against the reference first.",
        allow_abbrev=False,
    )
    add_grid_flags(profile)
    tools = profile.add_argument_group("profiling")
    tools.add_argument(
        "--tool",
        default="torch,ncu",
        help="comma-separated: torch, ncu, nsight (nsight-python's CUPTI timer beside the harness's; "
        "needs the gpu extra) (default: torch,ncu)",
    )
    tools.add_argument(
        "--topk", type=int, default=DEFAULT_TOPK, help=f"top-k of the profiled step (default {DEFAULT_TOPK})"
    )
    tools.add_argument("--repeats", type=int, default=1, help="ncu steps per point")
    tools.add_argument("--torch-budget", type=float, help="seconds after which torch.profiler starts no new point")
    tools.add_argument("--ncu-timeout", type=float, default=300.0, help="seconds per backend's ncu run")
    tools.add_argument("--no-trace", action="store_true", help="skip the native-vs-flatten Chrome trace")
    tools.add_argument("--nsight-runs", type=int, default=5, help="nsight-python runs per point (default 5)")
    profile.set_defaults(func=_cmd_profile)
