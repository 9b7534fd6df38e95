"""One look for every chart (dsa_lab.plots.style) and the charts of notebooks 02 and 04 that use it:
strategy ↔ colour, backend ↔ marker, measured solid / modeled dashed or hatched and labelled,
legends outside the data, a provenance footer, releases by version."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from dsa_lab.analysis import frames, headline, labels, readings  # noqa: E402
from dsa_lab.analysis import profiles as analysis_profiles  # noqa: E402
from dsa_lab.analysis.modeled import modeled_rows_like  # noqa: E402
from dsa_lab.kernels import backend_names  # noqa: E402
from dsa_lab.model.roofline import get_gpu  # noqa: E402
from dsa_lab.notebook.runs import profile_run  # noqa: E402
from dsa_lab.paths import resolve_data_path  # noqa: E402
from dsa_lab.plots import kernel, latency, profiles, style, tour  # noqa: E402
from dsa_lab.policy.vllm import RELEASES  # noqa: E402
from dsa_lab.store import folders as store  # noqa: E402

PROFILES = "h200/profiles"
TRITON = ("triton", "native")  # the candidate whose mixed-context gap the shipped run explains
PROVENANCE = {
    "source": "measured",
    "device_name": "NVIDIA H200",
    "run_id": "h200-full-1",
    "created": "2026-11-29T10:00:00",
    "git": {"sha": "abcdef123456", "dirty": True},
    "environment": {"torch": "2.11.0", "triton": "3.6.0", "deep_gemm": "2.8.1", "cuda": "13.0"},
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _boxes(fig: Figure, artists: list) -> list:
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    return [artist.get_window_extent(renderer) for artist in artists]


def _footer_below_everything(fig: Figure) -> bool:
    footer = next(t for t in fig.texts if t.get_gid() == style.FOOTER_GID)
    (box,) = _boxes(fig, [footer])
    others = [a for a in [*fig.axes, *fig.legends] if a.get_visible()]
    return all(box.y1 <= other.y0 + 1 for other in _boxes(fig, others))


# ---------------------------------------------------------------- the style itself


def test_one_colour_per_strategy_one_marker_per_backend() -> None:
    native_dg, native_tr = style.series_style("native", "deepgemm"), style.series_style("native", "triton")
    assert native_dg["color"] == native_tr["color"] == style.STRATEGY_COLORS["native"]
    assert (native_dg["marker"], native_tr["marker"]) == ("o", "s")
    assert native_dg["linestyle"] == native_tr["linestyle"] == "-"  # measured: solid for every backend
    modeled = style.series_style("atom", "model (H200)", modeled=True)
    assert modeled["linestyle"] == "--" and modeled["markerfacecolor"] == "none"
    assert modeled["color"] == style.STRATEGY_COLORS["atom"]
    assert style.series_label("native", "model (B200)", "modeled").endswith(", modeled")
    markers = [style.backend_marker(name) for name in backend_names()]
    assert len(set(style.STRATEGY_COLORS.values())) == 3 and len(set(markers)) == len(markers)
    assert style.VLLM_RELEASE == RELEASES["vllm_0_33_0"][0] == "vLLM 0.33.0"  # a version, never a PR number


def test_provenance_line_names_gpu_run_sha_and_versions() -> None:
    line = style.provenance_line(PROVENANCE)
    for part in (
        "measured on NVIDIA H200",
        "run h200-full-1",
        "2026-11-29",
        "git abcdef1+dirty",
        "torch 2.11.0",
        "triton 3.6.0",
        "deep_gemm 2.8.1",
    ):
        assert part in line
    assert kernel.caption(PROVENANCE) == profiles.provenance_caption(PROVENANCE) == line  # one helper behind both


def test_footer_sits_under_legends_below_the_axes() -> None:
    fig, ax = plt.subplots(figsize=(6, 3), constrained_layout=True)
    for i in range(8):
        ax.plot([0, 1], [i, i], label=f"series {i}")
    style.legend_outside(fig, *ax.get_legend_handles_labels(), where="below", ncol=3)
    style.add_footer(fig, "measured on X | run r")
    assert style.footer_text(fig) == "measured on X | run r" and _footer_below_everything(fig)
    bare = style.add_footer(plt.figure(), None)
    assert style.footer_text(bare) == ""


# ---------------------------------------------------------------- notebook 02


def test_few_contexts_and_their_titles() -> None:
    labels = ["8192", "65536", "131072", "mixed:1024-65536", "32768"]
    assert latency.few_contexts(labels, "64K") == ["8192", "65536", "mixed:1024-65536"]
    assert latency.few_contexts(labels) == ["8192", "131072", "mixed:1024-65536"]
    assert latency.context_title("65536") == "64K" and latency.context_title("mixed:1024-65536") == "mixed 1K-64K"


def test_small_multiples_share_one_y_scale(shipped_full_run: store.Run) -> None:
    results, line = shipped_full_run.results, style.provenance_line(shipped_full_run.provenance)
    contexts = latency.few_contexts(results.loc[results["status"] == "ok", "context"], "64K")
    fig = latency.plot_vs_vllm(results, "NVIDIA H200", line, "deepgemm", contexts)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 4 * 3  # batch 1, 16, 64, 128 x three contexts: a few small multiples, not 20
    assert len({ax.get_ylim() for ax in axes}) == 1 and all(ax.get_yscale() == "log" for ax in axes)
    assert "one y scale for every panel" in fig.get_suptitle() and "vLLM 0.33.0" in fig.get_suptitle()
    drawn = [ln for ln in axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert {ln.get_color() for ln in drawn} <= set(style.STRATEGY_COLORS.values())
    assert {ln.get_marker() for ln in drawn} == {"o", "s"} and {ln.get_linestyle() for ln in drawn} == {"-"}
    (legend,) = fig.legends
    assert _boxes(fig, [legend])[0].x0 >= max(box.x1 for box in _boxes(fig, axes)) - 1  # outside the panels
    assert style.footer_text(fig) == line and _footer_below_everything(fig)


def test_measured_and_modeled_speedups_never_share_a_colour_scale(shipped_full_run: store.Run) -> None:
    results = shipped_full_run.results
    gpu = get_gpu("H200-measured")
    both = pd.concat([results, modeled_rows_like(results, gpu, shipped_full_run.provenance["seed"])], ignore_index=True)
    fig = latency.plot_speedup(both, "NVIDIA H200", provenance_line="run x")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == 4 and not any("modeled" in t for t in titles)  # measured panels only
    measured = frames.speedup_over_strategy(results)["speedup"]
    assert fig.axes[0].collections[0].norm.vmax == pytest.approx(style.speedup_span(measured))
    assert style.speedup_span(measured) >= measured.max() and 1 / style.speedup_span(measured) <= measured.min()
    modeled = latency.plot_modeled_speedup(both, "NVIDIA H200")
    (ax, _) = modeled.axes
    assert "modeled" in ax.get_title() and "not measured" in ax.get_title()
    assert all("(modeled)" in t.get_text() for t in ax.get_yticklabels())
    assert any(p.get_hatch() == style.MODELED_HATCH for p in ax.patches)  # hatched cells
    with pytest.raises(ValueError, match="no modeled point"):
        latency.plot_modeled_speedup(results, "NVIDIA H200")


def test_headline_shows_the_floor_and_keeps_its_legend_outside(shipped_full_run: store.Run) -> None:
    table = headline.headline_table(shipped_full_run.results, 128, "65536")
    assert (table["floor_us"] < table["best_us"]).all() and set(table["floor_bound"]) == {"memory", "compute"}
    fig = tour.plot_headline(
        shipped_full_run.results, table, 128, "65536", "NVIDIA H200", "measured on NVIDIA H200 | run x"
    )
    (ax,) = fig.axes
    floor = [ln for ln in ax.get_lines() if ln.get_label().startswith("floor, modeled")]
    assert len(floor) == 1 and floor[0].get_linestyle() == "--"
    assert "context = 64K" in ax.get_title() and "vLLM 0.33.0" in ax.get_title()
    legend = ax.get_legend()
    assert _boxes(fig, [legend])[0].x0 >= _boxes(fig, [ax])[0].x1  # right of the data
    assert style.footer_text(fig) == "measured on NVIDIA H200 | run x"
    html = tour.style_headline(table, "NVIDIA H200").to_html()
    assert "floor µs (modeled)" in html


def test_the_mixed_context_outlier_is_explained_from_the_run(shipped_full_run: store.Run) -> None:
    gap = frames.mixed_context_gap(shipped_full_run.results, shipped_full_run.provenance["seed"], TRITON)
    gap = gap.set_index("batch")
    b16 = gap.loc[16]
    # the 0.32-0.53x of notebook 03's heatmap (the best DeepGEMM option at next_n = 1 is native: flatten is its twin)
    assert b16["vs_best"] == pytest.approx((0.32, 0.532), abs=0.005)
    assert (b16["busy_programs"], b16["programs"]) == (80, 336)  # fewer busy programs than the H200's 132 SMs
    assert b16["token_share"] == pytest.approx(0.144, abs=0.001)
    assert b16["baseline_scale"][1] < b16["candidate_scale"][0]  # DeepGEMM's time falls with the tokens, Triton's less
    assert gap.loc[128, "busy_programs"] > 132 * 2
    text = readings.mixed_context_reading(gap.reset_index(), "NVIDIA H200", TRITON)
    assert "B = 16" in text and "80 of its 336 programs" in text and "0.32–0.53×" in text
    assert "No mixed-length batch" in readings.mixed_context_reading(gap.iloc[:0], "NVIDIA H200", TRITON)


# ---------------------------------------------------------------- notebook 04


@pytest.fixture(scope="module")
def profile() -> object:
    if not resolve_data_path(PROFILES).is_dir():
        pytest.skip(f"no shipped profile runs under {PROFILES}")
    chosen = profile_run(PROFILES)
    if not chosen.measured:
        pytest.skip("no readable shipped profile run")
    return chosen.run


def test_dram_chart_one_figure_titles_apart(profile: object) -> None:
    summary, line = profile.ncu_summary, profiles.provenance_caption(profile.provenance)
    fig = profiles.plot_dram_vs_unique(summary, line)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == summary["backend"].nunique() * summary["batch"].nunique()
    titles = _boxes(fig, [ax.title for ax in axes])
    assert len({ax.get_title() for ax in axes}) == len(axes)
    assert not any(a.overlaps(b) for i, a in enumerate(titles) for b in titles[i + 1 :])  # facet titles apart
    assert any(p.get_hatch() == style.MODELED_HATCH for ax in axes for p in ax.patches)  # the model, hatched
    (legend,) = fig.legends
    assert any("modeled" in t.get_text() for t in legend.get_texts())
    assert style.footer_text(fig) == line and "torch" in line


def test_tensor_pipe_axis_names_the_counter_it_shows(profile: object) -> None:
    summary = profile.ncu_summary
    column = analysis_profiles.tensor_column(summary)
    assert column == "tensor_hmma_pct"  # the shipped H200 rows: ncu 2025.3.1 offers only the hmma-named counter
    label = analysis_profiles.tensor_pipe_label(summary, profile.provenance)
    assert "sm__pipe_tensor_op_hmma_cycles_active" in label and "GMMA" in label and "no gmma-named counter" in label
    fig = profiles.plot_tensor_pipe(summary, "run x", profile.provenance)
    assert label in fig.get_suptitle()
    drawn = [ln for ax in fig.axes for ln in ax.get_lines()]
    assert {ln.get_color() for ln in drawn} <= set(style.STRATEGY_COLORS.values())
    assert {ln.get_marker() for ln in drawn} == {"o", "s"}


def test_tensor_pipe_prefers_the_gmma_counter_where_a_run_has_it() -> None:
    summary = pd.DataFrame({"tensor_gmma_pct": [50.0], "tensor_hmma_pct": [np.nan]})
    assert analysis_profiles.tensor_column(summary) == "tensor_gmma_pct"
    assert analysis_profiles.tensor_pipe_label(summary) == "ncu counter sm__pipe_tensor_op_gmma_cycles_active"
    with pytest.raises(ValueError, match="no tensor-pipe"):
        analysis_profiles.tensor_column(pd.DataFrame({"tensor_gmma_pct": [np.nan], "tensor_hmma_pct": [np.nan]}))


def test_the_footer_names_the_pr340_build_by_its_commit() -> None:
    origin = "deepseek-ai/DeepGEMM@57b90e06933a7c66a6e3b2135becc54e01ec4f87 (PR #340 ...)"
    provenance = {**PROVENANCE, "environment": {**PROVENANCE["environment"], "deepgemm_pr340_origin": origin}}
    assert style.provenance_line(provenance).endswith(", deepgemm-pr340 @57b90e0")
    assert "pr340" not in style.provenance_line(PROVENANCE)


# ---------------------------------------------------------------- one visual language (issue 21)


def test_no_backend_marker_is_a_glyph_with_another_meaning() -> None:
    """The modeled X, vLLM's diamond and the unknown backend's triangle mean something else: no backend
    declares them (PR #340 once drew its measured points with the modeled X)."""
    markers = {name: style.backend_marker(name) for name in backend_names()}
    reserved = {style.MODELED_MARKER, style.VLLM_MARKER["marker"], style.UNKNOWN_MARKER}
    assert not reserved & set(markers.values()), markers
    assert len(set(markers.values())) == len(markers)
    colours = [style.backend_color(name) for name in backend_names()]
    assert len(set(colours)) == len(colours)


def _background(styler, row: int, column: str) -> str:
    styler._compute()
    j = list(styler.data.columns).index(column)
    return dict(styler.ctx[(row, j)]).get("background-color", "")


def _rgb(colour: str) -> tuple[float, float, float]:
    return matplotlib.colors.to_rgb(colour)


def test_one_speedup_palette_in_every_table() -> None:
    """Faster than what it is held to is blue, slower red, the same white: in the headline, the decision
    table and the comparison alike (the headline used Reds for good news, the heatmaps RdBu)."""
    frame = pd.DataFrame({"speedup": [2.0, 1.0, 0.5, np.nan]})
    styled = style.shade_speedups(frame.style, ["speedup"])
    faster, same, slower = (_rgb(_background(styled, i, "speedup")) for i in range(3))
    assert _background(styled, 3, "speedup") == ""  # an empty cell stays unshaded (not the colour map's black)
    assert faster[2] > faster[0] + 0.2 and slower[0] > slower[2] + 0.2
    assert min(same) > 0.9  # white-ish
    assert style.speedup_norm([0.5, 2.0])(1.0) == pytest.approx(0.5)
    assert matplotlib.colormaps[style.SPEEDUP_CMAP](0.9)[2] > 0.5  # the top of the scale is blue


def test_tables_shade_speedups_blue_when_faster(shipped_full_run: store.Run) -> None:
    results = shipped_full_run.results
    table = frames.decisions(results, "deepgemm")
    folded = latency.style_decisions(table)  # every row in the table's order, folded under the top ones
    styled = folded.style(folded.full)
    row = int(table["speedup"].to_numpy().argmax())
    r, _, b = _rgb(_background(styled, row, "speedup"))
    assert b > r  # the largest speedup over vLLM's choice: blue
    rows = headline.headline_table(results, 128, "65536", "deepgemm")
    head = tour.style_headline(rows, "H200")
    best = int(rows["speedup"].to_numpy().argmax())
    r, _, b = _rgb(_background(head, best, "speedup"))
    assert b > r


def test_strategy_is_the_colour_and_backend_the_marker_however_many_backends() -> None:
    """One visual language in every chart: four native lines share the native blue and differ by the marker each
    backend declares; the strategy is never a line style (solid: measured, dashed: modeled)."""
    serving = store.load_run(resolve_data_path("h200/h200-serving-20261201")).results
    point = frames.ok_rows(serving)
    point = point[(point["batch"] == 128) & (point["context"] == "65536")]
    point = point[(point["acceptance"] == "none") & (point["logits_width"] == "batch")]
    point = point[(point["timed"] == "logits") & (point["timer"] == "events")]
    assert point["backend"].nunique() > 2
    fig = latency.plot_point(point, "deepgemm", "title")
    native = {line.get_label(): line for line in fig.axes[1].get_lines() if line.get_label().startswith("native (")}
    assert len(native) == point.loc[point["strategy"] == "native", "backend"].nunique() > 2
    assert {matplotlib.colors.to_hex(line.get_color()) for line in native.values()} == {style.STRATEGY_COLORS["native"]}
    assert len({line.get_marker() for line in native.values()}) == len(native)
    flatten = [line for line in fig.axes[1].get_lines() if line.get_label().startswith("flatten (")]
    assert flatten and all(line.get_linestyle() == "-" for line in [*flatten, *native.values()])
    cpu = latency.plot_point(point, "deepgemm", "title", speedups=False)  # a CPU's wall clock: no speedup panel
    assert len(cpu.axes) == 1


def test_every_axis_has_a_human_title() -> None:
    from dsa_lab import axes
    from dsa_lab.analysis import labels

    assert {a.name for a in axes.AXES} <= set(labels.TITLES)
    assert labels.axis_value_title("timed", "logits+topk") == "logits + top-k"
    assert labels.axis_value_title("timer", "graph") == "CUDA graph"
    assert labels.axis_value_title("beyond", True) == "yes" and labels.axis_value_title("beyond", False) == "no"
    assert labels.axis_value_title("topk_impl", "torch") == "torch's top-k (not vLLM's)"
    assert labels.axis_value_title("topk_impl", "none") == "no top-k"
    assert labels.pieces_title("4[pad 1]") == "4 (1 padding row)"


def test_serving_values_get_human_labels() -> None:
    assert labels.context_title("lognormal:16384:1.2") == "lognormal 16K σ1.2"
    assert labels.context_title("mixed:2048-131072") == "mixed 2K-128K" and labels.context_title("65536") == "64K"
    assert labels.axis_value_title("acceptance", "none") == "every draft accepted"
    assert labels.axis_value_title("acceptance", "v4flash-dspark-ascend13640:2") == (
        "v4flash-dspark-ascend13640, first 2 (0.739, 0.478)"
    )
    assert labels.axis_value_title("logits_width", "model:163840") == "logits 160K wide (vLLM's max_model_len)"
    assert labels.axis_value_title("batch", 128) == "B = 128"


def test_run_to_run_verdicts_fold_under_the_line_that_totals_them() -> None:
    comparison = pd.DataFrame({"backend": ["deepgemm"] * 3 + ["triton"], "verdict": ["same", "same", "unsure", "same"]})
    folded = latency.style_verdicts(comparison)
    assert folded.what == "compare's verdict at 4 shared points: same 3, unsure 1"
    assert folded.full.loc["deepgemm"].to_dict() == {"same": 2, "unsure": 1}
    assert folded.to_html().startswith("<details><summary><b>compare&#x27;s verdict at 4 shared points")
