"""Issue 19's MTP acceptance on the CPU: per-position rates -> seeded ragged decode lengths, their
published sources, and the ragged steps they make through the reference backend against float64."""

from __future__ import annotations

import math

import pytest
import torch

from dsa_lab.batch.acceptance import PUBLISHED, AcceptanceSpec, accepted_batch, parse_acceptance_list
from dsa_lab.batch.cache import gather_request_keys
from dsa_lab.batch.metadata import STRATEGIES, logits_width
from dsa_lab.batch.workload import ContextSpec, DecodeBatch, random_inputs
from dsa_lab.decode import run_decode
from dsa_lab.model.decode_step import ACCEPTANCE_PRESETS


def float64_logits(inputs, batch: DecodeBatch, width: int) -> torch.Tensor:
    """The definition, token by token, in float64 from the dequantised keys; -inf past each context."""
    rows = []
    for t, (b, context) in enumerate(zip(batch.token_requests(), batch.token_context_lens())):
        k = gather_request_keys(inputs.cache, b, context).double()
        scores = torch.relu(inputs.q[t].double() @ k.T)
        row = torch.full((width,), float("-inf"), dtype=torch.float64)
        row[:context] = (inputs.weights[t].double()[:, None] * scores).sum(0)
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize(
    ("typed", "label", "rates"),
    [
        ("none", "none", None),
        ("accept:0.8,0.6,0.4", "accept:0.8,0.6,0.4", (0.8, 0.6, 0.4)),
        (" ACCEPT:1,0.5 ", "accept:1.0,0.5", (1.0, 0.5)),
        ("v4flash-vllm41044", "v4flash-vllm41044", (0.7002, 0.2874)),
        ("V4flash-ascend131:2", "v4flash-ascend131:2", (0.98, 0.64)),
        ("v4flash-ascend131:3", "v4flash-ascend131", (0.98, 0.64, 0.15)),
    ],
)
def test_acceptance_labels_round_trip(typed, label, rates) -> None:
    spec = AcceptanceSpec.parse(typed)
    assert (spec.label, spec.rates) == (label, rates)
    assert AcceptanceSpec.parse(spec.label) == spec


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("accept:0.4,0.6", r"rates\[1\]=0.6 > rates\[0\]=0.4"),
        ("accept:1.2", r"rates\[0\]=1.2"),
        ("accept:", "acceptance="),
        ("accept:0.5,x", "acceptance="),
        ("accept:nan", "acceptance="),
        ("often", "acceptance="),
        ("v3-report:2", "v3-report has 1 positions; take 1..1"),
        ("v3-report:x", "acceptance="),
    ],
)
def test_bad_acceptance_is_refused_by_name(bad, says) -> None:
    with pytest.raises(ValueError, match=says):
        AcceptanceSpec.parse(bad)
    with pytest.raises(ValueError, match="gives 2 draft positions, next_n=4 needs 3"):
        AcceptanceSpec.parse("accept:0.9,0.5").decode_lens(8, 4, 0)


def test_decode_lengths_follow_the_per_position_rates() -> None:
    """P(rows >= k + 1) = a_k (vLLM's per-position rate), checked in float64 on 20000 requests."""
    spec, n, batch = AcceptanceSpec.parse("accept:0.8,0.6,0.4,0.1"), 5, 20_000
    lens = torch.tensor(spec.decode_lens(batch, n, seed=3), dtype=torch.float64)
    assert lens.min() >= 1 and lens.max() <= n
    for k, rate in enumerate((0.8, 0.6, 0.4, 0.1), start=1):
        share = float((lens >= k + 1).double().mean())
        assert abs(share - rate) < 4 * math.sqrt(rate * (1 - rate) / batch)
    assert abs(float(lens.mean()) - spec.expected_rows(n)) < 0.03 and spec.expected_rows(n) == pytest.approx(2.9)
    assert spec.decode_lens(64, n, 3) == spec.decode_lens(batch, n, 3)[:64] != spec.decode_lens(64, n, 4)
    assert spec.decode_lens(16, 3, 3) == tuple(min(x, 3) for x in spec.decode_lens(16, n, 3))  # fewer drafts: a prefix
    assert AcceptanceSpec.parse("none").decode_lens(7, 4, 0) == (4,) * 7
    assert AcceptanceSpec.parse("accept:0").decode_lens(7, 2, 0) == (1,) * 7


def test_published_profiles_are_declared_once() -> None:
    assert {ACCEPTANCE_PRESETS[n] for n in ACCEPTANCE_PRESETS} <= {(p.rates, p.source) for p in PUBLISHED.values()}
    for name, published in PUBLISHED.items():
        assert AcceptanceSpec.parse(name).rates == published.rates and published.url.startswith("https://")


def test_the_command_lines_list_keeps_an_accept_profiles_numbers_together() -> None:
    labels = [s.label for s in parse_acceptance_list("none, accept:0.8,0.6,0.4 ,v3-report,accept:0.5")]
    assert labels == ["none", "accept:0.8,0.6,0.4", "v3-report", "accept:0.5"]
    with pytest.raises(ValueError, match="at least one profile"):
        parse_acceptance_list(" , ")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("width", [None, 1000])
def test_ragged_steps_from_acceptance_match_float64_through_the_reference(strategy, width) -> None:
    """Acceptance -> ragged decode lengths -> each strategy's metadata -> the reference kernel, at the
    batch's width and a wider one: every token's logits equal the float64 definition, -inf past its context."""
    seq_lens = ContextSpec.parse("mixed:64-300").seq_lens(5, 2)
    batch = accepted_batch(seq_lens, AcceptanceSpec.parse("accept:0.7,0.5,0.2"), 4, seed=1, num_heads=32, head_dim=64)
    assert len(set(batch.decode_lens)) > 1 and batch.next_n == 4
    inputs = random_inputs(batch, seed=5)
    result = run_decode(inputs, strategy, topk=16, max_context_len=width)
    expected = float64_logits(inputs, batch, logits_width(batch, width))
    assert result.logits.shape == expected.shape == (batch.num_decode_tokens, width or batch.max_seq_len)
    valid = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(result.logits), valid)
    got = result.logits.double()[valid]
    assert float((got - expected[valid]).abs().max() / expected[valid].abs().max()) < 1e-6
    assert result.context_lens.tolist() == batch.token_context_lens()
