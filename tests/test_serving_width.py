"""Issue 19's logits width on the CPU: 'batch' or 'model:N', carried by the plan and the metadata, and
the bytes a wider output costs for a kernel that cleans the tail or leaves it."""

from __future__ import annotations

import pytest
import torch

from dsa_lab.batch.metadata import STRATEGIES, build_metadata
from dsa_lab.batch.plan import DEEPSEEK_V32_MAX_MODEL_LEN, LaunchPlan, LogitsWidth
from dsa_lab.batch.workload import DecodeBatch


def test_logits_width_labels_and_bounds() -> None:
    assert LogitsWidth.parse("batch").columns((100, 300)) == 300
    wide = LogitsWidth.parse(f"Model:{DEEPSEEK_V32_MAX_MODEL_LEN}")
    assert wide.label == "model:163840" and wide.columns((100, 300)) == 163_840
    assert LogitsWidth.parse(wide.label) == wide
    for bad in ("model:", "model:-3", "163840", "model:1e5"):
        with pytest.raises(ValueError, match="logits_width=.*'batch'.*'model:N'"):
            LogitsWidth.parse(bad)
    with pytest.raises(ValueError, match="narrower than the longest context 300"):
        LaunchPlan((100, 300), 2, "native", logits_width=200)
    batch = DecodeBatch((100, 300), (2, 2), 2)
    with pytest.raises(ValueError, match=r"max_context_len=200: allowed range is \[300, "):
        build_metadata("native", batch, torch.zeros(2, 5, dtype=torch.int32), (1, 2, 4), max_context_len=200)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_plans_bytes_say_what_a_wider_output_costs(strategy) -> None:
    """Owned and whole-width logits bytes, counted independently from the metadata the plan builds."""
    seq_lens, decode_lens, width = (70, 131, 200), (3, 1, 2), 4096
    batch = DecodeBatch(seq_lens, decode_lens, 3)
    table = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    narrow = LaunchPlan(seq_lens, 3, strategy, decode_lens=decode_lens)
    plan = LaunchPlan(seq_lens, 3, strategy, decode_lens=decode_lens, logits_width=width)
    metadata = plan.build_metadata(batch, table)
    assert metadata.max_context_len == plan.max_context_len == width and narrow.max_context_len == 200
    owned = sum(int(launch.context_lens.sum()) for launch in metadata.launches) * 4
    assert plan.cost.owned_logit_bytes == owned == narrow.cost.owned_logit_bytes
    assert plan.cost.full_logit_bytes == metadata.kernel_rows * width * 4 == plan.kernel_rows * width * 4
    assert plan.cost.logit_bytes(cleans_tail=False) == owned and plan.cost.logit_bytes(cleans_tail=True) > owned
    assert plan.cost.moved_bytes(True) - plan.cost.moved_bytes(False) == plan.cost.full_logit_bytes - owned
    # the width changes what is written, never what is read or computed
    for field in ("unique_bytes", "strategy_bytes", "flops", "strategy_kv_bytes", "kernel_rows"):
        assert getattr(plan.cost, field) == getattr(narrow.cost, field)
    contexts = batch.token_context_lens()
    assert plan.tokens == len(contexts) == 6 and plan.cost.flops == 2 * 64 * 128 * sum(contexts)
    assert metadata.token_context_lens().tolist() == contexts
    if strategy == "flatten":
        assert plan.label == "6x1" and plan.cost.strategy_kv_bytes == sum(contexts) * 132


def test_a_uniform_plan_costs_what_it_always_cost() -> None:
    sm90 = (1, 2, 4)  # DeepGEMM's SM90 native sizes: 3 = padded 4
    old = LaunchPlan((100, 300), 3, "atom", native_sizes=sm90)
    explicit = LaunchPlan((100, 300), 3, "atom", native_sizes=sm90, decode_lens=(3, 3), logits_width=300)
    assert explicit == old and explicit.cost == old.cost
    assert old.cost.moved_bytes(False) > old.cost.strategy_bytes  # the padding row's logits are written too
    native = LaunchPlan((100, 300), 3, "native").cost
    assert native.moved_bytes(False) == native.strategy_bytes
    with pytest.raises(ValueError, match="decode_lens=.*the longest equal to next_n=3"):
        LaunchPlan((100, 300), 3, "native", decode_lens=(2, 2))
    with pytest.raises(ValueError, match="not the step this plan was made for"):
        old.build_metadata(DecodeBatch((100, 300), (3, 1), 3), torch.zeros(2, 5, dtype=torch.int32))
