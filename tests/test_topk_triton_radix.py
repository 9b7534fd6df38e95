"""Our Triton radix select (`triton-radix`, issue 27's selection half) picks what `topk_per_row` picks, through
Triton's interpreter: rows shorter and longer than k, empty rows, negative scores, heavy ties, NaN past every
row, its output poisoned first, its inputs left bit-identical, and the same picks when called twice."""

from __future__ import annotations

import pytest
import torch

from dsa_lab.topk import compare_selections, get_topk, topk_per_row

HERE = get_topk("triton-radix").availability(torch.device("cpu"))


@pytest.mark.skipif(not HERE.ok, reason=HERE.reason)
@pytest.mark.parametrize(
    ("lengths", "k"),
    [([0, 1, 511, 512, 513, 6000], 512), ([2049, 2048, 0, 5000], 2048), ([1500, 3, 1501], 1024)],
)
def test_the_radix_select_picks_what_topk_per_row_picks(lengths: list[int], k: int) -> None:
    width = 6144
    gen = torch.Generator().manual_seed(sum(lengths) + k)
    logits = torch.randn(len(lengths), width, generator=gen) * 4 - 1  # both signs
    logits[:, 1::5] = torch.randint(-2, 3, (len(lengths), len(range(1, width, 5))), generator=gen).float()  # ties
    lens = torch.tensor(lengths, dtype=torch.int32)
    inputs = torch.where(torch.arange(width)[None, :] < lens[:, None], logits, float("nan"))
    kept = (inputs.clone(), lens.clone())
    call = get_topk("triton-radix").prepare(len(lengths), width, k, torch.device("cpu"))
    expected = topk_per_row(logits, lens, k)
    for _ in range(2):  # right twice, each time into poisoned memory
        call.out.fill_(-7)
        picks = call(inputs, lens, max(lengths)).clone()
        assert compare_selections(picks, expected, logits, atol=0.0, rtol=0.0).equal
        assert [(row >= 0).sum().item() for row in picks] == [min(n, k) for n in lengths]
        assert [len(set(row[row >= 0].tolist())) for row in picks] == [min(n, k) for n in lengths]
    assert torch.equal(inputs.isnan(), kept[0].isnan())
    assert torch.equal(torch.nan_to_num(inputs), torch.nan_to_num(kept[0]))
    assert torch.equal(lens, kept[1])


def test_the_radix_select_is_labelled_as_not_vllms() -> None:
    impl = get_topk("triton-radix")
    assert not impl.is_vllm and "not vLLM's" in impl.label
