"""The work-balanced schedule and the tail fill (kernels/gluon/schedule.py), run by Triton's interpreter.

The schedule splits the launch's real KV blocks (each request's longest row's) into equal
contiguous shares, one per CTA, that may cross request boundaries: checked against a plain
Python split on padded, ragged and boundary batches with tables wider than needed, and for what a
kernel walking it needs (every block owned by exactly one CTA, in request-major order; each CTA's
first page ids those of its first blocks). The tail fill writes -inf past
each request's last block and nothing before it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.kernels.gluon.schedule import BLOCK_SIZE, balanced_schedule, fill_tail, reference_schedule
from dsa_lab.kernels.jit import interpreter_state

pytestmark = pytest.mark.skipif(not interpreter_state().ok, reason=interpreter_state().reason)


def causal_lens(seq_lens: list[int], next_n: int) -> torch.Tensor:
    """vLLM's 2-D context lens: row j of a request with L cached tokens sees L - n + 1 + j (0: padding)."""
    rows = [[max(0, length - next_n + 1 + j) if length else 0 for j in range(next_n)] for length in seq_lens]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(seq_lens), next_n)


def walk(ranges: list[tuple[int, int]], blocks: list[int]) -> list[list[tuple[int, int]]]:
    """The (request, block) pairs each CTA visits, as the kernel walks its range."""
    visits = []
    for (b0, off0), (b1, off1) in zip(ranges, ranges[1:]):
        mine = []
        for b in range(b0, min(b1, len(blocks) - 1) + 1):
            lo = off0 if b == b0 else 0
            hi = off1 if b == b1 else blocks[b]
            mine += [(b, k) for k in range(lo, hi)]
        visits.append(mine)
    return visits


def table_for(seq_lens: list[int], extra: int = 3) -> torch.Tensor:
    """A block table wider than any request needs (`extra` spare columns), with distinct page ids."""
    width = max(-(-length // BLOCK_SIZE) for length in seq_lens) + extra
    ids = torch.randperm(len(seq_lens) * width, generator=torch.Generator().manual_seed(len(seq_lens)))
    return ids.to(torch.int32).reshape(len(seq_lens), width)


def check(seq_lens: list[int], next_n: int, programs: int) -> None:
    lens, table = causal_lens(seq_lens, next_n), table_for(seq_lens)
    schedule = balanced_schedule(lens, table, programs)
    want_ranges, want_blocks, want_pages = reference_schedule(lens, table, programs)
    ranges = [tuple(pair) for pair in schedule.ranges.tolist()]
    assert schedule.blocks.tolist() == want_blocks
    assert ranges == want_ranges
    assert schedule.pages.tolist() == want_pages
    for p, ((b, off), pages) in enumerate(zip(ranges, want_pages)):  # the ids a CTA's first copies use
        if b < len(seq_lens):
            owned = table[b, off : off + len(pages)].tolist()
            assert pages[: len(owned)] == owned, f"CTA {p}: first page ids are not its first blocks'"
    assert ranges[-1] == (len(seq_lens), 0), "the last entry marks the end"
    visits = walk(ranges, want_blocks)
    flat = [pair for share in visits for pair in share]
    assert flat == [(b, k) for b, n in enumerate(want_blocks) for k in range(n)], "each block once, in order"
    sizes = [len(share) for share in visits]
    assert max(sizes) - min(sizes) <= 1, f"shares differ by more than one block: {sizes}"


@pytest.mark.parametrize("next_n", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("programs", [1, 7, 132])
def test_boundary_padding_and_tiny_contexts(next_n: int, programs: int) -> None:
    # contexts of 1 and at block boundaries, zero-length (CUDA-graph padding) requests first, inside and last
    seq_lens = [0, max(next_n, 1), 63, 64, 65, 0, 127, 128, 129, 5000, 0]
    check([max(length, next_n) if length else 0 for length in seq_lens], next_n, programs)


def test_all_padding_and_fewer_blocks_than_ctas() -> None:
    check([0, 0, 0], 2, 132)  # nothing to do: every CTA's range is empty
    check([1], 1, 132)  # one block, 131 idle CTAs
    check([64 * 5, 0, 64 * 3], 1, 132)


def test_ragged_contexts_are_split_by_work_not_by_request() -> None:
    seq_lens = [128 * 1024] + [2048] * 127  # a split by columns gave one CTA all of request 0
    schedule = balanced_schedule(causal_lens(seq_lens, 3), table_for(seq_lens), 132)
    visits = walk([tuple(p) for p in schedule.ranges.tolist()], schedule.blocks.tolist())
    total = sum(schedule.blocks.tolist())
    assert max(len(share) for share in visits) == -(-total // 132)
    spread = sum(1 for share in visits if any(b == 0 for b, _ in share))
    assert spread >= 2048 * 132 // total - 1, f"request 0's 2048 blocks went to {spread} CTAs"
    check(seq_lens, 3, 132)


@settings(max_examples=40, deadline=None)
@given(
    seq_lens=st.lists(st.one_of(st.just(0), st.integers(16, 20_000)), min_size=1, max_size=70),
    next_n=st.integers(1, 16),
    programs=st.integers(1, 300),
)
def test_random_batches_match_the_reference_split(seq_lens: list[int], next_n: int, programs: int) -> None:
    check(seq_lens, next_n, programs)


@pytest.mark.parametrize("width", [1, 300, 2100])
def test_fill_tail_writes_minus_inf_past_each_requests_last_block_only(width: int) -> None:
    seq_lens = [0, 1, 65, 130]
    next_n = 2
    lens = causal_lens([max(s, next_n) if s else 0 for s in seq_lens], next_n).clamp(max=width)
    schedule = balanced_schedule(lens, table_for(seq_lens), 5)
    out = torch.full((len(seq_lens) * next_n, width), float("nan"))
    fill_tail(out, schedule, next_n)
    for row in range(out.shape[0]):
        start = min(width, schedule.blocks[row // next_n].item() * BLOCK_SIZE)
        assert torch.isnan(out[row, :start]).all(), f"row {row}: wrote before its last block"
        assert torch.isneginf(out[row, start:]).all(), f"row {row}: tail not cleaned"


def test_bad_input_named() -> None:
    lens, table = causal_lens([100, 200], 2), table_for([100, 200])
    with pytest.raises(ValueError, match="programs"):
        balanced_schedule(lens, table, 0)
    with pytest.raises(ValueError, match="context_lens"):
        balanced_schedule(lens.long(), table, 4)
    with pytest.raises(ValueError, match="context_lens"):
        balanced_schedule(lens.reshape(-1), table, 4)
    with pytest.raises(ValueError, match="block_table"):
        balanced_schedule(lens, table[:1], 4)
    with pytest.raises(ValueError, match="block_table"):
        balanced_schedule(lens, table.t().contiguous().t(), 4)
    schedule = balanced_schedule(lens, table, 4)
    with pytest.raises(ValueError, match="out: 6 rows for 2 requests"):
        fill_tail(torch.zeros(6, 10), schedule, 2)
    with pytest.raises(ValueError, match="out"):
        fill_tail(torch.zeros(4, 10, dtype=torch.float64), schedule, 2)
