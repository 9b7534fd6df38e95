"""What a notebook section reads, declared, and what it shows: `Section` (the values a run must hold), and its
`view` (the run's frame, its label, caption and note, resolved in one place, so no notebook cell branches on
whether its data is measured).

A run *covers* a section when it is a measurement that lacks none of the section's values. The run a section was
written for is one such run, so a checkout without a newer one of its own shows it; the newest covering run is
found by the store's one search (`store.listing.newest`), which names every newer run it passed over and why.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from dsa_lab import axes
from dsa_lab.analysis.frames import one_view
from dsa_lab.kernels import fused_backends, vllm_backend
from dsa_lab.markup import md_code
from dsa_lab.notebook.runs import (
    SWEEP_HOW,
    ChosenRun,
    absent,
    chosen,
    cpu_stand_in,
    named_run,
    passed,
    relative_to_data,
    search,
)
from dsa_lab.paths import resolve_data_path, shown_path
from dsa_lab.plots.style import provenance_line
from dsa_lab.store import folders as store


@dataclass(frozen=True)
class Section:
    """What a notebook section reads from a run, declared: the values of each axis it must find timed ok
    (`needs`, e.g. what vLLM runs, contexts 64K and mixed:2K-128K). `grid`: every combination of them, not each
    one somewhere (a sweep's grid)."""

    name: str
    needs: Mapping[str, tuple[object, ...]]
    grid: bool = False
    how: str = "Make one on an H200 with `dsa-lab bench --preset h200-serving --root data`."
    # Other GPUs' folders (data/<gpu>/) read, in order, when the page's own holds no covering run: a study that
    # runs on any of them (the step's, on any SM90 card). Its run is named with its card; nothing in it is set
    # against another card's numbers.
    cards: tuple[str, ...] = ()

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

    def run(self, run_path: str = "", device: str = "h200") -> tuple[ChosenRun | None, str]:
        """The run this section shows, and a note ('' when none is due): `run_path` (relative to data/, or a
        folder) when it covers the section; else the newest measured run of `device` that does, or of the first of
        `cards` with one (the note naming its card), the note saying why not the one asked for (`missing` set: the
        index flags it); else None, the note saying what is missing and how to measure it. Runs passed over are
        named, never skipped in silence."""
        notes = []
        asked = named_run(run_path)
        if asked is not None:
            if self.covers(asked):
                return chosen(asked), ""
            gaps = "; ".join(f"{k} {', '.join(v)}" for k, v in self.lacks(asked).items()) or "a measurement"
            notes.append(f"The run asked for, {relative_to_data(asked.path)}, lacks the {self.name} ({gaps})")
        elif run_path:
            notes.append(
                f"The run asked for, {shown_path(run_path)}, {absent(run_path)[0][1].removesuffix(' (asked for by run_path)')}"
            )
        found = search(device, self)
        ignored = passed(found)
        if found.run is None:
            other = self._on_another_card(device)
            if other is not None:
                card, run = other
                notes.append(
                    f"No {device.upper()} run holds the {self.name}: showing {relative_to_data(run.path)}, measured "
                    f"on the {card.upper()}, whose numbers are set against each other only"
                )
                note = ". ".join(notes) + "."
                return chosen(run, ignored, missing=note if len(notes) > 1 else None), note
            notes.append(
                f"No {self.describe()} under {shown_path(resolve_data_path(device))}: the {self.name} are not "
                f"shown. {self.how}"
            )
            return None, ". ".join(notes).rstrip(".") + "."
        if not notes:
            return chosen(found.run, ignored), ""
        note = f"{'. '.join(notes)}: showing {relative_to_data(found.run.path)} instead."
        return chosen(found.run, ignored, missing=note), note

    def _on_another_card(self, device: str) -> tuple[str, store.Run] | None:
        """The first of `cards` (not `device`) with a run covering the section, and that run."""
        for card in self.cards:
            if card != device and (run := search(card, self).run) is not None:
                return card, run
        return None

    def view(self, run_path: str = "", device: str = "h200") -> View:
        """What the section draws (`View`), from `run`."""
        return View.of(*self.run(run_path, device))


@dataclass
class View:
    """A section's data, resolved once: `chosen` (None: nothing to show, `note` says why), `frame` (its rows of one
    shape and serving setting, `frames.one_view`), `label` (the device it was measured on), `caption` (the
    provenance line under each chart) and `note` (Markdown: which run and why, and the setting shown)."""

    chosen: ChosenRun | None
    frame: pd.DataFrame
    label: str
    caption: str
    note: str
    setting_note: str = ""

    @classmethod
    def of(cls, chosen_run: ChosenRun | None, why: str = "") -> View:
        if chosen_run is None:
            return cls(None, pd.DataFrame(), "", "", why)
        frame, setting = one_view(chosen_run.run.results)
        caption = provenance_line(chosen_run.run.provenance)
        if not chosen_run.measured:
            caption = f"{chosen_run.device_label} | {caption}"
        return cls(chosen_run, frame, chosen_run.device_label, caption, why, setting)

    @property
    def shown(self) -> bool:
        return self.chosen is not None

    @property
    def run_id(self) -> str:
        return self.chosen.run.provenance["run_id"] if self.chosen is not None else ""

    def names(self) -> str:
        """'run `RUN` on NVIDIA H200': what a heading or reading says of where its numbers come from."""
        return f"run {md_code(self.run_id)} on {self.label}" if self.chosen is not None else ""


SERVING = Section(
    "serving answers",  # notebook 02's uniform beside ragged, notebook 03's ragged kernels, the index's answers
    {
        "backend": (vllm_backend().name,),
        "context": ("65536", "mixed:2048-131072"),
        "timed": ("logits",),
        # what they read is the default setting (`workloads.default_axes`): a run timed only otherwise lacks it
        **{a.name: (a.old_value,) for a in axes.AXES if a.name in axes.SETTING_KEYS and a.implied_value is None},
    },
)
STEP_HOW = (
    "Make one on an H100 or H200 with `scripts/step_study.sh` (the `step` preset; vLLM's top-k built by "
    "`scripts/build_vllm_topk.py`)."
)
SM90_CARDS = ("h200", "h100")  # where the step study runs (`bench.presets.step_grids`: any SM90 GPU)
WHOLE_STEP = Section(
    "whole-step answers",  # the step a user pays for: the logits, then vLLM's own top-k (a torch stand-in's is history)
    {"backend": (vllm_backend().name,), "timed": ("logits+topk",), "topk_impl": ("vllm",)},
    how=STEP_HOW,
    cards=SM90_CARDS,
)
VLLM_STEP = Section(
    "step split with vLLM's top-k",  # notebook 02's split of each option's step into its logits and its top-k
    {"backend": (vllm_backend().name,), "timed": ("logits", "logits+topk"), "topk_impl": ("vllm",)},
    how=STEP_HOW,
    cards=SM90_CARDS,
)
FUSED_STEP = Section(
    "fused step",  # issue 27: a fused backend's whole step beside every unfused option's logits and vLLM's top-k
    {"backend": (*fused_backends()[:1], vllm_backend().name), "timed": ("logits+topk",), "topk_impl": ("vllm",)},
    how=STEP_HOW,
    cards=SM90_CARDS,
)
RAGGED_VERIFICATION = Section(
    "ragged verification",  # one graph replayed over steps of per-request draft counts (`bench.replay`)
    {"backend": (vllm_backend().name,), "timer": ("replay",)},
    how=STEP_HOW,
    cards=SM90_CARDS,
)


def latency_section() -> Section:
    """What notebooks 00, 02 and 05's main sections read: what vLLM runs, timed at every batch and context of the
    study's grid (`bench.presets.STUDY_GRID`, the h200-full preset's)."""
    from dsa_lab.bench.presets import STUDY_GRID

    needs = {"backend": (vllm_backend().name,), "batch": STUDY_GRID["batch"], "context": STUDY_GRID["context"]}
    return Section(
        "latency sweep",
        needs,
        grid=True,
        how="Make one on an H200 with `dsa-lab bench --preset h200-full --root data`.",
    )


# ---------------------------------------------------------------- a notebook's main run: the one named, or a stand-in


def stored_or_stand_in(
    run_path: str, gpu: str, section: Section, stand_in: Callable[[], object], prefix: str
) -> ChosenRun:
    """The run `run_path` names (whatever it holds: the user asked for it, and the page says what it cannot read
    from it), else the newest measured run of `gpu` that covers `section`, else a CPU reference sweep of
    `stand_in()`, labelled as such."""
    run = named_run(run_path)
    if run is not None:
        return chosen(run)
    found = search(gpu, section)
    ignored = absent(run_path) + passed(found)
    if found.run is not None:
        return chosen(found.run, ignored)
    missing = (
        f"No {section.describe(f'measured {gpu.upper()} run')} under {shown_path(resolve_data_path(gpu))}; the "
        f"charts show a CPU reference sweep run just now and roofline-modeled times. {SWEEP_HOW}"
    )
    return cpu_stand_in(stand_in, prefix, missing, ignored)


def latency_run(run_path: str = "", device: str = "h200", seed: int = 0) -> ChosenRun:
    """Notebooks 00, 02 and 05's data: `run_path` if it is there, else the newest measured run covering the
    study's grid (`latency_section`), else a CPU stand-in."""
    from dsa_lab.bench.presets import preset

    def stand_in() -> object:
        return preset("ci").with_axes(next_n=(1, 2, 3, 4), context=("128", "mixed:64-256"), seed=seed)

    return stored_or_stand_in(run_path, device, latency_section(), stand_in, "nb02")


def kernel_run(run_path: str, device: str, backend: str, seed: int = 0) -> ChosenRun:
    """Notebook 03's data: `run_path` if it is there (a candidate it lacks is said by the page), else the newest
    measured run in which `backend` was timed, else a CPU stand-in."""
    from dsa_lab.bench.presets import preset

    def stand_in() -> object:
        return preset("ci").with_axes(next_n=(1, 2, 3, 4), seed=seed)

    section = Section("kernel comparison", {"backend": (backend,)}, how=SWEEP_HOW)
    return stored_or_stand_in(run_path, device, section, stand_in, "nb03")
