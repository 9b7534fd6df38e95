"""Profiling the decode paths: the profiling modes of the harness, and the entry Nsight Compute runs.

`dsa-lab profile` (`dsa_lab.profiling.cli`, with the flags of `dsa-lab bench`: one grammar)
profiles a grid of points: torch.profiler tables and traces in this process
(`profiling.sweep.run_torch`), Nsight Compute counters over a target process
(`profiling.sweep.run_ncu`, `profiling.target`). This package's face is the front door for
notebooks and tests; `__main__` is the entry ncu runs: `python -m dsa_lab.profiling --ncu-target ...`.
"""

from __future__ import annotations

from dsa_lab.profiling.ncu import NcuStatus, NcuUnavailable, detect_ncu
from dsa_lab.profiling.ncu_tables import METRICS, attach_configs, parse_ncu_csv, summarize_ncu
from dsa_lab.profiling.runs import find_profile_runs, load_profile_run
from dsa_lab.profiling.step import PHASES, phased_decode
from dsa_lab.profiling.sweep import ProfileRun, ProfileSettings, run_ncu, run_torch
from dsa_lab.profiling.torch_profile import ProfileResult, compare_in_one_trace, profile_step, summarize_torch

__all__ = [
    "METRICS",
    "PHASES",
    "NcuStatus",
    "NcuUnavailable",
    "ProfileResult",
    "ProfileRun",
    "ProfileSettings",
    "attach_configs",
    "compare_in_one_trace",
    "detect_ncu",
    "find_profile_runs",
    "load_profile_run",
    "parse_ncu_csv",
    "phased_decode",
    "profile_step",
    "run_ncu",
    "run_torch",
    "summarize_ncu",
    "summarize_torch",
]
