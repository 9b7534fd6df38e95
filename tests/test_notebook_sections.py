"""The sections the library hands the notebooks, each checked on its own: what it computes, the notes it
keeps, and what it says when the data is not what was asked for (the notebooks run them end to end in
tests/test_notebooks.py)."""

from __future__ import annotations

import dataclasses
import warnings

import pandas as pd
import pytest
from tqdm import TqdmWarning

from dsa_lab.analysis import agreement, e2e, frames, headline, profiles
from dsa_lab.batch.workload import ContextSpec, ragged_decode_batch, random_inputs, with_padding
from dsa_lab.invariance import LOGITS_COLUMN, StrategiesDisagree
from dsa_lab.model.decode_step import ACCEPTANCE_PRESETS
from dsa_lab.notebook import display as notebook
from dsa_lab.notebook import views
from dsa_lab.notebook.runs import repeat_run
from dsa_lab.notebook.sections import latency_run
from dsa_lab.notebook.sm100 import Sm100Frame, sm100_backend, sm100_point

SHIPPED = "h200/h200-harness-20261130"  # a small measured run (80 points)


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the notebook helpers display, as Markdown text (banners and provenance as their plain text)."""
    out: list[str] = []

    def display(obj, raw: bool = False) -> None:
        out.append(obj["text/plain"] if raw else obj.data)

    monkeypatch.setattr(notebook, "display", display)
    return out


def test_note_shows_each_text_given_and_leaves_out_empty_ones(shown: list[str]) -> None:
    notebook.note("*one*", None, "", "two")
    assert shown == ["*one*", "two"]


def test_setup_notebook_silences_progress_bars_and_returns_a_clock() -> None:
    with warnings.catch_warnings():
        elapsed = notebook.setup_notebook("white", ignore=(UserWarning,))
        assert any(f[2] is TqdmWarning and f[0] == "ignore" for f in warnings.filters)
        assert any(f[2] is UserWarning and f[0] == "ignore" for f in warnings.filters)
    first = elapsed()
    assert 0 <= first <= elapsed()


def test_show_sm100_says_modeled_and_lists_the_runs_passed_over(shown: list[str]) -> None:
    frame = Sm100Frame(pd.DataFrame(), False, "B200 (modeled)", "these times are **modeled, not measured**")
    frame.ignored.append(("b200/broken-run", "results.parquet is missing"))
    notebook.show_sm100(frame, "SM100 run")
    assert shown[0] == "these times are **modeled, not measured**"
    assert shown[1] == r"*Passed over (run): `b200/broken-run`: results\.parquet is missing.*"  # escaped: text
    assert len(shown) == 2  # no banner, no provenance: nothing was measured


def test_show_sm100_announces_a_measured_run(shown: list[str]) -> None:
    chosen = latency_run(SHIPPED)  # a measured run standing in for one measured on a B200
    frame = Sm100Frame(chosen.run.results, True, chosen.device_label, "Measured on a B200", chosen)
    notebook.show_sm100(frame, "SM100 run")
    assert shown[0] == "Measured on a B200"
    assert any(text.startswith("data used (SM100 run):") for text in shown[1:])


def _results() -> pd.DataFrame:
    """Two points of DeepGEMM-like times in ms (batch 4 complete, batch 8 native next_n = 1 only)."""
    times = {(1, "native"): 1.0, (1, "flatten"): 1.0, (2, "native"): 1.1, (2, "flatten"): 2.0, (3, "flatten"): 3.0}
    shape = {
        "context": "1024",
        "status": "ok",
        "source": "measured",
        "heads": 64,
        "head_dim": 128,
        "cache_dtype": "fp8",
    }
    rows = [
        {"backend": "deepgemm", "strategy": s, "batch": 4, "next_n": n, "median_ms": ms, **shape}
        for (n, s), ms in times.items()
    ]
    rows.append({**rows[0], "batch": 8, "median_ms": 0.1})
    frame = pd.DataFrame(rows)
    return frame.assign(p25_ms=frame["median_ms"] * 0.99, p75_ms=frame["median_ms"] * 1.01, pieces="1")


def test_headline_section_at_a_measured_point_has_no_notes() -> None:
    section = headline.headline_section(_results(), 4, "1024")
    assert (section.batch, section.context, section.vllm_backend, section.notes) == (4, "1024", "deepgemm", ())
    assert list(section.table["next_n"]) == [1, 2, 3]


def test_headline_section_says_which_point_it_shows_instead() -> None:
    section = headline.headline_section(_results(), 128, "64K")
    assert (section.batch, section.context) == (8, "1024")
    assert len(section.notes) == 1 and "batch=128, context=65536 was not measured" in section.notes[0]
    assert section.notes[0].startswith("*") and section.notes[0].endswith("*")


def test_agreement_table_check_and_reading() -> None:
    batch = with_padding(ragged_decode_batch(3, 100, 300, next_n=3, seed=1), padding_requests=1, padding_tokens=2)
    inputs = random_inputs(batch, seed=1)
    table = agreement.strategy_table(inputs, "reference", topk=16)
    assert list(table.index) == ["native", "flatten", "atom"]
    assert table.loc["flatten", agreement.BLOCKS_COLUMN] > table.loc["native", agreement.BLOCKS_COLUMN]
    assert agreement.checked_tolerance(table, "reference") == 0.0  # the reference is batch invariant
    reading = agreement.agreement_reading(table, 0.0, 16, batch.num_decode_tokens)
    assert reading.startswith(f"All three strategies agree on all {table.attrs['valid positions']} valid logits")
    wrong = table.copy()
    wrong.loc["flatten", LOGITS_COLUMN] = 1.0
    with pytest.raises(StrategiesDisagree, match="flatten"):
        agreement.checked_tolerance(wrong, "reference")


def test_profile_sections() -> None:
    kernels = pd.DataFrame({"batch": [2, 2, 4], "next_n": [1, 4, 2]})
    assert profiles.timeline_point(kernels, None, 8) == (4, 2)  # the largest batch; its largest next_n
    assert profiles.timeline_point(kernels, 2, 4) == (2, 4)
    frame, title = profiles.modeled_reread_stand_in({"spec": {"batch": [1, 8], "context": ["2048"]}}, 2, 256, [1, 2])
    assert set(frame["next_n"]) == {1, 2} and "B=8, L=2048" in title and "not a measurement" in title


def test_e2e_sections() -> None:
    presets = e2e.presets_table()
    assert list(presets["preset"]) == list(ACCEPTANCE_PRESETS)
    first = next(iter(ACCEPTANCE_PRESETS.values()))[0]
    assert presets["tokens a step at full depth"].iloc[0] == pytest.approx(1 + sum(first))
    chosen = latency_run(SHIPPED)
    assert (
        len(e2e.model_errors(chosen.run.results, chosen.run.provenance["seed"]))
        == (chosen.run.results["status"] == "ok").sum()
    )
    assert e2e.model_errors(None, 0).empty  # no GPU run (a CPU one, a stand-in): nothing to hold the model to
    plug_in = chosen.run.results.assign(backend="reference")  # a backend the model does not cover
    assert e2e.model_errors(plug_in, 0).empty  # (it used to raise ValueError: backend='reference')
    assert e2e.typical_error(e2e.model_errors(None, 0)) is None
    assert e2e.reproduces(0.0115, 0.005, 0.565).startswith("not judged: the model's interval")  # wider than 1.15 %
    assert e2e.reproduces(0.0115, 0.010, 0.013) == "yes: inside the model's interval"
    assert e2e.reproduces(0.0115, 0.002, 0.005).startswith("no: outside")
    published = pd.DataFrame(
        {
            "batch": [32, 1],
            "context": [16384, 8192],
            "published_deepgemm_us": [50.0, 9.0],
            "published_cute_us": [40.0, 8.0],
            "modeled_deepgemm_us": [55.0, 10.0],
            "error": [0.1, 0.11],
            "bound": ["memory", "launch"],
        }
    )
    reading = e2e.published_reading(published)
    assert "**50.0 µs** for DeepGEMM" in reading and "**55.0 µs** (modeled, +10%)" in reading
    assert "At the 1 smaller points the model is launch-bound and +11% to +11% high" in reading


def test_announce_section_says_why_as_text_then_announces(shown: list[str]) -> None:
    notebook.announce_section(None, "run *x* lacks the section", "serving run")
    assert shown == [r"*run \*x\* lacks the section*"]  # escaped: the run's words are text, not markup
    shown.clear()
    notebook.announce_section(latency_run(SHIPPED), "", "serving run")
    assert any(text.startswith("data used (serving run): run_id=h200-harness-20261130") for text in shown)
    shown.clear()
    instead = dataclasses.replace(latency_run(SHIPPED), missing="the run asked for lacks the section")
    notebook.announce_section(instead, "the run asked for lacks the section", "serving run")
    assert sum("lacks the section" in text for text in shown) == 1  # the banner says it, once


def test_repeat_run_and_its_provenance(shown: list[str]) -> None:
    first = latency_run(SHIPPED)
    assert repeat_run("", first) == (
        None,
        "No repeat run named (`repeat_path`): the spread between calls is not shown.",
    )
    assert repeat_run("h200/no-such-run", first)[0] is None
    cpu = views.ChosenRun(first.run, True, "cpu", None)
    cpu.run.provenance["device"] = "cpu"
    try:
        none, why = repeat_run(SHIPPED, cpu)  # a CPU run shown: no GPU spread beside it (it used to fail)
    finally:
        cpu.run.provenance["device"] = "cuda"
    assert none is None and "timed on cpu" in why
    repeat, why = repeat_run(SHIPPED, first)
    assert repeat is not None and repeat.provenance["run_id"] == "h200-harness-20261130" and why == ""
    notebook.show_run(repeat, "repeat run (spread)")
    assert shown == [
        f"data used (repeat run (spread)): run_id=h200-harness-20261130, path=h200/h200-harness-20261130, "
        "source=measured, "
        f"created={repeat.provenance['created']}, git_sha={repeat.provenance['git'].get('sha')}"
    ]


def test_decision_backend_keeps_the_one_asked_for_else_says_which() -> None:
    results = _results()
    assert frames.decision_backend(results, "deepgemm", "run-a") == ("deepgemm", None)
    more = pd.concat([results, results.assign(backend="triton"), results.assign(backend="triton", batch=16)])
    backend, why = frames.decision_backend(more, "gluon", "run-a")
    assert backend == "triton"  # the most timed
    assert why == "*Backend `gluon` has no timed rows in this run; deciding on `triton` (timed: triton, deepgemm).*"
    with pytest.raises(ValueError, match="run run-a: no point timed ok"):
        frames.decision_backend(results.assign(status="error"), "deepgemm", "run-a")


def test_sm100_point_and_backend() -> None:
    results = _results()
    measured = Sm100Frame(results, True, "NVIDIA B200", "Measured on a B200")
    at = sm100_point(measured, None, 128, "64K")
    assert (at.batch, at.context) == (8, "1024") and at.frame is results  # the SM100 run's nearest point
    rows = results.assign(source="modeled", backend="triton")
    model = Sm100Frame(rows, False, "B200 (modeled)", "modeled")
    alone = sm100_point(model, None, 128, "64K")
    assert (alone.batch, alone.context) == (128, ContextSpec.parse("64K").label) and alone.frame is rows
    beside = sm100_point(model, results, 4, "1024")
    assert (beside.batch, beside.context) == (4, "1024") and len(beside.frame) == 2 * len(results)
    assert sm100_backend(measured) == "deepgemm"  # what vLLM runs, when it was timed
    assert sm100_backend(model) == "triton"  # else the first timed


def test_notebook_03_takes_a_plug_in_kernel_and_holds_it_to_what_the_run_timed() -> None:
    """The candidate asked for, else the first backend that is neither DeepGEMM nor the reference; the baseline
    every DeepGEMM build timed, else the reference; each substitution said."""
    results = _results()
    both = pd.concat([results, results.assign(backend="deepgemm-pr340"), results.assign(backend="gluon")])
    sides = views.candidate_of(both, "gluon")
    assert sides.candidate == ("gluon", "native") and sides.baseline == ("deepgemm", "deepgemm-pr340")
    assert sides.label == "the best DeepGEMM option (deepgemm, deepgemm-pr340)" and sides.note == ""
    plug_in = pd.concat([results.assign(backend="reference"), results.assign(backend="my-kernel")])
    sides = views.candidate_of(plug_in, "gluon")
    assert sides.candidate == ("my-kernel", "native") and sides.baseline == ("reference",)
    assert "`gluon` was not timed in this run; the candidate is `my-kernel`" in sides.note
    with pytest.raises(ValueError, match="no point timed ok"):
        views.candidate_of(results.assign(status="error"), "gluon")
