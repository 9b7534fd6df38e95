"""The whole step split into logits and top-k (issue 26): pairs a step's time with its logits' time under the same
timer, and sets each workload's best step against the step vLLM runs there, per top-k, never mixing two."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dsa_lab import axes
from dsa_lab.analysis.step_split import route_ratio, step_split
from dsa_lab.kernels import baseline_backend, vllm_backend
from dsa_lab.kernels.reference import ReferenceBackend
from dsa_lab.store import load_run


def _row(backend: str, strategy: str, timed: str, topk_impl: str, ms: float, route: str = "flatten", **axis) -> dict:
    values = {
        "backend": backend,
        "strategy": strategy,
        "batch": 16,
        "context": "65536",
        "next_n": 3,
        "cache_dtype": "fp8",
        "heads": 64,
        "head_dim": 128,
        "acceptance": "none",
        "logits_width": "model:163840",
        "timed": timed,
        "timer": "graph",
        "topk_impl": topk_impl,
        "config": "rule",
        **axis,
    }
    return {**values, "point_key": axes.point_key(values), "status": "ok", "median_ms": ms, "source": "measured",
            "vllm_route": route}  # fmt: skip


@pytest.fixture
def frame() -> pd.DataFrame:
    vllm, other = vllm_backend().name, baseline_backend().name
    rows = [
        _row(vllm, "flatten", "logits", "none", 0.020),
        _row(vllm, "flatten", "logits+topk", "vllm", 0.041),
        _row(vllm, "flatten", "logits+topk", "torch", 0.300),
        _row(other, "native", "logits", "none", 0.012),
        _row(other, "native", "logits+topk", "vllm", 0.030),
        _row(other, "native", "logits+topk", "torch", 0.290),
        _row(other, "native", "logits", "none", 0.013, timer="events"),  # no step under this timer: unpaired
    ]
    return pd.DataFrame(rows)


def test_the_top_k_costs_the_step_less_its_logits_under_the_same_timer(frame) -> None:
    split = step_split(frame).set_index(["backend", "topk_impl"])
    vllm = vllm_backend().name
    assert len(split) == 4
    assert split.loc[(vllm, "vllm"), "topk_us"] == pytest.approx(21.0)
    assert split.loc[(vllm, "vllm"), "topk_share"] == pytest.approx(21 / 41)
    assert split.loc[(baseline_backend().name, "torch"), "logits_us"] == pytest.approx(12.0)


def test_the_route_ratio_sets_the_best_step_against_vllms_per_top_k(frame) -> None:
    table = route_ratio(step_split(frame)).set_index("topk_impl")
    assert set(table.index) == {"vllm", "torch"}  # two top-k implementations, two answers
    assert table.loc["vllm", "route_us"] == pytest.approx(41.0) and table.loc["vllm", "best_us"] == pytest.approx(30.0)
    assert table.loc["vllm", "route_over_best"] == pytest.approx(41 / 30)
    assert table.loc["vllm", "best"] == f"native ({baseline_backend().name})"
    assert not table.loc["vllm", "best_is_vllms_library"]


def test_each_option_is_drawn_as_shares_of_vllms_step_its_top_k_stacked_on_its_logits(frame) -> None:
    import matplotlib

    matplotlib.use("agg")
    from dsa_lab.analysis.step_split import against_route
    from dsa_lab.plots.step_split import TOPK_HATCH, plot_step_split

    split = against_route(step_split(frame))
    mine = split[split["topk_impl"] == "vllm"].set_index("backend")
    vllm = vllm_backend().name
    assert mine.loc[vllm, "logits_rel"] + mine.loc[vllm, "topk_rel"] == pytest.approx(1.0)  # vLLM's own step is 1
    assert mine.loc[baseline_backend().name, "topk_rel"] == pytest.approx(18 / 41)
    fig = plot_step_split(split[split["topk_impl"] == "vllm"], footer="test run")
    bars = [p for p in fig.axes[0].patches]
    assert len(bars) == 4 and sum(p.get_hatch() == TOPK_HATCH for p in bars) == 2  # two options, two parts each
    assert "41 µs" in fig.axes[0].get_xticklabels()[0].get_text()  # vLLM's step time under its batch


def test_ragged_verification_draws_each_curves_replays_and_names_the_wrong_ones() -> None:
    import matplotlib

    matplotlib.use("agg")
    from dsa_lab.plots.step_split import plot_ragged_verification

    rows = pd.DataFrame(
        [
            {
                "acceptance": c,
                "next_n": n,
                "strategy": s,
                "backend": b,
                "median_ms": m,
                "p25_ms": m * 0.9,
                "p75_ms": m * 1.1,
                "replays": 32,
                "replays_wrong": w,
            }  # fmt: skip
            for c, n in (("v3-sglang3582", 2), ("v4flash-ascend131", 4))
            for s, b, m, w in (("flatten", vllm_backend().name, 0.4, 0), ("native", baseline_backend().name, 0.2, 1))
        ]
    )
    fig = plot_ragged_verification(rows)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels[0].startswith("v3-sglang3582") and "next_n 2" in labels[0]
    bars = fig.axes[0].patches
    assert len(bars) == 4
    wrong = [bar for bar in bars if bar.get_hatch()]  # the option wrong on a replay: hollow and cross-hatched
    assert len(wrong) == 2 and all(bar.get_facecolor()[:3] == (1.0, 1.0, 1.0) for bar in wrong)
    assert [t.get_text() for t in fig.axes[0].texts] == ["wrong on\n1 of 32"] * 2
    assert len({bar.get_edgecolor() for bar in bars}) == 2  # each option its own colour


# ---------------------------------------------------------------- a fused backend's unit is the step (issue 27)


class _Fused(ReferenceBackend):
    """Logits and top-k in one call: the reference's logits, then `topk_per_row` (its logits never leave it)."""

    name, baseline, presets, fuses_topk = "test-fused", False, (), True

    def logits(self, call):
        raise AssertionError("a fused backend's logits are never asked for")

    def step(self, call, *, topk, max_seq_len):
        from dsa_lab.topk import topk_per_row

        logits = super().logits(call)
        return topk_per_row(logits, call.context_lens.reshape(-1), topk)


class _FusedDropsOne(_Fused):
    """Fused, but its last row's best pick goes missing."""

    name = "test-fused-drops"

    def step(self, call, **k):
        picks = super().step(call, **k).clone()
        picks[-1, 0] = -1
        return picks


def test_a_fused_backend_is_timed_on_the_step_and_checked_by_its_picks(tmp_path, monkeypatch) -> None:
    from dsa_lab.bench.point import SweepSpec
    from dsa_lab.bench.sweep import run_sweep
    from dsa_lab.bench.timing import TimingConfig
    from dsa_lab.kernels import registry
    from dsa_lab.store import folders

    for backend in (_Fused(), _FusedDropsOne()):
        monkeypatch.setitem(registry._BACKENDS, backend.name, backend)
    spec = SweepSpec(
        backend=("test-fused", "test-fused-drops"), strategy=("native",), batch=(2,), context=("160",), next_n=(2,),
        heads=(32,), head_dim=(64,), timed=("logits", "logits+topk"), topk_impl=("torch",),
        timing=TimingConfig(warmup=1, min_samples=3, max_samples=5, max_seconds=0.05),
    )  # fmt: skip
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    rows = {(r["backend"], r["timed"]): r for r in folders.read_points(tmp_path / "run")}
    assert (
        rows[("test-fused", "logits")]["status"] == "skipped"
        and "its unit is the step" in rows[("test-fused", "logits")]["message"]
    )
    fused = rows[("test-fused", "logits+topk")]
    assert fused["status"] == "ok" and fused["topk_kernel"] == "fused (test-fused)" and fused["median_ms"] > 0
    assert fused["topk_rows_equal"] == fused["topk_rows"] == 4
    dropped = rows[("test-fused-drops", "logits+topk")]
    assert dropped["status"] == "failed" and "1 of 4 rows" in dropped["message"] and dropped["median_ms"] is None


class _FusedRightOnce(_Fused):
    """Fused, right on its first call only."""

    name = "test-fused-once"
    calls = 0

    def step(self, call, **k):
        type(self).calls += 1
        picks = super().step(call, **k)
        return picks if type(self).calls == 1 else picks.flip(0).contiguous()


def test_a_fused_backend_right_only_once_is_failed_and_never_timed(tmp_path, monkeypatch) -> None:
    from dsa_lab.bench.point import SweepSpec
    from dsa_lab.bench.sweep import run_sweep
    from dsa_lab.bench.timing import TimingConfig
    from dsa_lab.kernels import registry
    from dsa_lab.store import folders

    monkeypatch.setitem(registry._BACKENDS, "test-fused-once", _FusedRightOnce())
    spec = SweepSpec(
        backend=("test-fused-once",), strategy=("native",), batch=(2,), context=("mixed:100-200",), next_n=(2,),
        heads=(32,), head_dim=(64,), timed=("logits+topk",), topk_impl=("torch",),
        timing=TimingConfig(warmup=1, min_samples=3, max_samples=5, max_seconds=0.05),
    )  # fmt: skip
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    (row,) = folders.read_points(tmp_path / "run")
    assert row["status"] == "failed" and "top-k check" in row["message"] and row["median_ms"] is None


def test_one_chart_takes_the_ragged_batch_graphs_and_vllms_top_k_first_and_names_the_rest(frame) -> None:
    from dsa_lab.analysis.step_split import one_chart

    both = pd.concat([frame, frame.assign(context="mixed:2048-131072")], ignore_index=True)
    both["point_key"] = [axes.point_key(r) for r in both.to_dict("records")]
    shown, note = one_chart(step_split(both))
    assert set(shown["context"]) == {"mixed:2048-131072"} and set(shown["topk_impl"]) == {"vllm"}
    assert note == "Also in this run: context 65536, topk_impl torch."


def test_replayed_keeps_the_timed_ragged_steps_wrong_ones_included() -> None:
    from dsa_lab.analysis.step_split import replayed

    base = _row(vllm_backend().name, "flatten", "logits+topk", "vllm", 0.2, timer="replay", acceptance="v3-report")
    rows = pd.DataFrame(
        [
            base,
            {**base, "status": "failed", "median_ms": 0.3},
            {**base, "status": "skipped", "median_ms": None},
            {**base, "timed": "logits", "topk_impl": "none"},
        ]  # fmt: skip
    )
    assert replayed(rows)["status"].tolist() == ["ok", "failed"]


def test_the_shipped_step_run_holds_issue_26s_answer() -> None:
    """The shipped step run (an H100's): vLLM's own top-k, its build named, beside the logits alone on the same grid;
    the goals of issue 26 on it; and ragged verification's replays all right on both routes that ran."""
    run = load_run(Path(__file__).resolve().parents[1] / "data" / "h100" / "h100-step-20261207")
    build = run.provenance["environment"]["topk"]["vllm"]["vllm_topk_build"]
    assert build["vllm_sdist"] == "vllm-0.33.0.tar.gz" and len(build["vllm_sdist_sha256"]) == 64
    split = step_split(run.results)
    graphs = split[(split["timer"] == "graph") & (split["context"] == "mixed:2048-131072") & (split["batch"] == 128)]
    assert set(graphs["topk_impl"]) == {"vllm"}
    gluon = graphs[(graphs["backend"] == "gluon") & (graphs["next_n"] == 3)].iloc[0]
    assert gluon["step_us"] <= 1.35 * gluon["logits_us"]
    table = route_ratio(split)
    for next_n in (3, 6):
        row = table[
            (table["timer"] == "graph")
            & (table["context"] == "mixed:2048-131072")
            & (table["batch"] == 128)
            & (table["next_n"] == next_n)
        ].iloc[0]
        assert row["best"] == "native (gluon)" and row["route_over_best"] >= 1.5
    replays = run.results[(run.results["timer"] == "replay") & (run.results["status"] == "ok")]
    assert set(replays["strategy"]) == {"native", "flatten"} and (replays["replays"] >= 20).all()
    assert (replays["replays_wrong"] == 0).all()
