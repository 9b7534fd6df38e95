"""Every explorer, driven without a browser: each Dropdown it offers moved in turn, and after every move
a fresh, not blank chart (the browser test's pixel check) and no error; the pixel check itself refuses a
blank PNG; the 02 explorer keeps vLLM's baseline when DeepGEMM is left out, offers only what a run
measured, and opens other study runs; bad text gets the explorer's one-line error."""

from __future__ import annotations

import io
import shutil
from html import unescape
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import ipywidgets as widgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from browser_support import image_problem  # noqa: E402
from IPython.display import HTML, Image  # noqa: E402

from dsa_lab.analysis import e2e  # noqa: E402
from dsa_lab.explorers import base, decode_paths, latency, profiles  # noqa: E402
from dsa_lab.explorers import e2e as e2e_explorer_module  # noqa: E402
from dsa_lab.notebook.runs import profile_run  # noqa: E402
from dsa_lab.paths import resolve_data_path  # noqa: E402
from dsa_lab.plots.style import provenance_line  # noqa: E402
from dsa_lab.store import folders as store  # noqa: E402

SHIPPED = "h200/h200-full-20261129"
SERVING = "h200/h200-serving-20261201"


def png_of(fig: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def test_the_pixel_check_refuses_a_blank_png_and_passes_a_chart() -> None:
    assert image_problem(png_of(plt.figure(figsize=(4, 3)))).startswith("blank:")  # white: what ipykernel 7 drew
    grey = plt.figure(figsize=(4, 3), facecolor="0.8")
    assert image_problem(png_of(grey)).startswith("blank:")  # one colour, not white
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 2, 3], [3, 1, 2])
    assert image_problem(png_of(fig)) is None
    assert image_problem(b"not a png").startswith("not a readable image")


def test_a_figure_leaves_pyplot_before_it_is_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rendered while still in pyplot's registry, 05's explorer drew blank PNGs in JupyterLab."""
    fig, ax = plt.subplots()
    ax.plot([1, 2], [2, 1])
    registered, shown = [], []
    real = base.figure_png
    monkeypatch.setattr(base, "figure_png", lambda f: registered.append(plt.fignum_exists(f.number)) or real(f))
    monkeypatch.setattr(base, "display", shown.append)
    base.show_figure(fig)
    assert registered == [False] and image_problem(shown[0].data) is None


class Shown:
    """What the explorers display, in order (their `display`, patched): the box, images, errors."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.items: list[object] = []
        for module in (base, decode_paths, latency, profiles, e2e_explorer_module):
            monkeypatch.setattr(module, "display", self.items.append)

    def box(self) -> widgets.VBox:
        return next(item for item in self.items if isinstance(item, widgets.VBox))

    def since(self, start: int) -> tuple[list[bytes], list[str]]:
        later = self.items[start:]
        images = [item.data for item in later if isinstance(item, Image)]
        errors = [item.data for item in later if isinstance(item, HTML) and base.ERROR_CLASS in item.data]
        return images, errors


def dropdowns(box: widgets.Widget) -> list[widgets.Dropdown]:
    children = getattr(box, "children", ())
    found = [box] if isinstance(box, widgets.Dropdown) else []
    return found + [d for child in children for d in dropdowns(child)]


def move_every_dropdown(shown: Shown, start: int = 0) -> tuple[int, int]:
    """Move each offered Dropdown to its next option; after each, every chart drawn anew, none blank, no
    error. `start`: where the last draw's outputs begin. Returns (moves, charts checked)."""
    images, errors = shown.since(start)
    assert images and not errors, errors
    assert not [p for p in map(image_problem, images) if p]
    moves, checked = 0, len(images)
    index = 0
    while index < len(offered := [d for d in dropdowns(shown.box()) if not d.disabled and len(d.options) > 1]):
        control = offered[index]
        start = len(shown.items)
        values = [o[1] if isinstance(o, tuple) else o for o in control.options]
        control.value = values[(values.index(control.value) + 1) % len(values)]
        drawn, errors = shown.since(start)
        where = f"{control.description} -> {control.value!r}"
        assert not errors, f"{where}: {errors}"
        assert len(drawn) == len(images), f"{where}: {len(drawn)} charts, {len(images)} before"
        problems = [p for p in map(image_problem, drawn) if p]
        assert not problems, f"{where}: {problems}"
        moves, checked, index = moves + 1, checked + len(drawn), index + 1
    assert not plt.get_fignums(), "an explorer left a figure open (it would be flushed again, outside it)"
    return moves, checked


@pytest.fixture(scope="module")
def shipped() -> store.Run:
    return store.load_run(resolve_data_path(SHIPPED))


def test_decode_path_explorer_draws_after_every_move(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = Shown(monkeypatch)
    decode_paths.decode_path_explorer(interactive=True)
    assert move_every_dropdown(shown) == (3, 8)  # release, platform, next_n; two charts each time


def test_latency_explorer_draws_after_every_move_of_every_run(
    monkeypatch: pytest.MonkeyPatch, shipped: store.Run
) -> None:
    shown = Shown(monkeypatch)
    caption = provenance_line(shipped.provenance)
    latency.latency_explorer(shipped.results, "H200", True, caption, resolve_data_path(SHIPPED))
    moves, checked = move_every_dropdown(shown)
    assert moves >= 3 and checked == moves + 1
    run = dropdowns(shown.box())[0]
    assert run.description == "run" and run.options[0][1] == latency.THIS_RUN
    assert str(resolve_data_path(SHIPPED)) not in [v for _, v in run.options]  # the notebook's run, once


def test_the_serving_run_offers_only_what_it_measured(monkeypatch: pytest.MonkeyPatch, shipped: store.Run) -> None:
    shown = Shown(monkeypatch)
    latency.latency_explorer(shipped.results, "H200", True, None, resolve_data_path(SHIPPED))
    controls = {d.description: d for d in dropdowns(shown.box())}
    assert controls["acceptance"].disabled and controls["timer"].disabled  # the shipped run: one value each
    controls["run"].value = str(resolve_data_path(SERVING))
    serving = store.load_run(resolve_data_path(SERVING)).results
    serving = serving[serving["status"] == "ok"]
    batch = controls["batch"].value
    assert {v for _, v in controls["context"].options} == set(serving.loc[serving["batch"] == batch, "context"])
    controls["batch"].value, controls["context"].value = 128, "mixed:2048-131072"  # where the curves were timed
    here = serving[(serving["batch"] == 128) & (serving["context"] == "mixed:2048-131072")]
    assert {v for _, v in controls["acceptance"].options} == set(here["acceptance"]) and len(
        set(here["acceptance"])
    ) > 1
    assert not controls["acceptance"].disabled
    labels = [label for name in ("context", "acceptance") for label, _ in controls[name].options]
    assert not any(":" in label for label in labels), labels  # human labels: 'mixed 2K-128K', 'lognormal 16K σ1.2'
    images, errors = shown.since(0)
    assert not errors and not [p for p in map(image_problem, images) if p]


def test_a_run_switch_selects_every_option_the_new_run_timed(
    monkeypatch: pytest.MonkeyPatch, shipped: store.Run
) -> None:
    """Issue 28: the notebook's run timed DeepGEMM and Triton; switched to the serving run, the backends shown are
    every one it timed (Gluon and PR #340 too), not the old run's two, and the explorer says so."""
    shown = Shown(monkeypatch)
    latency.latency_explorer(shipped.results, "H200", True, None, resolve_data_path(SHIPPED))
    box = shown.box()
    (backends,) = [w for row in box.children for w in getattr(row, "children", ()) if w.description == "backends"]
    assert set(backends.value) == {"deepgemm", "triton"}
    run = dropdowns(box)[0]
    start = len(shown.items)
    run.value = str(resolve_data_path(SERVING))
    assert {"gluon", "deepgemm-pr340", "deepgemm"} <= set(backends.value) == set(backends.options)
    said = [item.data for item in shown.items[start:] if hasattr(item, "data") and isinstance(item.data, str)]
    assert any("every one selected" in text and "gluon" in text for text in said), said
    assert base.SELECTED_CSS in box.children[0].value  # selected options in the selection colour, focused or not


def test_scratch_runs_are_offered_labelled_and_a_cpu_run_draws_no_speedups(
    monkeypatch: pytest.MonkeyPatch, shipped: store.Run, tmp_path: Path
) -> None:
    from dsa_lab.paths import SCRATCH_ENV

    scratch = tmp_path / "scratch"
    mine = scratch / "cpu" / "my-cpu-run"
    shutil.copytree(resolve_data_path(SHIPPED), mine)
    store.update_provenance(mine, run_id="my-cpu-run", device="cpu", device_name="cpu", scratch=True)
    monkeypatch.setenv(SCRATCH_ENV, str(scratch))
    shown = Shown(monkeypatch)
    latency.latency_explorer(shipped.results, "H200", True, None, resolve_data_path(SHIPPED))
    run = dropdowns(shown.box())[0]
    assert ("my-cpu-run · cpu · scratch", str(mine)) in run.options
    start = len(shown.items)
    run.value = str(mine)
    images, errors = shown.since(start)
    assert len(images) == 1 and not errors
    table = next(item for item in shown.items[start:] if hasattr(item, "data") and hasattr(item, "to_html"))
    assert "speedup over vLLM" not in table.data and list(table.data) == ["fastest", "fastest µs"]


def test_the_baseline_stays_when_deepgemm_is_left_out(monkeypatch: pytest.MonkeyPatch, shipped: store.Run) -> None:
    shown = Shown(monkeypatch)
    latency.latency_explorer(shipped.results, "H200", True)
    box = shown.box()
    (backends,) = [w for row in box.children for w in getattr(row, "children", ()) if w.description == "backends"]
    start = len(shown.items)
    backends.value = ("triton",)
    table = next(item for item in shown.items[start:] if hasattr(item, "data") and hasattr(item, "to_html"))
    assert table.data["vLLM µs"].notna().all()  # vLLM's choice timed on DeepGEMM, though DeepGEMM is not shown
    assert table.data["recommended"].str.endswith(("(triton)", "(deepgemm)")).all()  # triton, or vLLM's kept
    assert table.data["fastest"].str.endswith("(triton)").all()
    assert table.data["speedup over vLLM"].notna().all()
    assert "<td" in table.to_html() and "escape" not in table.to_html()


def test_recommendations_take_vllms_time_from_every_row(shipped: store.Run) -> None:
    point = shipped.results[(shipped.results["batch"] == 128) & (shipped.results["context"] == "65536")]
    point = latency.explorable(point)
    table = latency.recommendations(point, ["triton"], ["native"])
    assert table["vLLM µs"].notna().all() and (table["recommended"].str.endswith("(triton)") | True).all()
    assert set(table["fastest"]) == {"native (triton)"}


BAD_TEXT = [
    ("150, x", "all", "context lengths='150, x': enter comma-separated whole numbers"),
    ("150, 70", "5, 1", "decode lengths='5, 1': decode_lens[0]=5"),
    ("0", "all", "context lengths='0', decode lengths='all'"),
    ("", "all", "context lengths: empty"),
]


def test_bad_text_gets_the_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = Shown(monkeypatch)
    decode_paths.decode_path_explorer(interactive=True)
    texts = [w for row in shown.box().children for w in getattr(row, "children", ()) if isinstance(w, widgets.Text)]
    assert texts and all(not t.continuous_update for t in texts)  # redraw on Enter, not at every keystroke
    for context_text, decode_text, says in BAD_TEXT:
        start = len(shown.items)
        with texts[0].hold_trait_notifications(), texts[1].hold_trait_notifications():
            texts[0].value, texts[1].value = context_text, decode_text
        _, errors = shown.since(start)
        assert errors and says in unescape(errors[-1]), (context_text, decode_text, errors)


def test_profile_and_decode_step_explorers_draw_after_every_move(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = Shown(monkeypatch)
    chosen = profile_run("h200/profiles")
    profiles.profile_explorer(chosen.run, "caption", interactive=True)
    moves, checked = move_every_dropdown(shown)
    assert moves == 3 and checked == 4
    shown = Shown(monkeypatch)
    times = e2e.IndexerTimes(store.load_run(resolve_data_path(SHIPPED)).results, "triton")
    e2e_explorer_module.e2e_explorer(times, interactive=True)
    controls = {d.description: d for d in dropdowns(shown.box())}
    start = len(shown.items)
    controls["next_n"].value = 4  # 'DeepSeek-V3, 1 draft' covers next_n <= 2: not offered at 4
    assert "DeepSeek-V3, 1 draft" not in controls["acceptance"].options
    assert move_every_dropdown(shown, start)[0] == 6
