"""Which run a notebook shows: the shipped measurement, or a labelled CPU stand-in.

Notebooks call one function here (`latency_run`, `kernel_run`, `profile_run`, `sm100_run`)
instead of carrying their own discovery cells. The answer says whether it is a measurement of the
GPU asked for; when it is not, `missing` says what was absent and which command makes it,
and the notebook shows that as a banner (`dsa_lab.notebook.display.announce`) that the report index
flags. Runs that were skipped because they are broken are listed with the reason
(`dsa_lab.notebook.display.show_ignored`, which shows everything a run says as text, never live markup).
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dsa_lab.kernels import vllm_backend
from dsa_lab.model.roofline import GpuSpec, get_gpu, gpu_for_device
from dsa_lab.paths import resolve_data_path, shown_path
from dsa_lab.store import folders as store
from dsa_lab.store.listing import list_runs

CPU_STAND_IN = "CPU reference, not H200"
SWEEP_HOW = "Make one on an H200 with `dsa-lab bench --preset h200-full --root data` (see scripts/h200_sweep.sh)."
SM100_FOLDERS = ("b200", "gb200", "b300", "gb300")  # data/<device>/ names of SM100 GPUs (store.device_label)
SM100_MAJOR = "10"  # compute capability 10.x: SM100 (B200, GB200) and SM103 (B300, GB300)
SM100_SWEEP_HOW = (
    "Make one on a B200 or GB200 with `scripts/sm100_sweep.sh` (or `dsa-lab bench --preset sm100 --device cuda "
    "--measure-ceilings --root data`), which writes it under `data/<gpu>/`."
)


@dataclass
class ChosenRun:
    """A run picked for a notebook, with what was passed over and why."""

    run: store.Run
    measured: bool  # a stored measurement of the device asked for, not the CPU stand-in
    device_label: str
    gpu: GpuSpec | None  # ceilings to judge it by (the H200's table row for the stand-in)
    missing: str | None = None  # set when `measured` is False: what was absent and how to get it
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (run folder, problem)


def timed_backends(run: store.Run) -> set[str]:
    return set(run.results.loc[run.results["status"] == "ok", "backend"])


def newest_measured_run(
    device: str, accept: Callable[[store.Run], bool] = lambda run: True
) -> tuple[store.Run | None, list[tuple[str, str]]]:
    """The newest measured study run under data/<device>/ that `accept` takes, and the broken ones skipped
    (scratch runs, `store.is_scratch`, are try-outs, never what a notebook shows unless named by run_path)."""
    root = resolve_data_path(".")
    runs = list_runs(root) if root.is_dir() else pd.DataFrame()
    if runs.empty:
        return None, []
    runs = runs[runs["path"].map(lambda p: Path(p).parent.name) == device]
    ignored = [(row.path, row.problem) for row in runs.itertuples() if isinstance(row.problem, str)]
    study = runs["problem"].isna() & (runs["source"] == "measured") & (runs["purpose"] == "study")
    for row in runs[study].itertuples():  # newest first
        try:
            run = store.load_run(row.path)
        except store.RunFormatError as err:
            ignored.append((row.path, str(err)))
            continue
        if accept(run):
            return run, ignored
    return None, ignored


def sm100_evidence(provenance: dict) -> str | None:
    """Why a run is an SM100 measurement ('compute capability 10.0'), from its provenance; None when it is not:
    a CUDA run whose recorded GPU has compute capability 10.x."""
    capability = (provenance.get("environment") or {}).get("gpu_capability")
    if provenance.get("device") != "cuda" or not isinstance(capability, str):
        return None
    return f"compute capability {capability}" if capability.split(".")[0] == SM100_MAJOR else None


def _sm100_problem(run: store.Run, backend: str | None) -> str | None:
    """Why an SM100 run has nothing to show (no point timed, or not `backend`), else None."""
    timed = timed_backends(run)
    if not timed:
        counts = run.results["status"].value_counts().to_dict()
        return f"an SM100 run with no point timed ok ({', '.join(f'{k} {v}' for k, v in counts.items())})"
    if backend is not None and backend not in timed:
        return f"an SM100 run that did not time backend {backend!r} (timed: {sorted(timed)})"
    return None


def sm100_run(backend: str | None = None) -> tuple[ChosenRun | None, list[tuple[str, str]]]:
    """The newest measured SM100 run under data/ (as a `ChosenRun`: its device label and its
    ceilings, for `announce`), and the runs passed over with the reason.

    A run counts when its provenance says a CUDA GPU of compute capability 10.x (B200,
    GB200, B300, GB300; `sm100_evidence`), whichever data/<device>/ folder holds it, and at
    least one point (of `backend`, when given) was timed ok. Passed over, with the reason:
    damaged runs and non-SM100 runs under data/b200/, data/gb200/ (`SM100_FOLDERS`), SM100
    runs that are not measurements, are scratch, cannot be read, or timed nothing. Paths are relative to
    data/ (no machine paths in reports). None when no run qualifies (`SM100_SWEEP_HOW` says
    how to make one).
    """
    root = resolve_data_path(".")
    runs = list_runs(root) if root.is_dir() else pd.DataFrame()
    ignored: list[tuple[str, str]] = []
    for row in runs.itertuples():  # newest first
        path = Path(row.path)
        in_sm100_folder = path.parent.name in SM100_FOLDERS
        if isinstance(row.problem, str):
            if in_sm100_folder:
                ignored.append((relative_to_data(path), row.problem))
            continue
        provenance = store.read_provenance(path / store.PROVENANCE_FILE)
        evidence = sm100_evidence(provenance)
        if evidence is None:
            if in_sm100_folder:
                capability = (provenance.get("environment") or {}).get("gpu_capability")
                ignored.append(
                    (
                        relative_to_data(path),
                        f"not an SM100 measurement: device {provenance.get('device')!r}, "
                        f"compute capability {capability!r}",
                    )
                )
            continue
        if provenance["source"] != "measured":
            ignored.append((relative_to_data(path), f"an SM100 run of source {provenance['source']!r}, not measured"))
            continue
        if store.is_scratch(provenance):
            ignored.append((relative_to_data(path), "an SM100 run labelled scratch (made without --out or --root)"))
            continue
        try:
            run = store.load_run(path)
        except store.RunFormatError as err:
            ignored.append((relative_to_data(path), str(err)))
            continue
        problem = _sm100_problem(run, backend)
        if problem is None:
            return _measured(run, ignored), ignored
        ignored.append((relative_to_data(path), problem))
    return None, ignored


def _absent(run_path: str) -> list[tuple[str, str]]:
    """The run asked for by name, when it is not in the data folder, as an 'ignored' entry."""
    if not run_path:
        return []
    return [(run_path, f"not in the data folder {shown_path(resolve_data_path('.'))}/ (asked for by run_path)")]


def _measured(run: store.Run, ignored: list[tuple[str, str]]) -> ChosenRun:
    label = run.provenance.get("device_name") or run.provenance["device"]
    return ChosenRun(run, True, label, gpu_for_device(label, run.provenance.get("ceilings")), ignored=ignored)


def _cpu_stand_in(
    spec_factory: Callable[[], object], prefix: str, missing: str, ignored: list[tuple[str, str]]
) -> ChosenRun:
    from dsa_lab.bench.sweep import run_sweep

    folder = Path(tempfile.mkdtemp(prefix=f"dsa_lab_{prefix}_")) / "cpu" / "cpu-reference"
    run_sweep(spec_factory(), folder, "cpu", progress=False, extra_provenance={"preset": f"ci ({prefix} stand-in)"})
    return ChosenRun(store.load_run(folder), False, CPU_STAND_IN, get_gpu("H200-measured"), missing, ignored)


def stored_run(
    run_path: str,
    device: str,
    needs: str,
    accept: Callable[[store.Run], bool],
    section: Section | None = None,
) -> tuple[ChosenRun | None, list[tuple[str, str]]]:
    """`run_path` (relative to data/) if it is there, else the newest measured run of `device` that
    `accept` takes and that covers `section` (when one is given), else None; and the runs passed over. A
    `run_path` that is there but not accepted is an error naming what is `needs`ed (one asked for by name
    need not cover the section); one that is absent is listed among the passed-over runs."""
    if run_path and resolve_data_path(run_path).is_dir():
        run = store.load_run(resolve_data_path(run_path))
        if not accept(run):
            raise ValueError(
                f"run_path={run_path!r}: a {run.source} run whose timed backends are {sorted(timed_backends(run))}; "
                f"this notebook needs a {needs}"
            )
        return _measured(run, []), []
    covers = accept if section is None else (lambda run: accept(run) and section.covers(run))
    run, ignored = newest_measured_run(device, covers)
    ignored = _absent(run_path) + ignored
    return (_measured(run, ignored) if run is not None else None), ignored


def _stored_or_stand_in(
    run_path: str,
    device: str,
    needs: str,
    accept: Callable[[store.Run], bool],
    stand_in: Callable[[], object],
    prefix: str,
    section: Section | None = None,
) -> ChosenRun:
    """`stored_run`, else a CPU reference sweep of `stand_in()`, labelled as such."""
    chosen, ignored = stored_run(run_path, device, needs, accept, section)
    if chosen is not None:
        return chosen
    missing = (
        f"No {needs} under {shown_path(resolve_data_path(device))}; the charts show a CPU reference sweep run "
        f"just now and roofline-modeled times. {SWEEP_HOW}"
    )
    return _cpu_stand_in(stand_in, prefix, missing, ignored)


@dataclass(frozen=True)
class Section:
    """What a notebook section reads from a run, declared: the values of each axis it must find timed ok
    (`needs`, e.g. what vLLM runs, contexts 64K and mixed:2K-128K). A run *covers* the section when it is a
    measurement that lacks none of them. The shipped run a section was written for is one such run, so a
    checkout without a newer one of its own shows the shipped run."""

    name: str
    needs: Mapping[str, tuple[object, ...]]
    grid: bool = False  # every combination of the needed values timed ok (a sweep's grid), not each one somewhere

    def lacks(self, run: store.Run) -> dict[str, list[str]]:
        """Per axis, the needed values no ok row of `run` holds, and for a `grid` section the combinations none
        holds (under 'cells', the first three and a count), empty when the run covers the section."""
        ok = run.results[run.results["status"] == "ok"]
        gaps = {}
        for name, values in self.needs.items():
            held = set(ok[name].astype(str)) if name in ok else set()
            missing = [str(v) for v in values if str(v) not in held]
            if missing:
                gaps[name] = missing
        if self.grid and not gaps:
            held_cells = set(ok[list(self.needs)].astype(str).itertuples(index=False, name=None))
            wanted = itertools.product(*([str(v) for v in values] for values in self.needs.values()))
            missing = [
                ", ".join(f"{k}={v}" for k, v in zip(self.needs, cell)) for cell in wanted if cell not in held_cells
            ]
            if missing:
                gaps["cells"] = missing[:3] + ([f"and {len(missing) - 3} more"] if len(missing) > 3 else [])
        return gaps

    def covers(self, run: store.Run) -> bool:
        return run.source == "measured" and not self.lacks(run)

    def describe(self, what: str = "measured run") -> str:
        """'measured run timing backend B; context 65536, mixed:2048-131072; timed logits' ('... at every
        combination' for a `grid` section); `what` names the run ('measured H200 run')."""
        every = " at every combination" if self.grid else ""
        return f"{what} timing " + "; ".join(f"{k} {', '.join(map(str, v))}" for k, v in self.needs.items()) + every


SERVING = Section(
    "serving answers",  # notebook 02's uniform beside ragged, notebook 03's ragged kernels, the index's answers
    {"backend": (vllm_backend().name,), "context": ("65536", "mixed:2048-131072"), "timed": ("logits",)},
)


def section_run(section: Section, run_path: str = "", device: str = "h200") -> tuple[ChosenRun | None, str]:
    """The run a section shows, and a note ('' when none is due): `run_path` (relative to data/) when it covers
    the section; else the newest measured study run of `device` that does (the shipped one, when the user has
    none newer); else None, the note saying what is missing and how to measure it. A `run_path` that is absent
    or does not cover the section is passed over with a note naming what it lacks, never silently."""
    notes = []
    if run_path and resolve_data_path(run_path).is_dir():
        run = store.load_run(resolve_data_path(run_path))
        if section.covers(run):
            return _measured(run, []), ""
        notes.append(f"run_path={run_path!r} does not cover the {section.name} (it lacks {section.lacks(run)})")
    elif run_path:
        notes.append(f"run_path={run_path!r} is not in the data folder {shown_path(resolve_data_path('.'))}/")
    run, ignored = newest_measured_run(device, section.covers)
    if run is None:
        notes.append(
            f"No {section.describe()} under {shown_path(resolve_data_path(device))}: the {section.name} are not "
            "shown. Make one on an H200 with `dsa-lab bench --preset h200-serving --root data`."
        )
        return None, "; ".join(notes) + "."
    if notes:
        notes.append(f"showing {relative_to_data(run.path)} instead")
    return _measured(run, ignored), "; ".join(notes) + ("." if notes else "")


def latency_section() -> Section:
    """What notebooks 00, 02 and 05 and the index's headline read: what vLLM runs, timed at every batch and
    context of the study's grid (`bench.presets.STUDY_GRID`, the h200-full preset's)."""
    from dsa_lab.bench.presets import STUDY_GRID

    needs = {"backend": (vllm_backend().name,), "batch": STUDY_GRID["batch"], "context": STUDY_GRID["context"]}
    return Section("latency sweep", needs, grid=True)


def latency_run(run_path: str = "", device: str = "h200", seed: int = 0) -> ChosenRun:
    """Notebook 02's data: `run_path` if it is there, else the newest measured run covering the study's grid
    (`latency_section`; the shipped sweep when there is none newer), else a CPU stand-in."""
    from dsa_lab.bench.presets import preset

    def stand_in() -> object:
        return preset("ci").with_axes(next_n=(1, 2, 3, 4), context=("128", "mixed:64-256"), seed=seed)

    section = latency_section()
    needs = section.describe(f"measured {device.upper()} run")
    return _stored_or_stand_in(run_path, device, needs, lambda run: True, stand_in, "nb02", section)


def kernel_run(run_path: str, device: str, backend: str, seed: int = 0) -> ChosenRun:
    """Notebook 03's data: a measured run in which `backend` was timed, else a CPU stand-in."""
    from dsa_lab.bench.presets import preset

    def stand_in() -> object:
        return preset("ci").with_axes(next_n=(1, 2, 3, 4), seed=seed)

    def accept(run: store.Run) -> bool:
        return run.source == "measured" and backend in timed_backends(run)

    needs = f"measured {device.upper()} run with the {backend!r} backend"
    return _stored_or_stand_in(run_path, device, needs, accept, stand_in, "nb03")


def repeat_run(repeat_path: str) -> store.Run | None:
    """Notebook 02's second call over a subset (run-to-run spread): the run at `repeat_path` under data/,
    None when no path is given or nothing is there."""
    if not repeat_path or not resolve_data_path(repeat_path).exists():
        return None
    return store.load_run(resolve_data_path(repeat_path))


@dataclass
class ChosenProfile:
    """A profile run picked for notebook 04 (see `ChosenRun`)."""

    run: object  # dsa_lab.profiling.sweep.ProfileRun (columns under the harness's names)
    measured: bool
    missing: str | None = None

    @property
    def ignored(self) -> list[tuple[str, str]]:
        return [(shown_path(folder), problem) for folder, problem in self.run.ignored]


def profile_run(
    path: str = "h200/profiles", batch: int = 2, context: str | int = 256, next_ns: tuple[int, ...] | None = None
) -> ChosenProfile:
    """The newest readable profile run under data/`path`, else a CPU reference profile made now."""
    from dsa_lab.profiling.runs import shipped_or_cpu_reference

    root = resolve_data_path(path)
    run = shipped_or_cpu_reference(
        root, batch=batch, context=context, next_ns=None if next_ns is None else tuple(next_ns)
    )
    if run.folder is not None:
        return ChosenProfile(run, True)
    missing = (
        f"No readable profile run under {shown_path(root)}; the charts show a torch.profiler profile of the CPU "
        "reference made just now. Make one with `scripts/h200_profile.sh` on an H200."
    )
    return ChosenProfile(run, False, missing)


def fresh_latency_run(preset_name: str, seed: int, device: str = "cuda") -> ChosenRun:
    """Run a sweep preset on this GPU now, store it under data/<gpu>/, and choose it; a `tqdm.auto` bar
    (a widget in JupyterLab) shows its progress."""
    import torch

    from dsa_lab.bench.presets import preset
    from dsa_lab.bench.sweep import run_sweep

    if device != "cuda" or not torch.cuda.is_available():
        raise ValueError(
            f"run_fresh=True needs a GPU (device='cuda'); this kernel has device={device!r}, "
            f"cuda available={torch.cuda.is_available()}"
        )
    folder = resolve_data_path(store.device_label(torch.cuda.get_device_name())) / store.new_run_id(preset_name)
    run_sweep(
        preset(preset_name).with_axes(seed=seed),
        folder,
        "cuda",
        progress=True,
        extra_provenance={"preset": preset_name, "command": ["notebook run_fresh"]},
    )
    return _measured(store.load_run(folder), [])


def relative_to_data(path: Path) -> str:
    """A run folder relative to data/ when it lies inside it (no machine paths in reports)."""
    try:
        return str(Path(path).resolve().relative_to(resolve_data_path(".").resolve()))
    except ValueError:
        return Path(path).name
