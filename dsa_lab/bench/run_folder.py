"""A sweep's run folder: opened new, or reopened to resume, and refused by name before the first point when the
run could not be read back.

A run is read back by `store.load_run`, which refuses a run id that is not one plain folder name and
any axis value outside its vocabulary (a backend or config that is not a plain name, `store.format`).
Measuring a whole grid and only then learning that its run cannot be loaded or resumed loses the
study, so `check_storable` holds the run id (the last part of `--out`, or `--run-id`) and every point
of the grid to those same rules first, and `open_run` holds the new provenance to the fields a reader
checks before writing it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from dsa_lab.bench.numerics import numerics_record
from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.timing import timing_method
from dsa_lab.env_info import device_name
from dsa_lab.store import folders as store
from dsa_lab.store import opening
from dsa_lab.store.format import check_axes, check_provenance_fields
from dsa_lab.store.provenance import build_provenance


def resume_command(run_dir: Path, retry_errors: bool = False) -> str:
    """The command that continues a run (its spec comes from its provenance)."""
    return f"dsa-lab bench --resume --out {run_dir}" + (" --retry-errors" if retry_errors else "")


def check_storable(spec: SweepSpec, run_dir: Path) -> None:
    """Refuse, naming the value, a run `store.load_run` would refuse when read back: a run id (`run_dir`'s last
    part) that is not a plain folder name, or a point whose axes (backend, config...) a run file cannot hold."""
    try:
        store.check_run_id(run_dir.name)
    except ValueError as err:
        raise ValueError(f"run folder {run_dir}: its name is the run id; {err}") from None
    points = spec.points()
    frame = pd.DataFrame([{"point_key": point.key, **point.axes()} for point in points])
    try:
        check_axes(frame, run_dir / store.RESULTS_FILE)
    except store.RunFormatError as err:
        raise ValueError(f"the grid cannot be stored, so nothing is measured: {err}") from None


def open_run(
    spec: SweepSpec, run_dir: Path, device: torch.device, resume: bool, extra: dict[str, Any]
) -> dict[str, Any]:
    """Create the run folder (refusing an existing one) or reopen it to resume (refusing a mismatch)."""
    from dsa_lab.env_info import environment_facts

    numerics = numerics_record(spec.backend, spec.cache_dtype, spec.check_tolerance, device)
    extra.setdefault("scratch", store.scratch_device(device.type))
    if resume:
        provenance = opening.check_resume(
            run_dir, _recorded_form(run_dir, spec), device.type, device_name(device), environment_facts(spec.backend)
        )
        _check_logged_points(run_dir, spec)
        stamp = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": extra.get("command")}
        fields: dict[str, Any] = {"resumed": provenance.get("resumed", []) + [stamp]}
        if "numerics" not in provenance:  # a run from before the numerics were recorded
            fields["numerics"] = numerics
        store.update_provenance(run_dir, **fields)
        return store.read_provenance(run_dir / store.PROVENANCE_FILE)
    provenance = build_provenance(
        run_id=run_dir.name,
        device=device.type,
        device_name=device_name(device),
        source="measured",
        seed=spec.seed,
        timing_method=timing_method(device, spec.timing),
        spec=spec.to_dict(),
        extra={**{key: value for key, value in extra.items() if key != "command"}, "numerics": numerics},
        backends=spec.backend,  # a union of grids records its grids, the backend axis their union
    )
    check_provenance_fields(provenance, run_dir / store.PROVENANCE_FILE)  # what a reader holds it to, before writing
    opening.create_run(run_dir, provenance)
    return provenance


def _recorded_form(run_dir: Path, spec: SweepSpec) -> dict[str, Any]:
    """`spec` as the run's provenance spells it when the two are the same grid: a run recorded before a
    setting existed (min_seconds, cpu_threads...) holds that setting's default, and resumes under it."""
    recorded = store.read_provenance(run_dir / store.PROVENANCE_FILE).get("spec")
    try:
        same = json.dumps(SweepSpec.from_dict(recorded).to_dict(), default=str) == json.dumps(
            spec.to_dict(), default=str
        )
    except (ValueError, TypeError):
        return spec.to_dict()  # check_resume names the mismatch
    return recorded if same else spec.to_dict()


def _check_logged_points(run_dir: Path, spec: SweepSpec) -> None:
    """Every point the log holds belongs to the run's grid (a foreign point would join its results)."""
    keys = {point.key for point in spec.points()}
    foreign = [key for key in store.latest_rows(run_dir) if key not in keys]
    if foreign:
        raise store.RunFormatError(
            f"{run_dir / store.POINTS_FILE}: {len(foreign)} logged point(s) not in the run's grid, e.g. {foreign[0]}: "
            "the log is not this run's; refusing to resume"
        )
