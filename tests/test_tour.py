"""The tour's numbers (dsa_lab.analysis.headline) and pictures (dsa_lab.plots.tour)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch

from dsa_lab.analysis import headline
from dsa_lab.analysis.headline import blocks_read
from dsa_lab.batch.metadata import build_metadata
from dsa_lab.batch.workload import DecodeBatch
from dsa_lab.plots import tour
from dsa_lab.store import folders as store

# ---------------------------------------------------------------- KV-tile reads


@pytest.mark.parametrize(("strategy", "per_tile"), [("native", 1), ("atom", 2), ("flatten", 6)])
def test_tile_reads_for_six_rows(strategy: str, per_tile: int) -> None:
    reads = headline.tile_reads(strategy, next_n=6, tiles=5)
    assert reads.grid.shape == (6, 5)
    assert reads.tile_reads == 5 * per_tile
    assert int(reads.grid.max()) == per_tile and int(reads.grid.min()) == 1  # every row sees every tile here
    assert (reads.grid == reads.grid[:, :1]).all()  # one read serves a row for all its tiles
    assert sorted(r for group in reads.groups for r in group) == list(range(6))
    if strategy == "atom":
        assert reads.label == "atom 4+2" and reads.groups == ((0, 1, 2, 3), (4, 5)) and reads.launches == 2


@pytest.mark.parametrize("strategy", ["native", "atom", "flatten"])
@pytest.mark.parametrize("next_n", [1, 3, 5, 8])
def test_tile_reads_agree_with_the_metadata_block_count(strategy: str, next_n: int) -> None:
    tiles = 4
    reads = headline.tile_reads(strategy, next_n, tiles)
    batch = DecodeBatch(seq_lens=(tiles * 64,), decode_lens=(next_n,), next_n=next_n)
    metadata = build_metadata(strategy, batch, torch.arange(tiles, dtype=torch.int32)[None, :], (1, 2, 4))
    assert reads.tile_reads == blocks_read(metadata, 64)


def test_pieces_label_says_where_atom_pads() -> None:
    assert headline.pieces_label(3) == "4 (1 padding row)" and headline.pieces_label(7) == "4+4 (1 padding row)"
    assert headline.pieces_label(6) == "4+2" and headline.pieces_label(4) == "4"
    reads = headline.tile_reads("atom", next_n=3, tiles=2)  # a padded 4: one read, the filler row not drawn
    assert reads.grid.tolist() == [[1, 1], [1, 1], [1, 1]] and reads.groups == ((0, 1, 2),) and reads.tile_reads == 2


def test_tile_reads_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="strategy"):
        headline.tile_reads("diagonal")
    with pytest.raises(ValueError, match="tiles"):
        headline.tile_reads("native", tiles=0)


# ---------------------------------------------------------------- modeled bytes


def test_modeled_bytes_monotone_for_flatten_and_equal_at_one() -> None:
    frame = headline.modeled_bytes(batch=128, context="64K", next_ns=range(1, 9))
    assert set(frame["source"]) == {"modeled"}
    by = frame.pivot(index="next_n", columns="strategy", values="bytes")
    assert by["flatten"].is_monotonic_increasing and (by["flatten"].diff().dropna() > 0).all()
    assert by.loc[1, "flatten"] == by.loc[1, "native"] == by.loc[1, "atom"]
    assert (by["atom"] >= by["native"]).all() and (by["flatten"] >= by["atom"]).all()
    assert (by.loc[[1, 2, 3, 4], "atom"] == by.loc[[1, 2, 3, 4], "native"]).all()  # one piece (3: padded 4)
    kv = frame.pivot(index="next_n", columns="strategy", values="kv_bytes")
    assert kv.loc[8, "native"] == 128 * 65536 * 132  # each request's cache once
    assert kv.loc[8, "flatten"] == 128 * 132 * sum(65536 - 8 + 1 + j for j in range(8))  # each row its own context
    vllm = frame[frame["vllm_0_33"]].set_index("next_n")["strategy"]
    assert vllm.to_dict() == {
        1: "native",
        2: "native",
        3: "flatten",
        4: "native",
        5: "flatten",
        6: "flatten",
        7: "flatten",
        8: "flatten",
    }
    assert "flatten 8 times" in headline.bytes_reading(frame)


def test_modeled_bytes_match_the_shipped_runs_roofline_columns(shipped_full_run: store.Run) -> None:
    """The tour's modeled bytes are the numbers the sweep stored for the same points."""
    frame = headline.modeled_bytes(128, "65536", next_ns=(2, 3, 5, 8)).set_index(["next_n", "strategy"])["bytes"]
    stored = shipped_full_run.results
    stored = stored[(stored["batch"] == 128) & (stored["context"] == "65536") & (stored["backend"] == "triton")]
    stored = stored.dropna(subset=["strategy_bytes"]).set_index(["next_n", "strategy"])["strategy_bytes"]
    common = frame.index.intersection(stored.index)
    assert len(common) >= 8
    assert np.allclose(frame[common], stored[common])


# ---------------------------------------------------------------- the headline table


def test_headline_on_the_shipped_run(shipped_full_run: store.Run) -> None:
    table = headline.headline_table(shipped_full_run.results, 128, "65536").set_index("next_n")
    data = shipped_full_run.results
    point = data[(data["batch"] == 128) & (data["context"] == "65536") & (data["status"] == "ok")]
    us = point.set_index(["next_n", "backend", "strategy"])["median_ms"] * 1e3
    # next_n = 3: vLLM flattens on DeepGEMM, DeepGEMM atom (a padded 4) is the fastest option measured
    row = table.loc[3]
    assert (row.vllm_strategy, row.vllm_backend) == ("flatten", "deepgemm")
    assert row.vllm_us == pytest.approx(us[(3, "deepgemm", "flatten")])
    assert (row.best_strategy, row.best_backend) == ("atom", "deepgemm")
    assert row.best_us == pytest.approx(us[(3, "deepgemm", "atom")])
    assert row.best_us == pytest.approx(us.loc[3].min())
    assert row.speedup == pytest.approx(row.vllm_us / row.best_us) and row.speedup > 1.3 and row.beyond_spread
    # where vLLM runs DeepGEMM natively it is (within the spread) the best option
    for n in (1, 2, 4):
        assert table.loc[n, "vllm_strategy"] == "native" and not table.loc[n, "beyond_spread"]
        assert table.loc[n, "speedup"] == pytest.approx(1.0, abs=0.01)
    # where it flattens, atom on DeepGEMM wins beyond the spread
    for n in (3, 5, 6, 8):
        assert table.loc[n, "vllm_strategy"] == "flatten" and table.loc[n, "best_strategy"] == "atom"
        assert table.loc[n, "beyond_spread"] and table.loc[n, "speedup"] > 1.3
    reading = headline.headline_reading(table.reset_index(), "NVIDIA H200", "h200-full-20261129", 128, "65536")
    assert "Measured on NVIDIA H200, run `h200-full-20261129`" in reading
    assert f"{table.loc[3, 'speedup']:.2f}×" in reading


def _synthetic() -> pd.DataFrame:
    """One point, DeepGEMM-like and Triton-like times in ms; next_n = 3 has no DeepGEMM native."""
    times = {
        (1, "deepgemm", "native"): 1.0, (1, "deepgemm", "flatten"): 1.0, (1, "triton", "native"): 1.2,
        (2, "deepgemm", "native"): 1.1, (2, "deepgemm", "flatten"): 2.0, (2, "triton", "native"): 1.05,
        (3, "deepgemm", "flatten"): 3.0, (3, "deepgemm", "atom"): 1.9, (3, "triton", "native"): 1.5,
    }  # fmt: skip
    rows = [
        {
            "backend": b,
            "strategy": s,
            "batch": 4,
            "context": "1024",
            "next_n": n,
            "status": "ok",
            "median_ms": ms,
            "p25_ms": ms * 0.99,
            "p75_ms": ms * 1.01,
            "source": "measured",
            "pieces": "4[pad 1]" if s == "atom" else "1",
            "heads": 64,
            "head_dim": 128,
            "cache_dtype": "fp8",
        }
        for (n, b, s), ms in times.items()
    ]
    untimed = {"median_ms": np.nan, "p25_ms": np.nan, "p75_ms": np.nan}
    rows.append({**rows[0], "strategy": "atom", "status": "skipped", **untimed})
    rows.append({**rows[0], "batch": 8, "median_ms": 0.1})  # another point must not leak in
    return pd.DataFrame(rows)


def test_headline_table_on_a_synthetic_frame() -> None:
    table = headline.headline_table(_synthetic(), 4, "1024").set_index("next_n")
    assert list(table.index) == [1, 2, 3]
    assert table.loc[1, "vllm_us"] == pytest.approx(1000.0) and table.loc[1, "speedup"] == pytest.approx(1.0)
    assert not table.loc[1, "beyond_spread"]
    # next_n = 2: vLLM's native on DeepGEMM (1.1 ms); Triton native (1.05 ms) is faster beyond the ±1 % spread
    assert (table.loc[2, "best_backend"], table.loc[2, "best_strategy"]) == ("triton", "native")
    assert table.loc[2, "speedup"] == pytest.approx(1.1 / 1.05) and table.loc[2, "beyond_spread"]
    # next_n = 3: vLLM flattens (3 ms); Triton native (1.5 ms) beats DeepGEMM atom (1.9 ms)
    assert table.loc[3, "vllm_strategy"] == "flatten" and table.loc[3, "vllm_us"] == pytest.approx(3000.0)
    assert (table.loc[3, "best_backend"], table.loc[3, "best_strategy"]) == ("triton", "native")
    assert table.loc[3, "best_pieces"] == "" and table.loc[3, "speedup"] == pytest.approx(2.0)


def test_headline_table_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="batch=16"):
        headline.headline_table(_synthetic(), 16, "1024")
    with pytest.raises(ValueError, match="vllm_backend='flashmla'.*allowed values are \\['deepgemm', 'triton'\\]"):
        headline.headline_table(_synthetic(), 4, "1024", vllm_backend="flashmla")
    only_triton = _synthetic().query("backend == 'triton'")
    backend, note = headline.vllm_backend(only_triton)
    assert backend == "triton" and "deepgemm" in note
    assert headline.vllm_backend(_synthetic()) == ("deepgemm", None)


def test_vllm_untimed_strategy_gives_nan_not_a_guess() -> None:
    frame = _synthetic().query("not (next_n == 3 and strategy == 'flatten')")
    table = headline.headline_table(frame, 4, "1024").set_index("next_n")
    assert np.isnan(table.loc[3, "vllm_us"]) and np.isnan(table.loc[3, "speedup"])
    assert "not timed on deepgemm at next_n = 3" in headline.headline_reading(table.reset_index(), "X", "r", 4, "1024")


# ---------------------------------------------------------------- the pictures draw


def test_the_tour_charts_draw(shipped_full_run: store.Run) -> None:
    reads = [headline.tile_reads(s, 6, 5) for s in headline.TOUR_STRATEGIES]
    figures = [
        tour.plot_tile_reads(reads),
        tour.plot_modeled_bytes(headline.modeled_bytes(), 128, "65536"),
    ]
    table = headline.headline_table(shipped_full_run.results, 128, "65536")
    fig = tour.plot_headline(
        shipped_full_run.results, table, 128, "65536", "NVIDIA H200", "measured on NVIDIA H200 | run x"
    )
    figures.append(fig)
    assert "measured on NVIDIA H200" in fig.axes[0].get_title()
    assert "modeled" in figures[1].axes[0].get_title()
    html = tour.style_headline(table, "NVIDIA H200").to_html()
    assert "vLLM 0.33 takes" in html and "beyond spread" in html
    for figure in figures:
        plt.close(figure)


def test_the_headline_chart_draws_a_synthetic_frame() -> None:
    frame = _synthetic()
    table = headline.headline_table(frame, 4, "1024")
    fig = tour.plot_headline(frame, table, 4, "1024", "test GPU", "measured on test GPU")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "native (deepgemm)" in labels and "native (triton)" in labels
    plt.close(fig)
    with pytest.raises(ValueError, match="no measured rows"):
        tour.plot_headline(frame, table, 99, "1024", "test GPU", "")
    with pytest.raises(ValueError, match="modeled"):
        tour.plot_modeled_bytes(frame, 4, "1024")


def _speedup_labels(fig) -> list[str]:
    return [text.get_text() for text in fig.axes[0].texts if text.get_text().endswith("×")]


def test_a_cpu_stand_in_draws_no_speedup_arrows() -> None:
    """Wall-clock gaps on a CPU say nothing about a GPU: no bold speedup, and the legend says why."""
    frame = _synthetic()
    table = headline.headline_table(frame, 4, "1024")
    gpu = tour.plot_headline(frame.assign(device="cuda"), table, 4, "1024", "test GPU", "")
    assert _speedup_labels(gpu) == ["1.05×", "2.00×"]  # next_n 2 and 3: beyond the spread
    cpu = tour.plot_headline(frame.assign(device="cpu"), table, 4, "1024", "CPU reference, not H200", "")
    assert _speedup_labels(cpu) == [] and not any(t.arrow_patch for t in cpu.axes[0].texts)
    assert any("no speedups drawn" in label for label in cpu.axes[0].get_legend_handles_labels()[1])
    for fig in (gpu, cpu):
        plt.close(fig)


def test_an_untimed_vllm_strategy_is_said_in_the_table() -> None:
    frame = _synthetic().query("not (next_n == 3 and strategy == 'flatten')")
    html = tour.style_headline(headline.headline_table(frame, 4, "1024"), "test GPU").to_html()
    assert "vLLM&#39;s strategy not timed" in html  # cell text is HTML-escaped (escape="html"), never live


def test_the_readme_states_the_b1_crossover_the_shipped_run_measured(shipped_full_run: store.Run) -> None:
    """README: at B = 1, atom over flatten (flatten time / atom time) by context, min-max over next_n."""
    rows = shipped_full_run.results.query("status == 'ok' and backend == 'deepgemm' and batch == 1")
    times = rows.pivot_table(index=["context", "next_n"], columns="strategy", values="median_ms")
    times = times.dropna(subset=["atom"])
    ratio = (times["flatten"] / times["atom"]).groupby(level="context")
    spans = {context: f"{low:.2f}–{high:.2f}×" for context, (low, high) in ratio.agg(["min", "max"]).iterrows()}
    both = ratio.agg(["min", "max"]).loc[["32768", "65536"]]
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").split())
    assert f"at 8K flatten wins (atom {spans['8192']}" in readme
    assert f"at 32K and 64K it depends on next_n (atom {both['min'].min():.2f}–{both['max'].max():.2f}×" in readme
    assert f"at 128K atom wins at every next_n ({spans['131072'][:-1]}×)" in readme
    assert ratio.min()["131072"] > 1 and ratio.max()["8192"] < 1  # the crossover itself
