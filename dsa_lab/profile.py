"""Profiling the decode paths: torch.profiler kernel tables and traces, Nsight Compute counters.

The implementation lives in `dsa_lab.profiling` (step, torch_profile, ncu, ncu_tables,
target, marker, sweep, runs, cli); this module is its front door, the `dsa-lab profile`
command, and the entry ncu runs: `python -m dsa_lab.profile --ncu-target --backend NAME ...`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dsa_lab.profiling.ncu import NcuStatus, NcuUnavailable, detect_ncu
from dsa_lab.profiling.ncu_tables import METRICS, attach_configs, parse_ncu_csv, summarize_ncu
from dsa_lab.profiling.runs import find_profile_runs, load_profile_run
from dsa_lab.profiling.step import PHASES, ProfileRefused, phased_decode, profile_inputs, random_fp8_cache
from dsa_lab.profiling.sweep import ProfileRun, ProfileSpec, run_torch_sweep
from dsa_lab.profiling.torch_profile import ProfileResult, compare_in_one_trace, profile_decode_step, summarize_torch

__all__ = [
    "METRICS",
    "PHASES",
    "NcuStatus",
    "NcuUnavailable",
    "ProfileRefused",
    "ProfileResult",
    "ProfileRun",
    "ProfileSpec",
    "attach_configs",
    "compare_in_one_trace",
    "detect_ncu",
    "find_profile_runs",
    "load_profile_run",
    "parse_ncu_csv",
    "phased_decode",
    "profile_decode_step",
    "profile_inputs",
    "random_fp8_cache",
    "run_torch_sweep",
    "summarize_ncu",
    "summarize_torch",
]


def register_cli(sub: argparse._SubParsersAction) -> None:
    from dsa_lab.profiling.cli import register

    register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """`--ncu-target ...`: the process ncu profiles; anything else: `dsa-lab profile ...`.

    Builds only this command's parser, so `python -m dsa_lab.profile` runs where the
    other commands' dependencies (papermill, vLLM...) are missing, as on the device.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if "--ncu-target" in args:
        from dsa_lab.profiling.target import target_main

        return target_main(args)
    parser = argparse.ArgumentParser(prog="python -m dsa_lab.profile")
    register_cli(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(["profile", *args])
    try:
        return int(parsed.func(parsed) or 0)
    except (ValueError, RuntimeError) as err:  # bad input, no ncu, unavailable backend: one line
        print(f"dsa-lab profile: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
