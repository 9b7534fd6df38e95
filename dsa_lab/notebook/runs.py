"""Which run a notebook shows: the one named, the newest that covers what it reads, or a labelled CPU stand-in.

The one room that chooses runs (analysis only reads frames). Notebooks call one function here (`latency_run`,
`kernel_run`, `profile_run`, `sm100_run`, `every_run`, or a section's view, `notebook.sections`) instead of
carrying their own discovery cells. The search itself is the store's (`store.listing.newest`: created times
compared as times, every run passed over named with why); it stays within the GPU a page is about (`data/<gpu>/`,
the runs' recorded device of that kind), so an H100 run never stands under an H200 heading. When the answer is
not a measurement of that GPU, `missing` says what was absent and which command makes it, and the notebook shows
it as a banner (`notebook.display.announce`) that the report index flags.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dsa_lab.model.roofline import GpuSpec, get_gpu, gpu_for_device
from dsa_lab.paths import data_dir, resolve_data_path, scratch_dir, shown_path
from dsa_lab.store import folders as store
from dsa_lab.store.listing import Coverage, Found, gpu_kind, list_runs, newest, study_runs

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
    measured: bool  # a stored run (the one named, or the newest covering one), not the CPU stand-in made now
    device_label: str
    gpu: GpuSpec | None  # ceilings to judge it by (None: no GPU ceilings, e.g. a CPU run)
    missing: str | None = None  # set when it is not what was asked for: what was absent and how to get it
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (run folder, why it was passed over)

    @property
    def on_gpu(self) -> bool:
        """A stored run timed on a GPU (CUDA events): its speedups mean something. A CPU run's wall-clock times
        drift between runs by more than most speedups, so CPU runs and stand-ins show times, never speedups."""
        return self.measured and self.run.provenance.get("device") == "cuda"

    @property
    def gpu_name(self) -> str:
        """The kind of device it was measured on, as headings name it ('H200', 'CPU')."""
        return gpu_kind(self.device_label).upper()


def timed_backends(run: store.Run) -> set[str]:
    return set(run.results.loc[run.results["status"] == "ok", "backend"])


def passed(found: Found) -> list[tuple[str, str]]:
    """A search's passed-over runs as (path under data/, why)."""
    return [(p.path, p.why) for p in found.passed_over]


def search(
    gpu: str, covering: Coverage | None = None, accept: Callable[[store.Run], str | None] | None = None
) -> Found:
    """`store.listing.newest` over this checkout's data folder (none there: nothing found)."""
    try:
        root = data_dir()
    except FileNotFoundError:
        return Found(None, [])
    return newest(root, gpu, covering, accept)


def every_run(gpu: str = "h200") -> tuple[list[store.Run], list[tuple[str, str]]]:
    """Every measured study run of `gpu` under data/, newest first (what the one answer reads,
    `analysis.answers.fastest`), and the runs passed over with why."""
    try:
        runs, skipped = study_runs(data_dir(), gpu)
    except FileNotFoundError:
        return [], []
    return runs, [(p.path, p.why) for p in skipped]


def run_choices(exclude: Path | None = None) -> list[tuple[str, str]]:
    """(label, path) of every readable run one may switch an explorer to, newest first: the measured study runs
    under data/, then the scratch runs (under scratch/ and data/: a CPU run of one's own), each labelled with its
    device, and scratch ones as such. `exclude`: a run already shown."""
    roots = []
    for folder in (data_dir, scratch_dir):
        try:
            roots.append(folder())
        except FileNotFoundError:
            continue
    listed = [list_runs(root) for root in roots if root.is_dir()]
    if not listed:
        return []
    every = pd.concat(listed, ignore_index=True)
    every = every[every["problem"].isna() & (every["source"] == "measured")]
    skip = exclude.resolve() if exclude is not None else None
    study = [(f"{r.run_id} · {r.device}", r.path) for r in every.itertuples() if r.purpose == "study"]
    scratch = [(f"{r.run_id} · {r.device} · scratch", r.path) for r in every.itertuples() if r.purpose == "scratch"]
    return [(label, path) for label, path in [*study, *scratch] if Path(path).resolve() != skip]


def chosen(run: store.Run, ignored: list[tuple[str, str]] | None = None, missing: str | None = None) -> ChosenRun:
    """A stored run as a notebook shows it: its device's label and ceilings (none for a CPU run)."""
    label = run.provenance.get("device_name") or run.provenance["device"]
    gpu = gpu_for_device(label, run.provenance.get("ceilings")) if run.provenance.get("device") == "cuda" else None
    return ChosenRun(run, True, label, gpu, missing, list(ignored or []))


def named_run(run_path: str) -> store.Run | None:
    """The run `run_path` names (relative to data/, or a folder), None when it is not there."""
    if not run_path:
        return None
    folder = resolve_data_path(run_path)
    return store.load_run(folder) if folder.is_dir() else None


def absent(run_path: str) -> list[tuple[str, str]]:
    """The run asked for by name, when it is not there, as a passed-over entry."""
    if not run_path:
        return []
    return [
        (shown_path(run_path), f"not in the data folder {shown_path(resolve_data_path('.'))}/ (asked for by run_path)")
    ]


def cpu_stand_in(
    spec_factory: Callable[[], object], prefix: str, missing: str, ignored: list[tuple[str, str]]
) -> ChosenRun:
    """A CPU reference sweep of `spec_factory()` made now in a temporary folder, labelled as such."""
    from dsa_lab.bench.sweep import run_sweep

    folder = Path(tempfile.mkdtemp(prefix=f"dsa_lab_{prefix}_")) / "cpu" / "cpu-reference"
    run_sweep(spec_factory(), folder, "cpu", progress=False, extra_provenance={"preset": f"ci ({prefix} stand-in)"})
    return ChosenRun(store.load_run(folder), False, CPU_STAND_IN, get_gpu("H200-measured"), missing, ignored)


def repeat_run(repeat_path: str, first: ChosenRun) -> tuple[store.Run | None, str]:
    """Notebook 02's second call over a subset (run-to-run spread): the run at `repeat_path` under data/, when it
    was measured on the same device as `first`; else None and why ('' when no path is given)."""
    if not repeat_path:
        return None, "No repeat run named (`repeat_path`): the spread between calls is not shown."
    run = named_run(repeat_path)
    if run is None:
        return None, f"No repeat run at {shown_path(resolve_data_path(repeat_path))}: the spread is not shown."
    if not first.on_gpu:
        return None, f"The run shown was timed on {first.device_label}: no GPU spread to set beside it."
    theirs = run.provenance.get("device_name") or run.provenance["device"]
    if gpu_kind(theirs) != gpu_kind(first.device_label):
        return None, (
            f"The repeat run {repeat_path} was measured on {theirs}, the run shown on {first.device_label}: "
            "runs of two devices never stand for each other's spread."
        )
    return run, ""


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
    """The newest readable profile run under data/`path`, else a CPU reference profile made now ('' for `path`:
    none is read, the CPU reference profile is shown)."""
    from dsa_lab.profiling.runs import shipped_or_cpu_reference

    root = resolve_data_path(path) if path else None
    run = shipped_or_cpu_reference(
        root if root is not None else Path(tempfile.mkdtemp(prefix="dsa_lab_no_profiles_")),
        batch=batch,
        context=context,
        next_ns=None if next_ns is None else tuple(next_ns),
    )
    if run.folder is not None:
        return ChosenProfile(run, True)
    where = f"under {shown_path(root)}" if root is not None else "named (profile_path is empty)"
    missing = (
        f"No readable profile run {where}; the charts show a torch.profiler profile of the CPU "
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
    return chosen(store.load_run(folder))


# ---------------------------------------------------------------- SM100: a run found by its compute capability


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


def _not_sm100(provenance: dict) -> str | None:
    """Why a readable run is no SM100 measurement to show (None: it is one)."""
    if sm100_evidence(provenance) is None:
        capability = (provenance.get("environment") or {}).get("gpu_capability")
        return f"not an SM100 measurement: device {provenance.get('device')!r}, compute capability {capability!r}"
    if provenance["source"] != "measured":
        return f"an SM100 run of source {provenance['source']!r}, not measured"
    if store.is_scratch(provenance):
        return "an SM100 run labelled scratch (made without --out or --root)"
    return None


def sm100_run(backend: str | None = None) -> tuple[ChosenRun | None, list[tuple[str, str]]]:
    """The newest measured SM100 run under data/ (as a `ChosenRun`), and the runs passed over with the reason.

    A run counts when its provenance says a CUDA GPU of compute capability 10.x (B200, GB200, B300, GB300;
    `sm100_evidence`), whichever data/<device>/ folder holds it, and at least one point (of `backend`, when
    given) was timed ok. Passed over, with the reason: damaged runs and non-SM100 runs under data/b200/,
    data/gb200/ (`SM100_FOLDERS`), SM100 runs that are not measurements, are scratch, cannot be read, or timed
    nothing. Paths are relative to data/. None when no run qualifies (`SM100_SWEEP_HOW` says how to make one).
    """
    try:
        root = data_dir()
    except FileNotFoundError:
        return None, []
    ignored: list[tuple[str, str]] = []
    for row in list_runs(root).to_dict("records"):  # newest first, by time
        path = Path(row["path"])
        in_sm100_folder = path.parent.name in SM100_FOLDERS
        if isinstance(row["problem"], str):
            if in_sm100_folder:
                ignored.append((relative_to_data(path), row["problem"]))
            continue
        provenance = store.read_provenance(path / store.PROVENANCE_FILE)
        why = _not_sm100(provenance)
        if why is None:
            try:
                run = store.load_run(path)
            except store.RunFormatError as err:
                why = str(err)
            else:
                why = _sm100_problem(run, backend)
                if why is None:
                    return chosen(run, ignored), ignored
        if in_sm100_folder or sm100_evidence(provenance) is not None:
            ignored.append((relative_to_data(path), why))
    return None, ignored


def relative_to_data(path: Path) -> str:
    """A run folder as pages name it: relative to data/ when it lies inside it, `scratch/...` inside the scratch
    folder, else its device folder and name (`cpu/<run_id>`): no machine paths in reports."""
    path = Path(path).resolve()
    for root, prefix in ((lambda: resolve_data_path("."), ""), (scratch_dir, "scratch/")):
        try:
            return prefix + str(path.relative_to(root().resolve()))
        except (ValueError, FileNotFoundError):
            continue
    return f"{path.parent.name}/{path.name}"
