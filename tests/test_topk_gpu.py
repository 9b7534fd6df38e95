"""vLLM's own decode top-k on a CUDA GPU (issue 26; skipped without one, or without a build of the kernels):
on fresh random logits, ragged and padded rows, every kernel vLLM's rules pick (the cooperative clusters, the
filtered and the sampled kernels), each k it takes, it picks what `topk_per_row` picks (tie-aware), writes every
pick, reads nothing past a row's length (NaN there), leaves its logits alone and replays in a CUDA graph.

On the device: `python3 scripts/build_vllm_topk.py` here, carry `build/vllm_topk`, then
`PYTHONPATH=$PWD python3 -m pytest tests/test_topk_gpu.py -q`.
"""

from __future__ import annotations

import pytest
import torch

from dsa_lab.topk import compare_selections, topk_per_row, vllm_topk

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not vllm_topk().availability(torch.device("cuda")).ok,
    reason="needs a CUDA GPU of SM90+ and vLLM's top-k (its ops, or scripts/build_vllm_topk.py's build)",
)
WIDTH = 163840  # DeepSeek-V3.2's max_model_len: vLLM's logits width


def _logits(rows: int, lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random logits (with ties), NaN past each row's length; the clean copy and the lengths."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    clean = torch.randn(rows, WIDTH, generator=gen, device="cuda")
    clean[:, 5::97] = clean[:, 3:4]  # equal scores, which may swap indices
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    poisoned = torch.where(torch.arange(WIDTH, device="cuda")[None, :] < lens[:, None], clean, float("nan"))
    return poisoned, clean, lens


def _lengths(rows: int, longest: int, seed: int) -> list[int]:
    """Ragged lengths up to `longest`: short rows, rows of exactly k and around it, a padding row (0)."""
    gen = torch.Generator().manual_seed(seed)
    picked = torch.randint(1, longest + 1, (rows,), generator=gen).tolist()
    special = [longest, 0, 1, 2047, 2048, 2049]
    return [*special[: min(rows, len(special))], *picked][:rows]


@pytest.mark.parametrize(
    ("rows", "longest", "kernel"),
    [
        (1, 65536, "cooperative (cluster 8)"),
        (4, 163840, "cooperative (cluster 8)"),
        (16, 131072, "cooperative (cluster 4)"),
        (64, 131072, "cooperative (cluster 2)"),
        (128, 32768, "filtered"),
        (384, 131072, "sampled"),
    ],
)
@pytest.mark.parametrize("k", [512, 2048])
def test_vllms_top_k_picks_what_topk_per_row_picks(rows: int, longest: int, kernel: str, k: int) -> None:
    lengths = _lengths(rows, longest, rows + k)
    poisoned, clean, lens = _logits(rows, lengths, rows * k)
    call = vllm_topk().prepare(rows, WIDTH, k, torch.device("cuda"))
    call.out.fill_(-2)  # an unwritten pick stays -2, which no comparison accepts
    kept = poisoned.clone()
    picks = call(poisoned, lens, max(lengths)).clone()
    torch.cuda.synchronize()
    assert call.kernel == kernel
    assert int(picks.min()) >= -1, "some picks were never written"
    assert torch.equal(poisoned.view(torch.int32), kept.view(torch.int32)), "the top-k wrote into its logits"
    agreement = compare_selections(picks, topk_per_row(clean, lens, k), clean, atol=0.0, rtol=0.0)
    assert agreement.equal, (agreement.rows - agreement.rows_equal, agreement.max_score_gap)
    assert [(row >= 0).sum().item() for row in picks.cpu()] == [min(n, k) for n in lengths]


def test_vllms_top_k_replays_in_a_cuda_graph_over_new_logits() -> None:
    rows, lengths = 96, _lengths(96, 98304, 3)
    poisoned, clean, lens = _logits(rows, lengths, 4)
    call = vllm_topk().prepare(rows, WIDTH, 2048, torch.device("cuda"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(poisoned, lens, 98304)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        picks = call(poisoned, lens, 98304)
    fresh, fresh_clean, _ = _logits(rows, lengths, 5)
    poisoned.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    agreement = compare_selections(picks.clone(), topk_per_row(fresh_clean, lens, 2048), fresh_clean, 0.0, 0.0)
    assert agreement.equal
