"""`dsa-lab profile`: run a grid of configurations through torch.profiler and/or Nsight Compute."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from dsa_lab import store
from dsa_lab.env_info import device_name
from dsa_lab.errors import as_device, check_choice, check_positive
from dsa_lab.kernels import backend_names
from dsa_lab.metadata import STRATEGIES
from dsa_lab.profiling.ncu import NcuUnavailable, detect_ncu
from dsa_lab.profiling.runs import profile_provenance, write_tables
from dsa_lab.profiling.sweep import ProfileRun, ProfileSpec, run_ncu_sweep, run_torch_sweep
from dsa_lab.profiling.torch_profile import summarize_torch
from dsa_lab.topk import DEFAULT_TOPK


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return as_device("device", name)
    except ValueError as err:
        raise ValueError(f"{err} (or 'auto')") from None


def spec_from_args(args: argparse.Namespace) -> ProfileSpec:
    for name in args.backend:
        check_choice("--backend", name, backend_names())
    for flag, value in (("--torch-budget", args.torch_budget), ("--ncu-timeout", args.ncu_timeout)):
        if value is not None:
            check_positive(flag, value)
    chosen = args.strategy or ["all"]
    strategies = STRATEGIES if "all" in chosen else tuple(dict.fromkeys(chosen))
    return ProfileSpec(
        tuple(dict.fromkeys(args.backend)), strategies, tuple(args.batch), args.context_len, tuple(args.next_n),
        args.seed, args.topk, args.repeats, not args.no_trace,
    )  # fmt: skip


def _cmd_profile(args: argparse.Namespace) -> int:
    device = _device(args.device)
    spec = spec_from_args(args)
    want_torch, want_ncu = args.mode in ("torch", "both"), args.mode in ("ncu", "both")
    status = detect_ncu() if want_ncu else None
    ncu_skipped = None
    if status is not None:
        if not status.usable:
            ncu_skipped = "; ".join(status.problems)
        elif device.type != "cuda":
            ncu_skipped = f"ncu profiles CUDA kernels; device is {device}"
        if ncu_skipped and args.mode == "ncu":
            raise NcuUnavailable(ncu_skipped)
        if ncu_skipped:
            _log(f"dsa-lab profile: Nsight Compute skipped: {ncu_skipped}")
            want_ncu = False
        else:
            _log(f"dsa-lab profile: Nsight Compute path: {status.reason}")
    run_id = store.new_run_id("profile")
    out = Path(args.out) if args.out else Path("data") / store.device_label(device_name(device)) / "profiles" / run_id
    provenance = profile_provenance(run_id, device, spec, status)
    provenance["ncu_skipped"] = ncu_skipped
    store.create_run(out, provenance)
    run = run_torch_sweep(spec, device, out, _log, args.torch_budget) if want_torch else ProfileRun(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), [])
    write_tables(run, out)  # written now and again after ncu, so a cut-short ncu run keeps these
    if want_ncu and status is not None:
        for backend in spec.backends:  # one ncu run each, stored as soon as it ends
            outcome = run_ncu_sweep(replace(spec, backends=(backend,)), status, device, args.ncu_timeout, _log)
            if not outcome.kernels.empty:
                run.ncu = outcome.kernels if run.ncu.empty else pd.concat([run.ncu, outcome.kernels], ignore_index=True)
            run.raw_ncu += outcome.raw + "\n"
            run.configs += outcome.configs
            store.update_provenance(out, ncu_metrics=outcome.metrics, ncu_metrics_dropped=outcome.dropped)
            write_tables(run, out)
    _print_summary(run)
    print(f"profile run written to {out}")
    return 0


def _print_summary(run: ProfileRun) -> None:
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        torch_summary = summarize_torch(run.kernels)
        if not torch_summary.empty:
            print(torch_summary.drop(columns=["device"]).to_string(index=False, float_format="{:.4g}".format))
        ncu_summary = run.ncu_summary
        if not ncu_summary.empty:
            shown = ["backend", "strategy", "batch_size", "next_n", "duration_ns", "dram_read_per_unique", "l2_hit_pct", "tensor_gmma_pct", "tensor_hmma_pct", "effective_tbps"]
            print(ncu_summary[[c for c in shown if c in ncu_summary]].to_string(index=False, float_format="{:.4g}".format))
    skipped = [c for c in run.configs if c.get("status") not in ("profiled", "same_as")]
    for config in skipped:
        print(f"{config['tool']} {config['backend']} {config['strategy']} B={config['batch_size']} n={config['next_n']}: {config['status']}: {config['reason']}")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "profile",
        help="profile decode steps (torch.profiler tables and traces, Nsight Compute counters)",
        description="Profile one decode step per configuration: kernel tables and a Chrome trace from "
        "torch.profiler; DRAM bytes, L2 hit rate, occupancy and tensor-pipe use from Nsight Compute.",
    )
    parser.add_argument("--backend", nargs="+", default=["reference"], help="registered backend name(s)")
    parser.add_argument(
        "--strategy", action="append", choices=(*STRATEGIES, "all"), help="repeatable; 'all' (default) = native, flatten, atom"
    )
    parser.add_argument("--batch", nargs="+", type=int, default=[2], help="batch size(s)")
    parser.add_argument("--context-len", type=int, default=512, help="cached tokens per request")
    parser.add_argument("--next-n", nargs="+", type=int, default=[4], help="query rows per request (MTP)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--torch", dest="mode", action="store_const", const="torch", help="torch.profiler only")
    mode.add_argument("--ncu", dest="mode", action="store_const", const="ncu", help="Nsight Compute only")
    mode.add_argument("--both", dest="mode", action="store_const", const="both", help="both (default)")
    parser.set_defaults(mode="both")
    parser.add_argument("--out", help="run folder to create (default data/<device>/profiles/<run_id>)")
    parser.add_argument("--device", default="auto", help="auto (cuda if present), cuda or cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--topk", type=int, default=DEFAULT_TOPK)
    parser.add_argument("--repeats", type=int, default=1, help="ncu steps per configuration")
    parser.add_argument("--torch-budget", type=float, help="seconds after which torch.profiler starts no new configuration")
    parser.add_argument("--ncu-timeout", type=float, default=300.0, help="seconds per backend's ncu run")
    parser.add_argument("--no-trace", action="store_true", help="skip the native-vs-flatten Chrome trace")
    parser.set_defaults(func=_cmd_profile)
