"""Ragged verification's step on the CPU (issue 26; the captured graph itself runs in tests/test_replay_gpu.py):
each row's context comes from device tensors of lengths and drafts, a padding request reads nothing, every
replay's check finds a right step right and a wrong, unwritten or mis-picked one wrong, and the timer says which
points it can take."""

from __future__ import annotations

import pytest
import torch

from dsa_lab.batch.acceptance import AcceptanceSpec, accepted_batch
from dsa_lab.batch.workload import ContextSpec, random_inputs
from dsa_lab.bench.point import Point
from dsa_lab.bench.replay import check_replay, draws, ragged_graph, ragged_step, replay_skip
from dsa_lab.kernels import get_backend
from dsa_lab.topk import get_topk

CURVE = "v4flash-ascend131"


def _step(strategy: str, next_n: int = 4, topk: int = 32):
    seq_lens = ContextSpec.parse("mixed:64-300").seq_lens(3, 5)
    batch = accepted_batch(seq_lens, AcceptanceSpec.parse(CURVE), next_n, seed=1, num_heads=32, head_dim=64)
    inputs = random_inputs(batch, seed=2)
    graph = ragged_graph(inputs, next_n, strategy, seed=3)
    width = 2 * batch.max_seq_len
    call = get_topk("torch").prepare(graph.context.numel(), width, topk, torch.device("cpu"))
    step = ragged_step(get_backend("reference"), graph, inputs, width, call, batch.max_seq_len)
    return inputs, graph, step, width


def test_natively_each_rows_context_comes_from_the_lengths_and_drafts_and_the_pad_reads_nothing() -> None:
    inputs, graph, _, _ = _step("native")
    lens = (4, 1, 3, 0)  # three requests and the CUDA-graph padding request
    graph.decode_lens.copy_(torch.tensor(lens, dtype=torch.int32))
    graph.prepare()
    seq = inputs.batch.seq_lens
    want = [[seq[b] - d + 1 + j if j < d else 0 for j in range(4)] for b, d in enumerate(lens[:3])] + [[0] * 4]
    assert graph.context.tolist() == want and graph.slots.reshape(-1).tolist() == list(range(16))


def test_flattened_the_verified_rows_come_first_packed_as_vllm_packs_them() -> None:
    inputs, graph, _, _ = _step("flatten")
    lens = (2, 4, 1, 0)
    graph.decode_lens.copy_(torch.tensor(lens, dtype=torch.int32))
    graph.prepare()
    seq = inputs.batch.seq_lens
    want = [seq[b] - d + 1 + j for b, d in enumerate(lens[:3]) for j in range(d)]
    assert graph.context.reshape(-1).tolist() == want + [0] * (16 - len(want))
    assert graph.slots[1].tolist() == [2, 3, 4, 5] and graph.slots[0, 2:].tolist() == [-1, -1]
    q = graph.q_rows.view(torch.uint8)
    assert torch.equal(graph.q[3, 0].view(torch.uint8), q[1, 1])  # slot 3: request 1's second row
    assert torch.equal(graph.block_table[6], graph.tables[2]) and torch.equal(graph.block_table[7], graph.tables[3])
    assert torch.equal(graph.weights[6], graph.w_rows[2 * 4 + 0])


@pytest.mark.parametrize("strategy", ["native", "flatten"])
def test_a_right_replay_passes_and_a_wrong_one_is_caught(strategy) -> None:
    inputs, graph, step, width = _step(strategy)
    point = Point("reference", strategy, 3, "mixed:64-300", 4, "fp8", 32, 64, acceptance=CURVE, timer="replay")
    for lens in draws(point, seed=0, replays=3):
        assert lens[-1] == 0 and len(lens) == 4 and all(1 <= d <= 4 for d in lens[:3])
        graph.decode_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.prepare()
        out, picks = step()
        rel_err, nans, rows, equal = check_replay(graph, inputs, out, picks, width, [0, 1, 2])
        assert (rel_err, nans) == (0.0, 0) and rows == equal == graph.context.numel()
    real = (graph.context.reshape(-1) > 0).nonzero()[0, 0]
    wrong = out.clone()
    wrong[real, 0] += 1.0
    assert check_replay(graph, inputs, wrong, picks, width, [0, 1, 2])[0] > 1e-6
    unwritten = out.clone()
    unwritten[real, :3] = float("nan")
    assert check_replay(graph, inputs, unwritten, picks, width, [0, 1, 2])[1] == 3
    mispicked = picks.clone()
    mispicked[real, 0] = -1
    assert check_replay(graph, inputs, out, mispicked, width, [0, 1, 2])[3] == picks.shape[0] - 1
    left = picks.clone().fill_(-2)  # the poison a replay writes before it: an unwritten selection
    assert check_replay(graph, inputs, out, left, width, [0])[3] == 0


def test_draws_change_between_replays_and_repeat_with_the_seed() -> None:
    point = Point("reference", "native", 16, "8192", 4, "fp8", 64, 128, acceptance=CURVE, timer="replay")
    steps = draws(point, seed=7, replays=24)
    assert steps == draws(point, seed=7, replays=24) and len(set(steps)) == 24


def test_the_replay_timer_says_which_points_it_cannot_take() -> None:
    base = {"backend": "reference", "batch": 2, "context": "256", "next_n": 3, "cache_dtype": "fp8", "heads": 64}
    base |= {"head_dim": 128, "timer": "replay"}
    assert "strategies ('native', 'flatten')" in replay_skip(Point(strategy="atom", acceptance=CURVE, **base))
    assert "acceptance profile" in replay_skip(Point(strategy="native", **base))
    assert replay_skip(Point(strategy="flatten", acceptance=CURVE, **base)) is None
