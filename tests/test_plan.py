"""The launch plan: one derivation of strategy -> pieces -> launches -> bytes, read by every layer above."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dsa_lab.batch.metadata import build_metadata, plan_atoms
from dsa_lab.batch.plan import ANY_NEXT_N, LaunchPlan
from dsa_lab.batch.workload import ContextSpec, DecodeBatch
from dsa_lab.store import folders as store

SHIPPED = Path(__file__).resolve().parents[1] / "data" / "h200" / "h200-full-20261129"


@pytest.mark.parametrize(
    ("strategy", "next_n", "sizes", "label", "shapes"),
    [
        ("native", 3, ANY_NEXT_N, "3", ((2, 3),)),
        ("flatten", 3, (1, 2, 4), "6x1", ((6, 1),)),
        ("atom", 3, (1, 2, 4), "4[pad 1]", ((2, 4),)),
        ("atom", 6, (1, 2, 4), "4+2", ((2, 4), (2, 2))),
        ("atom", 3, (1, 2), "2+1", ((2, 2), (2, 1))),
        ("atom", 3, ANY_NEXT_N, "3", ((2, 3),)),
    ],
)
def test_pieces_launches_and_labels(strategy, next_n, sizes, label, shapes):
    plan = LaunchPlan((100, 300), next_n, strategy, native_sizes=sizes)
    assert plan.label == label and plan.launch_shapes == shapes
    assert plan.launches == len(shapes) and plan.kernel_rows == sum(r * w for r, w in shapes)
    assert plan.same_as_native == (strategy == "atom" and sizes == ANY_NEXT_N)
    if strategy == "atom":
        assert plan.pieces == plan_atoms(next_n, sizes)


def test_the_plans_metadata_is_the_metadata_builders():
    batch = DecodeBatch((70, 130), (5, 5), 5)
    table = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    for strategy in ("native", "flatten", "atom"):
        plan = LaunchPlan(batch.seq_lens, 5, strategy, native_sizes=(1, 2, 4))
        mine, theirs = plan.build_metadata(batch, table), build_metadata(strategy, batch, table, (1, 2, 4))
        assert len(mine.launches) == plan.launches == len(theirs.launches)
        for a, b in zip(mine.launches, theirs.launches, strict=True):
            assert torch.equal(a.token_rows, b.token_rows) and torch.equal(a.context_lens, b.context_lens)
        assert mine.kernel_rows == plan.kernel_rows
    with pytest.raises(ValueError, match="not the step this plan was made for"):
        LaunchPlan((70, 131), 5, "native").build_metadata(batch, table)


def test_signatures_say_which_plans_launch_the_same_work():
    assert LaunchPlan((64, 64), 1, "flatten").signature == LaunchPlan((64, 64), 1, "native").signature
    assert LaunchPlan((64, 64), 2, "flatten").signature != LaunchPlan((64, 64), 2, "native").signature
    assert LaunchPlan((64,), 4, "atom", native_sizes=ANY_NEXT_N).signature == LaunchPlan((64,), 4, "native").signature


def test_the_cost_model_reads_the_plan_and_matches_the_shipped_runs_columns():
    """The bytes the H200 sweep stored per point are the plan's (DeepGEMM's SM90 sizes for atom)."""
    if not SHIPPED.is_dir():
        pytest.skip("no shipped run in this checkout")
    results = store.load_run(SHIPPED).results
    ok = results[(results["status"] == "ok") & (results["backend"] == "deepgemm")].head(60)
    for row in ok.itertuples():
        seq_lens = ContextSpec.parse(row.context).seq_lens(row.batch, 0)
        plan = LaunchPlan(seq_lens, row.next_n, row.strategy, row.heads, row.head_dim, row.cache_dtype, (1, 2, 4))
        assert (plan.cost.strategy_bytes, plan.cost.unique_bytes, plan.cost.flops) == (
            row.strategy_bytes,
            row.unique_bytes,
            row.flops,
        )
        assert (plan.launches, plan.kernel_rows, plan.label) == (row.launches, row.kernel_rows, row.pieces)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"seq_lens": (2,), "next_n": 3}, "need lengths >= next_n=3"),
        ({"strategy": "diagonal"}, "strategy='diagonal'"),
        ({"native_sizes": ()}, "native_sizes: need at least one"),
        ({"next_n": 0}, "next_n=0"),
    ],
)
def test_bad_plans_are_refused_by_name(kwargs, says):
    args = {"seq_lens": (64,), "next_n": 2, "strategy": "atom", **kwargs}
    with pytest.raises(ValueError, match=says):
        LaunchPlan(**args)
