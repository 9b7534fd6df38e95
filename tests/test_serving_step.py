"""Issue 19's step on the CPU: the top-k a timed step runs, the 'logits+topk' unit through the reference
backend, and how a whole step is timed (CUDA-graph replay refused by name off CUDA)."""

from __future__ import annotations

import pytest
import torch

from dsa_lab.axes import TIMED_UNITS, TIMERS
from dsa_lab.batch.acceptance import AcceptanceSpec, accepted_batch
from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.batch.workload import ContextSpec, random_inputs
from dsa_lab.bench.timed_unit import check_topk, timed_step
from dsa_lab.bench.timing import TimingConfig, step_timing_method, time_step
from dsa_lab.decode import gather_selections, launch_call, pack_launch, run_decode
from dsa_lab.kernels import get_backend
from dsa_lab.topk import compare_selections, topk_in_context, topk_per_row

FAST = TimingConfig(warmup=1, min_samples=2, max_samples=3, max_seconds=0.01, window=2)


def float64_topk_scores(logits: torch.Tensor, context_lens: torch.Tensor, k: int) -> list[list[float]]:
    """Per row, the k largest scores among its first context_lens[r], sorted (independent of torch.topk)."""
    rows = []
    for row, length in zip(logits.double().tolist(), context_lens.tolist()):
        rows.append(sorted(row[:length], reverse=True)[:k])
    return rows


def picked_scores(selection: torch.Tensor, logits: torch.Tensor) -> list[list[float]]:
    out = []
    for picks, row in zip(selection.tolist(), logits.double().tolist()):
        out.append(sorted((row[i] for i in picks if i >= 0), reverse=True))
    return out


def test_topk_in_context_reads_and_picks_nothing_past_a_rows_length() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=gen)
    logits[:, 30:] = float("nan")  # past the longest context: never read into the choice
    context = torch.tensor([30, 7, 0, 12, 3, 25], dtype=torch.int32)
    for r, length in enumerate(context.tolist()):
        logits[r, length:30] = 1e9  # an uncleaned tail: never chosen
    logits[0, 3] = logits[0, 4]  # a tie
    got = topk_in_context(logits, context, k=8, columns=30)
    assert got.shape == (6, 8) and got.dtype == torch.int32
    for picks, length in zip(got.tolist(), context.tolist()):
        chosen = [i for i in picks if i >= 0]
        assert len(chosen) == min(8, length) == len(set(chosen)) and all(i < length for i in chosen)
    finite = torch.where(torch.isfinite(logits) & (logits < 1e8), logits, torch.zeros_like(logits))
    assert picked_scores(got, finite) == float64_topk_scores(finite, context, 8)
    reference = topk_per_row(torch.nan_to_num(logits, nan=0.0), context, 8)
    assert compare_selections(got, reference, finite, atol=0.0, rtol=0.0).equal


def test_topk_in_context_with_k_wider_than_the_columns() -> None:
    logits = torch.randn(2, 5)
    got = topk_in_context(logits, torch.tensor([5, 2]), k=8, columns=5)
    assert sorted(got[0].tolist()) == [-1, -1, -1, 0, 1, 2, 3, 4] and sorted(got[1].tolist())[-2:] == [0, 1]
    with pytest.raises(ValueError, match=r"columns=6: allowed range is \[1, 5\]"):
        topk_in_context(logits, torch.tensor([5, 2]), k=8, columns=6)


@pytest.mark.parametrize("strategy", ["native", "flatten", "atom"])
def test_the_logits_and_topk_unit_picks_what_the_reference_decode_picks(strategy) -> None:
    """A ragged step at vLLM's wide logits: the timed unit's per-launch top-k, gathered per token, equals
    `topk_per_row` on the decode's logits and the float64 top-k scores, tie-aware."""
    seq_lens = ContextSpec.parse("lognormal:128:1").seq_lens(4, 0)
    batch = accepted_batch(seq_lens, AcceptanceSpec.parse("accept:0.9,0.5,0.3"), 4, 2, num_heads=32, head_dim=64)
    inputs = random_inputs(batch, seed=9)
    backend, width, k = get_backend("reference"), 2 * batch.max_seq_len, 48
    plan = LaunchPlan(
        batch.seq_lens, batch.max_decode_len, strategy, 32, 64, decode_lens=batch.decode_lens, logits_width=width
    )
    metadata = plan.build_metadata(batch, inputs.cache.block_table)
    calls = [launch_call(pack_launch(launch, inputs), inputs.cache, width) for launch in metadata.launches]
    logits_only = timed_step("logits", backend, calls, batch.max_seq_len, k)
    step = timed_step("logits+topk", backend, calls, batch.max_seq_len, k, topk_impl="torch")
    outputs, selections = logits_only(), step()
    assert [o.shape for o in outputs] == [(p.q.shape[0] * p.q.shape[1], width) for p in calls]
    assert [s.shape for s in selections] == [(o.shape[0], k) for o in outputs]
    assert check_topk(metadata, outputs, selections, k).equal
    decoded = run_decode(inputs, strategy, backend, topk=k, max_context_len=width)
    per_token = gather_selections(metadata, selections)
    assert compare_selections(per_token, decoded.indices, decoded.logits, atol=0.0, rtol=0.0).equal
    assert picked_scores(per_token, decoded.logits) == float64_topk_scores(decoded.logits, decoded.context_lens, k)


def test_check_topk_fails_a_wrong_selection() -> None:
    seq_lens = (90, 130)
    batch = accepted_batch(seq_lens, AcceptanceSpec.parse("none"), 2, 0, num_heads=32, head_dim=64)
    inputs = random_inputs(batch, seed=1)
    plan = LaunchPlan(seq_lens, 2, "native", 32, 64)
    metadata = plan.build_metadata(batch, inputs.cache.block_table)
    calls = [launch_call(pack_launch(launch, inputs), inputs.cache, 130) for launch in metadata.launches]
    step = timed_step("logits+topk", get_backend("reference"), calls, 130, 16, topk_impl="torch")
    outputs = timed_step("logits", get_backend("reference"), calls, 130, 16)()
    wrong = step()[0].clone()
    wrong[0, 0] = next(i for i in range(90) if i not in wrong[0].tolist())  # a position that is not a top-16
    assert not check_topk(metadata, outputs, [wrong], 16).equal


def test_bad_timed_units_are_refused_by_name() -> None:
    assert TIMED_UNITS == ("logits", "logits+topk") and TIMERS == ("events", "graph", "replay")
    batch = accepted_batch((10, 8), AcceptanceSpec.parse("none"), 1, 0, num_heads=32, head_dim=64)
    inputs = random_inputs(batch, seed=1)
    launch = LaunchPlan((10, 8), 1, "native", 32, 64).build_metadata(batch, inputs.cache.block_table).launches[0]
    calls = [launch_call(pack_launch(launch, inputs), inputs.cache, 10)]
    with pytest.raises(ValueError, match="unit='topk'"):
        timed_step("topk", get_backend("reference"), calls, 10)
    with pytest.raises(ValueError, match=r"longest_context=11: allowed range is \[1, 10\]"):
        timed_step("logits", get_backend("reference"), calls, 11)
    with pytest.raises(ValueError, match=r"launches: a step runs at least one launch"):
        timed_step("logits", get_backend("reference"), [], 10)


def test_graph_timing_is_refused_by_name_off_cuda_and_events_time_a_whole_step() -> None:
    calls = []
    step = lambda: calls.append(1)
    with pytest.raises(ValueError, match="timer='graph': CUDA-graph replay needs a CUDA device"):
        time_step(step, "cpu", "graph", FAST)
    assert not calls  # refused before anything ran
    with pytest.raises(ValueError, match="timer='replay'"):
        time_step(step, "cpu", "replay", FAST)
    measured = time_step(step, "cpu", "events", FAST)
    assert measured.timing_method == "wall_clock" and measured.samples >= FAST.min_samples
    assert len(calls) == FAST.warmup + measured.samples
    cuda = torch.device("cuda")
    assert step_timing_method(cuda, "graph", FAST) == "cuda_graph_step_cold_l2"
    warm = TimingConfig(cold_l2=False, use_graph=True)
    assert step_timing_method(cuda, "graph", warm) == "cuda_graph_step_warm_l2"
    assert step_timing_method(cuda, "events", warm) == "cuda_events_warm_l2"  # events never replay a graph


@pytest.mark.parametrize("strategy", ["native", "flatten", "atom"])
def test_the_topk_unit_of_a_ragged_wide_step_picks_the_float64_definitions_top_scores(strategy) -> None:
    """Acceptance -> ragged rows, vLLM's model-wide logits, the 'logits+topk' unit through the reference: per
    token, the picks lie inside its context, are distinct and as many as min(k, context), and their scores under
    the float64 definition (`float64_logits`, from the dequantised keys) are the float64 top-k's, up to float32
    rounding (a near tie may legally swap)."""
    from tests.test_serving_acceptance import float64_logits

    seq_lens = ContextSpec.parse("mixed:40-200").seq_lens(5, 4)
    batch = accepted_batch(seq_lens, AcceptanceSpec.parse("v4flash-ascend131"), 4, 7, num_heads=32, head_dim=64)
    assert len(set(batch.decode_lens)) > 1
    inputs = random_inputs(batch, seed=11)
    backend, width, k = get_backend("reference"), 3 * batch.max_seq_len, 32
    plan = LaunchPlan(batch.seq_lens, batch.max_decode_len, strategy, 32, 64, decode_lens=batch.decode_lens,
                      logits_width=width)  # fmt: skip
    metadata = plan.build_metadata(batch, inputs.cache.block_table)
    calls = [launch_call(pack_launch(launch, inputs), inputs.cache, width) for launch in metadata.launches]
    step = timed_step("logits+topk", backend, calls, batch.max_seq_len, k, topk_impl="torch")
    picks = gather_selections(metadata, step()).tolist()
    exact = float64_logits(inputs, batch, width)
    for token, (chosen, context, row) in enumerate(zip(picks, batch.token_context_lens(), exact.tolist())):
        kept = [i for i in chosen if i >= 0]
        assert len(kept) == len(set(kept)) == min(k, context) and all(0 <= i < context for i in kept), token
        got, best = sorted((row[i] for i in kept), reverse=True), sorted(row[:context], reverse=True)[:k]
        scale = max(abs(v) for v in best)
        assert max(abs(a - b) for a, b in zip(got, best)) <= 1e-5 * scale, token
