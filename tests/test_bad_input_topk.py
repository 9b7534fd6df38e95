"""Bad input to the top-k: non-finite logits inside a context are refused, never ranked."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.errors import NonFiniteLogits
from dsa_lab.topk import compare_selections, topk_per_row

LOGITS = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
LENS = torch.tensor([10, 5, 2])


def poked(row: int, col: int, value: float) -> torch.Tensor:
    out = LOGITS.clone()
    out[row, col] = value
    return out


SEL = torch.tensor([[1, 0], [2, -1], [0, 1]], dtype=torch.int32)

CASES = {
    "NaN in context": (lambda: topk_per_row(poked(1, 3, float("nan")), LENS, 4), NonFiniteLogits, r"logits: 1 non-finite .*logits\[1, 3\] = nan"),
    "+inf in context": (lambda: topk_per_row(poked(0, 9, float("inf")), LENS, 4), NonFiniteLogits, r"logits: 1 non-finite"),
    "-inf in context": (lambda: topk_per_row(poked(2, 1, float("-inf")), LENS, 4), NonFiniteLogits, r"logits: 1 non-finite"),
    "logits float64": (lambda: topk_per_row(LOGITS.double(), LENS, 4), ValueError, r"logits: dtype"),
    "logits 1-D": (lambda: topk_per_row(LOGITS[0], LENS[:1], 4), ValueError, r"logits: expected 2 dims"),
    "lens float": (lambda: topk_per_row(LOGITS, LENS.float(), 4), ValueError, r"context_lens: dtype"),
    "lens bool": (lambda: topk_per_row(LOGITS, LENS > 3, 4), ValueError, r"context_lens: dtype"),
    "lens count": (lambda: topk_per_row(LOGITS, LENS[:2], 4), ValueError, r"context_lens: expected shape"),
    "lens negative": (lambda: topk_per_row(LOGITS, torch.tensor([10, -1, 2]), 4), ValueError, r"context_lens: values must lie in \[0, 10\]"),
    "lens past width": (lambda: topk_per_row(LOGITS, torch.tensor([11, 5, 2]), 4), ValueError, r"context_lens: values must lie in \[0, 10\]"),
    "lens a list": (lambda: topk_per_row(LOGITS, [10, 5, 2], 4), ValueError, r"context_lens: expected a torch.Tensor"),
    "k zero": (lambda: topk_per_row(LOGITS, LENS, 0), ValueError, r"k=0"),
    "k float": (lambda: topk_per_row(LOGITS, LENS, 4.0), ValueError, r"k=4\.0"),
    "k bool": (lambda: topk_per_row(LOGITS, LENS, True), ValueError, r"k=True"),
    "check_values str": (lambda: topk_per_row(LOGITS, LENS, 4, check_values="yes"), ValueError, r"check_values='yes'"),
    "compare index past scores": (lambda: compare_selections(SEL, SEL.clone().fill_(10), LOGITS), ValueError, r"b: indices must be -1"),
    "compare index below -1": (lambda: compare_selections(SEL.clone().fill_(-2), SEL, LOGITS), ValueError, r"a: indices must be -1"),
    "compare shapes": (lambda: compare_selections(SEL, SEL[:, :1], LOGITS), ValueError, r"b: expected shape"),
    "compare int64": (lambda: compare_selections(SEL.long(), SEL, LOGITS), ValueError, r"a: dtype"),
    "compare scores rows": (lambda: compare_selections(SEL, SEL, LOGITS[:2]), ValueError, r"scores: expected shape"),
    "compare scores int": (lambda: compare_selections(SEL, SEL, LOGITS.int()), ValueError, r"scores: dtype"),
    "compare atol negative": (lambda: compare_selections(SEL, SEL, LOGITS, atol=-1.0), ValueError, r"atol=-1\.0"),
    "compare rtol NaN": (lambda: compare_selections(SEL, SEL, LOGITS, rtol=float("nan")), ValueError, r"rtol=nan"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_topk_refuses_bad_input_by_name(case: str) -> None:
    call, error, name = CASES[case]
    with pytest.raises(error, match=name):
        call()


def test_non_finite_values_past_the_context_are_ignored() -> None:
    """The positive control: tails past a context may hold anything (DeepGEMM leaves them unspecified)."""
    tail = LOGITS.clone()
    tail[1, 5:] = float("nan")
    tail[2, 2:] = float("inf")
    want = LOGITS.clone()
    want[1, 5:] = want[2, 2:] = float("-inf")
    assert torch.equal(topk_per_row(tail, LENS, 4), topk_per_row(want, LENS, 4))


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(0, 12), min_size=1, max_size=5),
    value=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    data=st.data(),
)
def test_a_non_finite_logit_is_refused_exactly_when_it_lies_in_a_context(lens: list[int], value: float, data) -> None:
    logits = torch.randn(len(lens), 12)
    row = data.draw(st.integers(0, len(lens) - 1))
    col = data.draw(st.integers(0, 11))
    logits[row, col] = value
    context = torch.tensor(lens)
    if col < lens[row]:
        with pytest.raises(NonFiniteLogits, match=rf"logits\[{row}, {col}\]"):
            topk_per_row(logits, context, 4)
    else:
        picked = topk_per_row(logits, context, 4)
        assert ((picked[row] < lens[row]) | (picked[row] == -1)).all()
