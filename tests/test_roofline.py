"""Roofline arithmetic on a case small enough to count by hand, and its agreement with the metadata."""

from __future__ import annotations

import pytest
import torch

from dsa_lab.batch.metadata import build_metadata
from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.batch.workload import DecodeBatch
from dsa_lab.model.roofline import (
    GPUS,
    GpuSpec,
    floor_ms,
    get_gpu,
    gpu_for_device,
    modeled_rows,
    modeled_time,
    roofline_columns,
)

# Two requests of 100 and 200 cached tokens, next_n = 2, H = 32, D = 64, FP8 (68 B a token).
# Row contexts: 99, 100 | 199, 200 -> sum 598 over 4 query rows.
SEQ_LENS = (100, 200)
CONTEXT_SUM = 598
SIDE = CONTEXT_SUM * 4 + 4 * 32 * (64 + 4)  # valid logits + q (fp8) and weights (f32)


def shape(strategy: str, sizes=(1, 2, 4)) -> LaunchPlan:
    return LaunchPlan(SEQ_LENS, 2, strategy, heads=32, head_dim=64, native_sizes=sizes)


def test_native_reads_each_request_once():
    cost = shape("native").cost
    assert cost.unique_bytes == 300 * 68 + SIDE
    assert cost.strategy_bytes == cost.unique_bytes
    assert cost.flops == 2 * 32 * 64 * CONTEXT_SUM
    assert (cost.kernel_rows, cost.launches) == (4, 1)


def test_flatten_rereads_per_row_and_atom_per_piece():
    flat = shape("flatten").cost
    assert flat.strategy_bytes == CONTEXT_SUM * 68 + SIDE
    assert flat.unique_bytes == 300 * 68 + SIDE
    atom = shape("atom", sizes=(1,)).cost  # 2 = 1 + 1: each piece re-reads, like flatten
    assert (atom.strategy_bytes, atom.kernel_rows, atom.launches) == (flat.strategy_bytes, 4, 2)


def test_padded_atom_reads_the_longest_row_of_each_piece():
    # next_n = 3 with sizes {4}: one piece of 4 starting at row -1 (front padding).
    cost = LaunchPlan((10,), 3, "atom", heads=32, head_dim=64, native_sizes=(4,)).cost
    assert cost.kernel_rows == 4 and cost.launches == 1
    assert cost.strategy_bytes - cost.unique_bytes == 0  # the last row sees all 10 tokens, read once


@pytest.mark.parametrize("strategy", ["native", "flatten", "atom"])
@pytest.mark.parametrize("next_n", [1, 3, 5])
def test_counts_match_the_metadata(strategy, next_n):
    lens = (70, 130, 64)
    batch = DecodeBatch(lens, (next_n,) * 3, next_n, 32, 64)
    table = torch.zeros(3, 3, dtype=torch.int32)
    meta = build_metadata(strategy, batch, table, (1, 2, 4))
    cost = LaunchPlan(lens, next_n, strategy, heads=32, head_dim=64, native_sizes=(1, 2, 4)).cost
    assert cost.kernel_rows == meta.kernel_rows
    assert cost.launches == len(meta.launches)
    read_tokens = sum(int(launch.context_lens.max(dim=1).values.sum()) for launch in meta.launches)
    side = sum(batch.token_context_lens()) * 4 + 3 * next_n * 32 * 68
    assert cost.strategy_bytes == read_tokens * 68 + side
    assert cost.flops == 2 * 32 * 64 * sum(batch.token_context_lens())


def test_floor_picks_the_larger_term_and_rates_follow():
    gpu = GpuSpec("toy", hbm_tbps=1.0, fp8_tflops=1.0, source="test")
    cost = shape("flatten").cost
    floor, bound = floor_ms(cost, gpu)
    assert bound == "compute" and floor == pytest.approx(cost.flops / 1e12 * 1e3)
    columns = roofline_columns(cost, 2.0, gpu)
    assert columns["achieved_tbps"] == pytest.approx(cost.strategy_bytes / 2e9)
    assert columns["effective_tbps"] == pytest.approx(cost.unique_bytes / 2e9)
    assert columns["achieved_tflops"] == pytest.approx(cost.flops / 2e9)
    assert columns["fraction_of_floor"] == pytest.approx(floor / 2.0)
    untimed = roofline_columns(cost, None, None)
    assert untimed["achieved_tbps"] is None and untimed["floor_ms"] is None


def test_modeled_times_are_labelled_and_use_the_strategy_bytes():
    point = modeled_time(shape("flatten"), "B200")
    assert point.source == "modeled"
    cost = shape("flatten").cost
    assert point.time_ms == pytest.approx(max(cost.strategy_bytes / 7.67e12, cost.flops / 4.5e15) * 1e3)
    rows = modeled_rows([shape("native"), shape("flatten")], ["B200", "GB200"])
    assert len(rows) == 4 and {row["source"] for row in rows} == {"modeled"}


def test_one_gpu_table_the_model_and_the_roofline_agree():
    """H200, B200 and GB200 are read from dsa_lab.model.gpus: one number each, with its source."""
    from dsa_lab.model import gpus as model_gpus

    for name, gpu in model_gpus.GPUS.items():
        row = GPUS[name]
        assert (row.hbm_tbps, row.fp8_tflops) == (gpu.hbm_tbps.value, gpu.fp8_tflops.value)
        assert gpu.hbm_tbps.source in row.source and gpu.fp8_tflops.source in row.source
    assert GPUS["B200"].hbm_tbps == GPUS["GB200"].hbm_tbps == 7.67  # the driver's figure, not the datasheet's 8
    assert "7680-bit bus x 3996 MHz x 2" in GPUS["B200"].source


def test_gpu_table_names_sources_and_rejects_unknown_names():
    assert {"H100", "H200", "B200", "GB200", "H200-measured"} <= set(GPUS)
    assert all(spec.source for spec in GPUS.values())
    measured = GPUS["H200-measured"]  # one set of H200 ceilings: the model's, measured in the shipped run
    assert measured.measured and (measured.hbm_tbps, measured.fp8_tflops) == (4.35, 1254.0)
    assert measured.source.count("--measure-ceilings") == 2  # measured by the harness (tests/test_model.py: values)
    with pytest.raises(ValueError, match="allowed values"):
        get_gpu("A100")
    assert gpu_for_device("NVIDIA H200").name == "H200-measured"
    assert gpu_for_device("NVIDIA GB200").name == "GB200"
    assert gpu_for_device("cpu") is None
    mine = gpu_for_device("NVIDIA H200", {"read_tbps": 4.0, "fp8_tflops": 1200.0})
    assert mine.measured and mine.hbm_tbps == 4.0


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="strategy"):
        LaunchPlan((10,), 2, "zigzag")
    with pytest.raises(ValueError, match="seq_lens"):
        LaunchPlan((1,), 2, "native")
