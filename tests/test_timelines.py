"""Round 10's timelines inside one CTA (`studies.timelines`), from the shipped data."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from dsa_lab.paths import resolve_data_path  # noqa: E402
from dsa_lab.plots import style  # noqa: E402
from dsa_lab.studies import timelines  # noqa: E402

ROUND10, CALL = "h200/experiments/gluon-round10-20261130", "call6"  # the shipped round and its call
pytestmark = pytest.mark.skipif(
    not resolve_data_path(ROUND10).is_dir(), reason=f"data/{ROUND10} is not in this checkout"
)


@pytest.fixture(scope="module")
def shipped() -> tuple[pd.DataFrame, dict]:
    return timelines.cta_phases(ROUND10, CALL)


def test_each_case_is_its_phases_end_to_end_in_order(shipped) -> None:
    phases, _ = shipped
    names = [name for name, _ in timelines.PHASES]
    assert phases["case"].nunique() == 9  # n=1 at 32K and 64K, n=4 at 32K; cold, warm, prefetched
    for case, part in phases.groupby("case", sort=False):
        assert list(part["phase"]) == names, case
        assert part["start_ns"].iloc[0] == 0 and (part["end_ns"] > part["start_ns"]).all(), case
        assert (part["start_ns"].iloc[1:].to_numpy() == part["end_ns"].iloc[:-1].to_numpy()).all(), case


def test_the_cold_first_tile_is_the_long_step_and_warm_it_is_short(shipped) -> None:
    """What round 10, item 8 reads from these numbers."""
    phases, _ = shipped
    flight = phases[phases["phase"] == "first KV tile in flight"].set_index("case")
    trip = flight["end_ns"] - flight["start_ns"]
    cold = trip[trip.index.str.endswith(", cold L2")]
    warm = trip[trip.index.str.endswith(", warm L2")]
    assert len(cold) == len(warm) == 3
    assert cold.min() > 1400 and warm.max() < 650
    longest = phases.assign(ns=phases["end_ns"] - phases["start_ns"]).loc[lambda f: f["case"].isin(cold.index)]
    assert (longest.loc[longest.groupby("case")["ns"].idxmax(), "phase"] != "context lengths read").all()


def test_provenance_names_the_commit_of_the_traced_call(shipped) -> None:
    _, provenance = shipped
    line = style.provenance_line(provenance)
    assert line.startswith("measured on NVIDIA H200 | run gluon-round10-20261130") and "git a36e130+dirty" in line


def test_the_chart_draws_every_phase_of_every_case_with_its_footer(shipped) -> None:
    phases, provenance = shipped
    fig = timelines.plot_cta_phases(phases, "NVIDIA H200", style.provenance_line(provenance))
    ax = fig.axes[0]
    assert len(ax.containers) == len(timelines.PHASES) and all(len(c) == 9 for c in ax.containers)
    assert [t.get_text() for t in ax.get_yticklabels()][0] == "n=1, L=32K, cold L2"
    assert "measured" in fig.get_suptitle() and style.footer_text(fig).startswith("measured on NVIDIA H200")
    labels = ax.get_legend().get_texts()
    assert {t.get_text() for t in labels} == {name for name, _ in timelines.PHASES} | {"Q arrived"}
    plt.close(fig)
    with pytest.raises(ValueError, match="phases: no traced case"):
        timelines.plot_cta_phases(phases.iloc[0:0], "NVIDIA H200")


def test_a_missing_folder_or_call_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"provenance\.json is missing"):
        timelines.cta_phases(str(tmp_path), CALL)
    with pytest.raises(FileNotFoundError, match=r"call9/b1_steps\.csv is missing"):
        timelines.cta_phases(ROUND10, call="call9")
