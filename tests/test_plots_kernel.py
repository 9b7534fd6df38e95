"""Notebook 03's tables and charts on a small synthetic run (measured H200 rows plus modeled ones)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from dsa_lab.analysis import readings, versus  # noqa: E402
from dsa_lab.analysis.modeled import modeled_native_rows  # noqa: E402
from dsa_lab.batch.plan import LaunchPlan  # noqa: E402
from dsa_lab.batch.workload import ContextSpec  # noqa: E402
from dsa_lab.bench.point import Point  # noqa: E402
from dsa_lab.model.roofline import get_gpu, modeled_time, roofline_columns  # noqa: E402
from dsa_lab.plots import kernel, kernel_tables, style  # noqa: E402
from dsa_lab.policy.query import Platform  # noqa: E402

H200 = get_gpu("H200-measured")
SEED = 0
TRITON = ("triton", "native")  # the candidate these tests compare against DeepGEMM
# Hand-set medians (µs) at batch=2, context=1024; None: the point was skipped (no native kernel,
# or atom would be the native launch itself). DeepGEMM on SM90 is native for next_n in {1, 2, 4}.
TIMES_US = {
    ("deepgemm", "native"): {1: 10.0, 2: 15.0, 3: None, 4: 40.0, 5: None},
    ("deepgemm", "atom"): {1: None, 2: None, 3: 30.0, 4: None, 5: 45.0},
    ("deepgemm", "flatten"): {1: 11.0, 2: 14.0, 3: 25.0, 4: 60.0, 5: 70.0},
    ("triton", "native"): {1: 8.0, 2: 10.0, 3: 12.5, 4: 20.0, 5: 30.0},
    ("triton", "atom"): {1: None, 2: None, 3: 28.0, 4: None, 5: 44.0},
    ("triton", "flatten"): {1: 9.0, 2: 13.0, 3: 24.0, 4: 55.0, 5: 66.0},
}
CONTEXT_SCALE = {"1024": 1.0, "4096": 3.0}  # the second context: the same times, three times longer


def _row(backend: str, strategy: str, batch: int, context: str, next_n: int, us: float | None) -> dict:
    point = Point(backend, strategy, batch, context, next_n, "fp8", 64, 128)
    row = {
        "point_key": point.key,
        **point.__dict__,
        "source": "measured",
        "device": "cuda",
        "device_name": "NVIDIA H200",
        "message": "",
    }
    if us is None:
        return {
            **row,
            "status": "skipped",
            "message": "no native kernel",
            "median_ms": None,
            "p25_ms": None,
            "p75_ms": None,
            "iqr_ms": None,
        }
    ms = us / 1e3
    seq_lens = ContextSpec.parse(context).seq_lens(batch, SEED)
    plan = LaunchPlan(seq_lens, next_n, strategy, 64, 128, "fp8", (1, 2, 4))
    return {
        **row,
        "status": "ok",
        "median_ms": ms,
        "p25_ms": ms * 0.99,
        "p75_ms": ms * 1.01,
        "iqr_ms": ms * 0.02,
        **plan.columns(),  # the plan's columns: every timed row carries them
        **roofline_columns(plan.cost, ms, H200),
    }


def synthetic_results() -> pd.DataFrame:
    rows = [
        _row(backend, strategy, 2, context, n, None if us is None else us * scale)
        for context, scale in CONTEXT_SCALE.items()
        for (backend, strategy), times in TIMES_US.items()
        for n, us in times.items()
    ]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def results() -> pd.DataFrame:
    return synthetic_results()


@pytest.fixture(scope="module")
def with_modeled(results: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([results, modeled_native_rows(results, ["B200", "GB200"], SEED)], ignore_index=True)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _legend_texts(ax: plt.Axes) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_best_deepgemm_option_and_vllm_path_by_hand(results: pd.DataFrame) -> None:
    best = kernel.best_option(results).query("context == '1024'").set_index("next_n")
    assert best["best_strategy"].to_dict() == {1: "native", 2: "flatten", 3: "flatten", 4: "native", 5: "atom"}
    assert np.allclose(best["best_ms"] * 1e3, [10.0, 14.0, 25.0, 40.0, 45.0])
    path = kernel.vllm_path(results).query("context == '1024'").set_index("next_n")
    # vLLM 0.33 on SM90 + DeepGEMM: native for next_n in {1, 2, 4}, flatten otherwise
    assert path["vllm_strategy"].to_dict() == {1: "native", 2: "native", 3: "flatten", 4: "native", 5: "flatten"}
    assert np.allclose(path["vllm_ms"] * 1e3, [10.0, 15.0, 25.0, 40.0, 70.0])


def test_comparison_speedups_by_hand(results: pd.DataFrame) -> None:
    table = versus.kernel_comparison(results, TRITON)
    assert len(table) == 10  # triton native at 2 contexts x 5 next_n
    here = table.query("context == '1024'").set_index("next_n")
    assert np.allclose(here["speedup_vs_vllm"], [10 / 8, 15 / 10, 25 / 12.5, 40 / 20, 70 / 30])
    assert np.allclose(here["speedup_vs_best"], [10 / 8, 14 / 10, 25 / 12.5, 40 / 20, 45 / 30])
    assert here["beyond_spread_vs_best"].all()
    longer = table.query("context == '4096'").set_index("next_n")
    assert np.allclose(longer["speedup_vs_best"], here["speedup_vs_best"])  # all times scaled alike
    floor = results.query("backend == 'triton' and strategy == 'native' and context == '1024'").set_index("next_n")
    expected_floor = 100 * floor["floor_ms"] / floor["median_ms"]
    assert np.allclose(here["floor_pct"], expected_floor)


def test_vllm_path_comes_from_the_policy(results: pd.DataFrame) -> None:
    other = kernel.vllm_path(results, platform=Platform("other", False)).query("context == '1024'").set_index("next_n")
    assert other["vllm_strategy"].to_dict() == {1: "native", 2: "native", 3: "flatten", 4: "flatten", 5: "flatten"}
    assert np.isclose(other.loc[4, "vllm_ms"] * 1e3, 60.0)
    # vLLM's SM100 path is DeepGEMM's varlen call, which the harness runs as deepgemm 'native' there
    sm100 = kernel.vllm_path(results, platform=Platform("sm100", True)).set_index(["batch", "context", "next_n"])
    assert set(sm100["vllm_strategy"]) == {"native"}
    native = results.query("backend == 'deepgemm' and strategy == 'native'").set_index(["batch", "context", "next_n"])
    assert sm100["vllm_ms"].dropna().equals(native["median_ms"].reindex(sm100["vllm_ms"].dropna().index))


def test_modeled_rows_never_enter_the_comparison(results: pd.DataFrame) -> None:
    fake = _row("deepgemm", "native", 2, "1024", 3, 1.0) | {"source": "modeled", "point_key": "modeled-dg"}
    mixed = pd.concat([results, pd.DataFrame([fake])], ignore_index=True)
    assert kernel.best_option(mixed).query("context == '1024' and next_n == 3")["best_strategy"].item() == "flatten"
    pd.testing.assert_frame_equal(versus.kernel_comparison(mixed, TRITON), versus.kernel_comparison(results, TRITON))


def test_missing_candidate_and_point_choice(results: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="candidate=.*no measured timed rows"):
        versus.kernel_comparison(results, candidate=("reference", "native"))
    assert versus.pick_point(results, 2, "4K") == (2, "4096", "")
    batch, context, note = versus.pick_point(results, 128, "64K")
    assert (batch, context) == (2, "4096") and "was not measured" in note


def test_modeled_sm100_times_are_the_roofline(with_modeled: pd.DataFrame) -> None:
    table = versus.modeled_vs_measured(with_modeled, 2, "1024", TRITON)
    b200 = f"B200 native: {kernel.MODELED_LABEL}"
    assert b200 in table.columns and f"GB200 native: {kernel.MODELED_LABEL}" in table.columns
    seq_lens = ContextSpec.parse("1024").seq_lens(2, SEED)
    for n in range(1, 6):
        expected = modeled_time(LaunchPlan(seq_lens, n, "native"), "B200").time_ms * 1e3
        assert np.isclose(table.loc[n, b200], expected)
    assert np.allclose(table["native (triton), measured"], [8.0, 10.0, 12.5, 20.0, 30.0])
    assert np.allclose(table["the best deepgemm option, measured"], [10.0, 14.0, 25.0, 40.0, 45.0])


def test_plot_backend_latency(with_modeled: pd.DataFrame) -> None:
    fig = kernel.plot_backend_latency(with_modeled, 2, "1024", "NVIDIA H200", "run synthetic | NVIDIA H200")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_xlabel().startswith("next_n") and "µs" in ax.get_ylabel()
    title = fig.get_suptitle()
    assert "NVIDIA H200" in title and "measured + modeled" in title
    texts = _legend_texts(ax)
    assert "native (triton), measured" in texts and "atom (deepgemm), measured" in texts
    assert f"native on B200: {kernel.MODELED_LABEL}" in texts
    assert any(t.startswith("the best deepgemm option") for t in texts)
    assert any("vLLM 0.33.0 path on SM90 + DeepGEMM" in t and "[1, 2, 4]" in t for t in texts)  # a version
    assert style.footer_text(fig) == "run synthetic | NVIDIA H200"
    modeled_lines = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(modeled_lines) == 2  # B200 and GB200, dashed
    measured = {bars.get_label(): bars.lines[0] for bars in ax.containers if bars.get_label().endswith(", measured")}
    assert len(measured) == 6 and all(line.get_linestyle() == "-" for line in measured.values())  # solid, any backend
    colours = {label: line.get_color() for label, line in measured.items()}
    markers = {label: line.get_marker() for label, line in measured.items()}
    assert (
        colours["native (triton), measured"]
        == colours["native (deepgemm), measured"]
        == style.STRATEGY_COLORS["native"]
    )
    assert markers["atom (triton), measured"] == "s" and markers["atom (deepgemm), measured"] == "o"


def test_plot_backend_latency_panels_draws_each_context_beside_the_others(results: pd.DataFrame) -> None:
    fig = kernel.plot_backend_latency_panels(results, 2, ["1024", "4096"], "NVIDIA H200", "run synthetic | H200")
    left, right = fig.axes
    assert [left.get_title(), right.get_title()] == ["context 1K", "context 4K"]
    assert "µs" in left.get_ylabel() and right.get_ylabel() == ""  # one label: each panel its own time axis
    longer = {c.get_label(): np.asarray(c.lines[0].get_ydata(), float) for c in right.containers}
    shorter = {c.get_label(): np.asarray(c.lines[0].get_ydata(), float) for c in left.containers}
    assert np.allclose(longer["native (triton), measured"], 3 * shorter["native (triton), measured"])
    (legend,) = fig.legends  # one legend for both panels, each series once
    texts = [t.get_text() for t in legend.get_texts()]
    assert len(texts) == len(set(texts)) and "native (triton), measured" in texts
    assert any(t.startswith("the best deepgemm option") for t in texts)
    assert "batch=2" in fig.get_suptitle() and style.footer_text(fig) == "run synthetic | H200"
    with pytest.raises(ValueError, match="no timed rows at batch=2, context=8192"):
        kernel.plot_backend_latency_panels(results, 2, ["1024", "8192"], "NVIDIA H200")
    with pytest.raises(ValueError, match="contexts: none to draw"):
        kernel.plot_backend_latency_panels(results, 2, [], "NVIDIA H200")


def test_the_modeled_and_measured_times_fold_under_the_chart(with_modeled: pd.DataFrame) -> None:
    folded = kernel_tables.style_modeled_vs_measured(with_modeled, 2, "1024", TRITON, "deepgemm")
    html = folded.to_html()
    assert html.startswith("<details><summary><b>The modeled and measured times the chart draws (µs)</b>")
    assert "30.0" in html and "native (triton), measured" in html  # triton native at next_n = 5, to 0.1 µs
    hostile = with_modeled.assign(backend=with_modeled["backend"].replace({"triton": "<b>x</b>"}))
    html = kernel_tables.style_modeled_vs_measured(hostile, 2, "1024", ("<b>x</b>", "native"), "deepgemm").to_html()
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html  # a backend name from a run is text


def test_plot_speedup_heatmaps(results: pd.DataFrame) -> None:
    fig = kernel.plot_speedup_heatmaps(versus.kernel_comparison(results, TRITON), "NVIDIA H200", None, TRITON)
    left, right = fig.axes[:2]
    assert "vLLM 0.33" in left.get_title() and right.get_title() == "the best deepgemm option / candidate"
    assert left.get_xlabel() == "next_n" and "NVIDIA H200" in fig.get_suptitle() and "measured" in fig.get_suptitle()
    annotations = {t.get_text() for t in right.texts}
    assert {"2.00", "1.40", "1.50"} <= annotations
    assert {t.get_fontsize() for t in right.texts} == {style.ANNOTATION_SIZE}  # at least 9 px on a report page
    assert fig.get_figwidth() <= style.MAX_WIDTH
    assert len(fig.axes) == 3  # two heatmaps and the colour bar


def test_plot_roofline_intensity(with_modeled: pd.DataFrame) -> None:
    fig = kernel.plot_roofline_intensity(with_modeled, H200, "NVIDIA H200", "caption")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "unique bytes" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    legend = ax.get_legend()
    texts = _legend_texts(ax)
    assert any(t.startswith("HBM slope 4.35 TB/s") for t in texts) and any(t.startswith("FP8 roof 1254") for t in texts)
    assert f"native on B200, GB200: {kernel.MODELED_LABEL}" in texts
    assert {"strategy: native", "strategy: atom", "strategy: flatten", "backend: deepgemm", "backend: triton"} <= set(
        texts
    )
    assert legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1  # the legend sits right of the data
    assert style.footer_text(fig) == "caption"
    assert "measured + modeled" in fig.get_suptitle() and "NVIDIA H200" in fig.get_suptitle()
    reading = readings.roofline_reading(versus.kernel_comparison(with_modeled, TRITON), with_modeled, H200)
    assert "ridge of H200-measured lies at 288 FLOP/B" in reading


def test_plot_modeled_sm100(with_modeled: pd.DataFrame) -> None:
    fig = kernel.plot_modeled_sm100(with_modeled, 2, "1024", "NVIDIA H200", None, TRITON)
    ax = fig.axes[0]
    title = fig.get_suptitle()
    assert "NVIDIA H200" in title and kernel.MODELED_LABEL in title
    hatched = {bar.get_label() for bar in ax.containers if bar.patches[0].get_hatch()}
    assert hatched == {f"B200 native: {kernel.MODELED_LABEL}", f"GB200 native: {kernel.MODELED_LABEL}"}
    assert len(ax.containers) == 5  # triton, best deepgemm, vLLM path, B200, GB200


def test_reading_and_caption(results: pd.DataFrame) -> None:
    text = readings.comparison_reading(versus.kernel_comparison(results, TRITON), 2, "1024", "NVIDIA H200", TRITON)
    assert (
        "next_n=3: 12.5 µs; 2.00× vs vLLM's path (flatten, 25.0 µs); 2.00× vs the best deepgemm option (flatten on "
        "deepgemm" in text
    )
    assert "next_n=5: 30.0 µs; 2.33× vs vLLM's path (flatten, 70.0 µs); 1.50× vs the best deepgemm option (atom" in text
    assert "faster than the best deepgemm option in 10 (10 beyond the measured spread)" in text
    provenance = {
        "source": "measured",
        "device_name": "NVIDIA H200",
        "run_id": "h200-full-1",
        "created": "2026-11-29T10:00:00",
        "git": {"sha": "abcdef123456", "dirty": False},
        "environment": {"torch": "2.11.0", "triton": "3.6.0", "vllm": "0.33.0", "deep_gemm": "2.8.1"},
    }
    caption = kernel.caption(provenance)
    for part in (
        "NVIDIA H200",
        "h200-full-1",
        "2026-11-29",
        "abcdef1",
        "torch 2.11.0",
        "triton 3.6.0",
        "deep_gemm 2.8.1",
    ):
        assert part in caption
