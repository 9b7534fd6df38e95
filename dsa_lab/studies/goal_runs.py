"""The runs issue 13's goals are judged on: the sweep (`goal_run`) and the Nsight Compute profile (`ncu_comparison`).

Apart from `studies.goals`, which judges the frame it is handed and never searches the store; what cannot
be found here is named with the command that makes it.
"""

from __future__ import annotations

import pandas as pd

from dsa_lab import axes
from dsa_lab.analysis.frames import vllm_family
from dsa_lab.analysis.profiles import TENSOR_METRICS
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.kernels import family_of, get_backend
from dsa_lab.notebook.runs import ChosenRun, chosen, named_run, passed, relative_to_data, search, timed_backends
from dsa_lab.paths import resolve_data_path, shown_path
from dsa_lab.profiling.ncu_tables import METRICS
from dsa_lab.profiling.runs import load_profile_run
from dsa_lab.store import folders as store
from dsa_lab.studies.goals import goal_points


def sweep_how(candidate: str) -> str:
    """The command that makes a run these goals can be judged on (every DeepGEMM backend beside the
    candidate and its family's logits kernels: a fused one times no logits)."""
    family = [name for name in family_of(candidate) if not get_backend(name).fuses_topk]
    backends = ",".join(dict.fromkeys([*vllm_family(), *family, candidate]))
    return (
        f"`RUN_NAME=h200-{candidate}-<date> scripts/h200_sweep.sh --backend {backends} --batch 1,16,64,128 "
        "--context 32K,64K --next-n 1,2,3,4,5,6,7,8` on an H200 (carry `.dg`)"
    )


def goal_gap(run: store.Run, candidate: str) -> str | None:
    """Why the goals cannot be judged on `run` (None: they can): it must be a GPU run whose view of uniform
    logits steps (`goals.goal_points`) holds the candidate's native time beside a DeepGEMM option's somewhere."""
    if run.provenance.get("device") != "cuda" or candidate not in timed_backends(run):
        return f"{candidate!r} not timed on a GPU"
    try:
        points = goal_points(run.results, run.provenance, candidate)
    except ValueError as err:  # the candidate timed, but not natively in the view the goals read
        return str(err)
    uniform = points.dropna(subset=["speedup"])["context"].map(lambda c: not ContextSpec.parse(c).mixed)
    return None if uniform.any() else f"no uniform point with {candidate!r} beside a DeepGEMM option"


def goal_run(run_path: str, device: str, candidate: str) -> tuple[ChosenRun | None, str]:
    """The run the goals are judged on: `run_path` (relative to data/, or a folder) when they can be judged on it
    (`goal_gap`), else the newest measured run of `device` they can (the current kernel's newest measurement, so
    the goals say whether the kernel as last measured meets them); else None and one line saying what is missing
    and the command that makes it (no stand-in: a CPU sweep says nothing about these goals). The line also names
    a run asked for that they cannot be judged on, and the newer runs passed over."""
    asked = named_run(run_path)
    gap = goal_gap(asked, candidate) if asked is not None else None
    if asked is not None and gap is None:
        return chosen(asked), ""
    found = search(device, accept=lambda run: goal_gap(run, candidate))
    why = []
    if run_path:
        held = "is not there" if asked is None else f"holds no goal point ({gap})"
        why.append(f"run_path {shown_path(run_path)!r} {held}")
    if found.run is None:
        return None, (
            f"No measured {device.upper()} run with the {candidate!r} backend under "
            f"{shown_path(resolve_data_path(device))}{f' ({why[0]})' if why else ''}: make one with "
            f"{sweep_how(candidate)}."
        )
    note = f"{why[0]}: showing {relative_to_data(found.run.path)} instead." if why else ""
    return chosen(found.run, passed(found), missing=note or None), note


def _kernel_name(names: pd.Series) -> str:
    """'void deep_gemm::sm90_fp8_paged_mqa_logits<4, 64, ...>(unsigned int, ...)' -> 'deep_gemm::sm90_fp8_paged_mqa_logits'."""
    short = (n.removeprefix("void ").split("(")[0].split("<")[0] for n in names)
    return " + ".join(dict.fromkeys(short))


def ncu_how(candidate: str) -> str:
    """The command that makes the Nsight Compute comparison: `candidate` beside every DeepGEMM backend."""
    backends = ",".join(dict.fromkeys([candidate, *vllm_family()]))
    return (
        f"`dsa-lab profile --preset h200-full --tool ncu --backend {backends} --strategy native,atom --batch 128 "
        "--context 64K --next-n 3,4 --device cuda --no-trace` on an H200 (carry `.dg`)"
    )


def ncu_comparison(path: str, candidate: str) -> pd.DataFrame:
    """Nsight Compute's numbers per profiled step of a profile run at data/`path`: the logits kernel(s), µs,
    DRAM bytes read per unique KV byte (1.0: KV from DRAM once), L2 hit %, occupancy %, tensor pipe busy %
    (`tensor_counter` in the frame's attrs names ncu's counter) and useful TFLOP/s.

    Raises FileNotFoundError naming what is missing and the command that makes it."""
    folder = resolve_data_path(path)
    if not (folder / store.PROVENANCE_FILE).is_file():
        raise FileNotFoundError(f"No Nsight Compute run at {shown_path(folder)}: make one with {ncu_how(candidate)}")
    run = load_profile_run(folder)
    if run.ncu.empty:
        raise FileNotFoundError(
            f"{shown_path(folder)}: the run holds no Nsight Compute rows; make one with {ncu_how(candidate)}"
        )
    summary = run.ncu_summary
    tensor = next((c for c in TENSOR_METRICS if c in summary and summary[c].notna().any()), None)
    keys = [name for name in axes.NAMES if name in run.ncu and name in summary]
    names = run.ncu.groupby(keys, dropna=False)["kernel"].agg(_kernel_name)
    table = summary.merge(names.rename("kernel").reset_index(), on=keys)
    table = table.assign(us=table["duration_ns"] / 1e3, tensor_pipe_pct=table[tensor] if tensor else float("nan"))
    table = table.sort_values(["next_n", *axes.OPTION_KEYS]).reset_index(drop=True)
    table = table[
        [
            "next_n",
            *(k for k in axes.STEP_KEYS if k != "next_n"),
            *axes.OPTION_KEYS,
            "kernel",
            "us",
            "dram_read_per_unique",
            "l2_hit_pct",
            "occupancy_pct",
            "tensor_pipe_pct",
            "useful_tflops",
        ]
    ]
    table.attrs["tensor_counter"] = METRICS[tensor] if tensor else "none collected"
    return table
