"""Conformance with the real vLLM 0.33.0 (b): decode metadata.

`build_flatten_metadata` / `build_native_metadata` against vLLM's
`DeepseekV32IndexerMetadataBuilder._prepare_decode_tensors` on a builder made without `__init__` (which
needs a GPU). The ragged and native paths run here on CPU.

vLLM is imported at module top on purpose (here and in tests/vllm_support.py): without it this module must
fail, not skip.
"""

from __future__ import annotations

import pytest
import torch
from vllm_support import check_flatten_against_vllm, random_table, uniform_kernel_taken, vllm_prepare

from dsa_lab.batch.metadata import build_flatten_metadata, build_native_metadata
from dsa_lab.batch.workload import DecodeBatch, ragged_decode_batch, with_padding

# --- (b) decode metadata ------------------------------------------------------------------


def random_batch(seed: int) -> DecodeBatch:
    """Ragged decode lens, CUDA-graph padding requests (seq_len 0, no tokens) and spare tokens."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    next_n = draw(1, 8)
    batch = ragged_decode_batch(draw(1, 6), 1, 400, next_n, seed=seed)
    return with_padding(batch, draw(0, 2), draw(0, 5))


@pytest.mark.parametrize("seed", range(12))
def test_flatten_metadata_matches_vllm_ragged_path(seed: int) -> None:
    batch = random_batch(seed)
    table = random_table(batch, seed)
    adaptive = True  # with several requests, adaptive verification always takes the ragged path
    if uniform_kernel_taken(batch, adaptive):
        batch = with_padding(batch, 0, 1)  # one spare token forces the ragged path
    check_flatten_against_vllm(batch, table, vllm_prepare(batch, table, use_native=False, adaptive=adaptive))


@pytest.mark.parametrize("seed", range(12))
def test_native_metadata_matches_vllm(seed: int) -> None:
    """Kernel-row context lens `[B, max_decode_len]`, table, decode lens and padding flag.

    Per-token contexts differ for ragged requests by design: vLLM left-aligns their
    tokens in the rows (pack_seq_triton), we right-align them (docs/ARCHITECTURE.md).
    """
    batch = random_batch(seed)
    table = random_table(batch, seed)
    prepared = vllm_prepare(batch, table, use_native=True, adaptive=False)
    seq_lens, block_table, decode_lens, batch_size, requires_padding = prepared
    (launch,) = build_native_metadata(batch, table).launches
    assert batch_size == launch.batch_size == batch.batch_size
    if batch.next_n == 1:  # vLLM keeps the request's own 1-D seq_lens
        assert torch.equal(seq_lens, launch.context_lens[:, 0])
    else:
        assert torch.equal(seq_lens, launch.context_lens)
    assert block_table is table and torch.equal(launch.block_table, table)
    assert decode_lens.tolist() == list(batch.decode_lens)
    assert requires_padding == bool((launch.token_rows < 0).any())


def test_vllm_ragged_path_leaves_negative_context_for_padding_request_with_tokens() -> None:
    """Documented vLLM 0.33 behaviour, pinned: a request with seq_len 0 that owns
    decode_len > 1 tokens gets contexts 1 - d .. 0 on the ragged flatten path, which,
    unlike the native path and the uniform kernel, does not clamp at 0 (the kernels read
    them as uint32). vLLM's model runner gives padding requests no tokens, so this needs
    a caller that does; our builders clamp."""
    batch = DecodeBatch((120, 0, 64), (3, 3, 2), 3, num_decode_tokens=8)
    table = random_table(batch, 0)
    seq_lens, *_ = vllm_prepare(batch, table, use_native=False, adaptive=True)
    assert seq_lens.tolist() == [118, 119, 120, -2, -1, 0, 63, 64]
    assert build_flatten_metadata(batch, table).token_context_lens().tolist() == [118, 119, 120, 0, 0, 0, 63, 64]
    native, *_ = vllm_prepare(batch, table, use_native=True, adaptive=False)
    assert native[1].tolist() == [0, 0, 0]  # the native path clamps
