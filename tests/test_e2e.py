"""The end-to-end decode-step model and notebook 05's frames, charts and explorer."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dsa_lab.analysis import e2e  # noqa: E402
from dsa_lab.explorers import e2e as explorer_module  # noqa: E402
from dsa_lab.explorers.e2e import e2e_explorer  # noqa: E402
from dsa_lab.model import calibration  # noqa: E402
from dsa_lab.model.decode_step import (  # noqa: E402
    ACCEPTANCE_PRESETS,
    DEEPSEEK_V32,
    decode_step,
    distinct_experts,
    tokens_per_step,
)
from dsa_lab.paths import resolve_data_path  # noqa: E402
from dsa_lab.plots import e2e as plots  # noqa: E402
from dsa_lab.store import folders as store  # noqa: E402

H200_RUN = "h200/h200-full-20261129"  # the shipped H200 sweep the measured indexer times come from


@pytest.fixture(scope="module")
def times() -> e2e.IndexerTimes:
    return e2e.IndexerTimes(store.load_run(resolve_data_path(H200_RUN)).results, "triton")


def test_tokens_per_step_adds_the_acceptance_rates():
    assert tokens_per_step((0.98, 0.64, 0.15), 1) == 1
    assert tokens_per_step((0.98, 0.64, 0.15), 3) == pytest.approx(2.62)
    with pytest.raises(ValueError, match="next_n=5"):
        tokens_per_step((0.98, 0.64, 0.15), 5)
    for values, source in ACCEPTANCE_PRESETS.values():
        assert all(0 < a <= 1 for a in values) and source


def test_experts_read_grow_with_tokens_to_the_local_shard():
    assert distinct_experts(1) == pytest.approx(1.0)  # one token, 8 of 256 experts, 1/8 of them here
    assert distinct_experts(10_000) == pytest.approx(32.0)
    assert 190e6 < DEEPSEEK_V32.attention_params < 215e6  # MLA + indexer projections of one layer


def test_decode_step_parts_and_share():
    short = decode_step("H200", 64, 8192, 1, indexer_us=30.0)
    long = decode_step("H200", 64, 131072, 1, indexer_us=290.0)
    assert short.source == "modeled" and 0 < short.indexer_share < long.indexer_share < 1
    assert long.indexer_us == pytest.approx(61 * 290.0 + long.components["indexer top-k"])
    assert all(v >= 0 for v in long.components.values())
    mtp = decode_step("B200", 64, 65536, 3, indexer_us=250.0, draft_indexer_us=100.0)
    assert mtp.components["indexer (MTP drafts)"] == 200.0 and mtp.components["MTP draft layers + LM head"] > 0
    with pytest.raises(ValueError, match="draft_indexer_us"):
        decode_step("B200", 64, 65536, 3, indexer_us=250.0)


def test_indexer_times_are_measured_where_the_sweep_has_them(times):
    assert times("H200", "native", 128, 65536, 1) == pytest.approx((286.1, "measured"), abs=0.1)
    assert times("H200", "atom", 128, 65536, 4) == times("H200", "native", 128, 65536, 4)  # one native piece
    assert times("H200", e2e.VLLM, 128, 65536, 3) == times("H200", "flatten", 128, 65536, 3)
    us, source = times("H200", "native", 128, 65536, 3)
    assert math.isnan(us) and source == "n/a"  # SM90 DeepGEMM has no 3-row kernel
    assert times("H200", "native", 128, 4096, 1)[1] == "modeled"  # not in the sweep
    assert times("B200", e2e.VLLM, 128, 65536, 3)[1] == "modeled"
    assert e2e.vllm_strategy("B200", 3) == ("deepgemm", "native")
    stand_in = e2e.IndexerTimes(None, "triton")
    assert stand_in("H200", "native", 128, 65536, 1)[1] == "modeled"


def test_mtp_frames(times):
    throughput = e2e.throughput_frame(times, "H200", 64, "V4-Flash, 3 drafts, long text", contexts=(8192, 262144))
    assert set(throughput["next_n"]) == {1, 2, 3, 4} and set(throughput["strategy"]) == set(e2e.LABELS)
    best = e2e.best_next_n(throughput)
    assert len(best) == len(e2e.LABELS) * 2 and (best["gain_over_no_mtp"] >= 1).all()
    # flatten's re-reads make deep speculation stop paying at long context first
    flatten = best[best["strategy"] == "flatten"].set_index("context")["next_n"]
    assert flatten[262144] <= flatten[8192]
    assert "H200" in e2e.describe_best(times, ("H200",), 64, "V4-Flash, 2 drafts")


def test_published_checks_are_all_there(times):
    checks = e2e.published_checks(times)
    assert len(checks) == 4
    assert checks["published"].tolist()[0] == 0.0115
    assert checks["published"].iloc[-1] == pytest.approx((1 - 1 / 1.48) / 0.75)
    assert all(isinstance(why, str) and why for why in checks["why"])


def test_charts_say_modeled(times):
    shares = e2e.share_frame(times, ["H200", "B200"], (16, 64), (8192, 65536))
    figures = [
        plots.plot_indexer_share(shares),
        plots.plot_step_breakdown(shares[shares["batch"] == 64], list(plots.COMPONENT_COLORS)),
    ]
    throughput = e2e.throughput_frame(times, "B200", 64, "V4-Flash, 2 drafts", contexts=(8192, 65536))
    figures += [
        plots.plot_tokens_per_second(throughput, (8192, 65536)),
        plots.plot_best_next_n(e2e.best_next_n(throughput)),
    ]
    for fig in figures:
        titles = [fig._suptitle.get_text() if fig._suptitle else ""] + [ax.get_title() for ax in fig.axes]
        assert any("modeled" in title for title in titles)
    plt.close("all")


def test_validation_chart_and_explorer(times, monkeypatch):
    run = store.load_run(resolve_data_path(H200_RUN))
    points = calibration.measured_points(run.results, run.provenance["seed"]).head(40)
    fig = plots.plot_model_vs_measured(calibration.h200_errors(points), calibration.trtllm_13219())
    assert "13219" in fig.axes[1].get_title()
    plt.close("all")
    shown = []
    monkeypatch.setattr(explorer_module, "display", shown.append)
    e2e_explorer(times, interactive=False)
    assert any("tokens/s" in getattr(item, "data", "") for item in shown)
    plt.close("all")
