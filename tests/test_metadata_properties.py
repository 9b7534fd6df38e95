"""Properties of the native / flatten / atom metadata on random batches (hypothesis).

Whatever the strategy, every real query token must see exactly its causal context and
appear in exactly one kernel row; and the end-to-end step must not depend on the strategy.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dsa_lab.batch.metadata import (
    DecodeMetadata,
    build_atom_metadata,
    build_flatten_metadata,
    build_metadata,
    build_native_metadata,
    plan_atoms,
)
from dsa_lab.batch.workload import DecodeBatch, random_inputs
from dsa_lab.decode import run_decode
from dsa_lab.topk import compare_selections

SETTINGS = settings(max_examples=50, deadline=None)
ATOM_SIZE_SETS = ((1, 2, 4), (1,), (2,), (4, 8), (1, 2), (3,), (2, 3, 5))


@st.composite
def decode_batches(draw, max_requests: int = 5, max_len: int = 300, max_next_n: int = 8) -> DecodeBatch:
    """Ragged decode lens, CUDA-graph padding requests (seq_len 0, no tokens) anywhere, spare tokens."""
    next_n = draw(st.integers(1, max_next_n))
    requests = []
    for _ in range(draw(st.integers(1, max_requests))):
        decode_len = draw(st.integers(1, next_n))
        requests.append((draw(st.integers(decode_len, max_len)), decode_len))
    for _ in range(draw(st.integers(0, 2))):
        requests.insert(draw(st.integers(0, len(requests))), (0, 0))
    seq_lens, decode_lens = zip(*requests)
    spare = draw(st.integers(0, 4))
    return DecodeBatch(seq_lens, decode_lens, next_n, num_decode_tokens=sum(decode_lens) + spare)


def block_table_for(batch: DecodeBatch, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(
        0, 5000, (batch.batch_size, batch.max_blocks_per_request + 1), generator=gen, dtype=torch.int32
    )


def all_metadata(batch: DecodeBatch, table: torch.Tensor, sizes: tuple[int, ...]) -> dict[str, DecodeMetadata]:
    return {
        "native": build_native_metadata(batch, table),
        "flatten": build_flatten_metadata(batch, table),
        "atom": build_atom_metadata(batch, table, plan_atoms(batch.max_decode_len, sizes)),
    }


@SETTINGS
@given(batch=decode_batches(), sizes=st.sampled_from(ATOM_SIZE_SETS), seed=st.integers(0, 2**16))
def test_strategies_agree_on_every_real_token(batch: DecodeBatch, sizes: tuple[int, ...], seed: int) -> None:
    table = block_table_for(batch, seed)
    expected = torch.tensor(batch.token_context_lens(), dtype=torch.int32)
    real = batch.num_real_tokens
    for name, meta in all_metadata(batch, table, sizes).items():
        contexts = meta.token_context_lens()
        assert contexts.shape == (batch.num_decode_tokens,), name
        assert torch.equal(contexts[:real], expected), name
        assert (contexts[real:] == 0).all(), name  # CUDA-graph padding tokens see nothing
        rows = torch.cat([launch.token_rows.reshape(-1) for launch in meta.launches])
        counts = torch.bincount(rows[rows >= 0], minlength=batch.num_decode_tokens)
        assert (counts[:real] == 1).all(), f"{name}: a real token is missing or duplicated"
        for launch in meta.launches:  # each kernel row's context is its token's context
            held = launch.token_rows >= 0
            assert torch.equal(launch.context_lens[held], contexts[launch.token_rows[held]]), name


@SETTINGS
@given(batch=decode_batches(), seed=st.integers(0, 2**16))
def test_flatten_rows_copy_the_owner_block_table_row(batch: DecodeBatch, seed: int) -> None:
    table = block_table_for(batch, seed)
    (launch,) = build_flatten_metadata(batch, table).launches
    owners = torch.tensor(batch.token_requests(), dtype=torch.long)
    real = batch.num_real_tokens
    assert launch.batch_size == batch.num_decode_tokens and launch.next_n == 1
    assert torch.equal(launch.block_table[:real], table[owners])
    assert (launch.block_table[real:] == 0).all()


@SETTINGS
@given(next_n=st.integers(1, 16), sizes=st.sets(st.integers(1, 8), min_size=1, max_size=4), padding=st.booleans())
def test_plan_atoms_covers_rows_exactly_with_allowed_sizes(next_n: int, sizes: set[int], padding: bool) -> None:
    try:
        pieces = plan_atoms(next_n, sorted(sizes), allow_padding=padding)
    except ValueError as err:  # only when no exact sum exists and padding is off
        assert not padding and "next_n" in str(err)
        return
    assert all(p.size in sizes for p in pieces)
    covered = [r for p in pieces for r in range(p.offset, p.offset + p.size) if 0 <= r < next_n]
    assert sorted(covered) == list(range(next_n))
    assert pieces[0].offset <= 0 and all(a.offset + a.size == b.offset for a, b in zip(pieces, pieces[1:]))
    assert pieces[-1].offset + pieces[-1].size == next_n
    if not padding:
        assert pieces[0].offset == 0


@settings(max_examples=8, deadline=None)
@given(batch=decode_batches(max_requests=3, max_len=160, max_next_n=6), seed=st.integers(0, 2**16))
@example(batch=DecodeBatch(seq_lens=(2,), decode_lens=(2,), next_n=2), seed=0)  # differed by 8e-6 on AVX-512
def test_decode_is_independent_of_strategy(batch: DecodeBatch, seed: int) -> None:
    """The central invariant, with the reference backend: same logits (bit for bit: the
    reference is batch-invariant by construction), same top-k."""
    small = DecodeBatch(
        batch.seq_lens,
        batch.decode_lens,
        batch.next_n,
        num_heads=32,
        head_dim=64,
        num_decode_tokens=batch.num_decode_tokens,
    )
    inputs = random_inputs(small, seed=seed)
    results = {s: run_decode(inputs, s, "reference", topk=16) for s in ("native", "flatten", "atom")}
    base = results["native"]
    valid = torch.isfinite(base.logits)
    assert int(valid.sum()) == sum(small.token_context_lens())
    for name in ("flatten", "atom"):
        other = results[name]
        assert torch.equal(torch.isfinite(other.logits), valid), name
        assert torch.equal(other.logits[valid], base.logits[valid]), name
        assert compare_selections(base.indices, other.indices, base.logits).equal, name


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="next_n"):
        DecodeBatch((10,), (1,), 0)
    with pytest.raises(ValueError, match=r"seq_lens\[1\]"):
        DecodeBatch((10, -3), (1, 0), 2)
    with pytest.raises(ValueError, match=r"decode_lens\[0\]"):
        DecodeBatch((10,), (-1,), 2)
    batch = DecodeBatch((200, 64), (2, 1), 2)
    too_small = torch.zeros(2, 3, dtype=torch.int32)  # 200 tokens need 4 blocks of 64
    for builder in (build_native_metadata, build_flatten_metadata):
        with pytest.raises(ValueError, match="block_table"):
            builder(batch, too_small)
    with pytest.raises(ValueError, match="strategy"):
        build_metadata("interleave", batch, torch.zeros(2, 4, dtype=torch.int32), (1, 2, 4))
