"""Conformance with the real vLLM 0.33.0 (c): its Triton kernels, in a TRITON_INTERPRET subprocess.

`quantize_fp8` against vLLM's Triton `indexer_k_quant_and_cache_triton`, and vLLM's uniform-decode Triton
kernel against our flatten metadata and vLLM's own ragged path.

The uniform-decode Triton kernel and the quantisation kernel run in one subprocess under
TRITON_INTERPRET=1 with CUDA_VISIBLE_DEVICES="" (vLLM disables Triton on a machine with no
active GPU driver unless the visible-device list is explicitly empty). Triton 3.8's
interpreter casts float32 -> e4m3 wrongly (rounds halves up and drops the carry into the
exponent: 125.9 -> 64), so the worker replaces that one cast with torch's round-to-nearest-
even cast, which is what the GPU's `cvt.rn` does; everything else is vLLM's kernel as shipped.
Run as a script (`python tests/test_conformance_vllm_kernels.py IN OUT`) this file is that worker.

vLLM is imported at module top on purpose (here and in tests/vllm_support.py): without it this module must
fail, not skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from unittest import mock

import pytest
import torch
import vllm.v1.attention.backends.mla.indexer as vllm_indexer
from vllm_support import check_flatten_against_vllm, random_table, uniform_kernel_taken, vllm_prepare

from dsa_lab.batch.cache import quantize_fp8
from dsa_lab.batch.workload import DecodeBatch, uniform_batch, with_padding

# --- the Triton kernels, in a TRITON_INTERPRET subprocess ---------------------------------

UNIFORM_CASES = (
    uniform_batch(1, 100, 3),
    uniform_batch(4, 257, 2),
    DecodeBatch((300, 70, 65, 129), (4, 4, 4, 4), 4),
    DecodeBatch((10, 200, 1), (2, 2, 1), 2),  # one request decodes 1 row: not uniform, ragged path
    DecodeBatch((0, 200, 5), (2, 2, 2), 2),  # a seq_len-0 request owning tokens: the kernel clamps
    uniform_batch(3, 64, 1),
)


def _interpret_worker(in_path: str, out_path: str) -> None:
    """Runs vLLM's uniform-decode and K-quantisation Triton kernels (see the module docstring)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse

    original_cast = interpreter._convert_float
    casts = []

    def rtne_e4m3_cast(data, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.float8e4nv:
            casts.append(data.size)
            values = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
            return values.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(data.shape)
        return original_cast(data, input_dtype, output_dtype, rounding_mode)

    inputs = torch.load(in_path)
    kernel_calls = []
    real_kernel = vllm_indexer._PREPARE_UNIFORM_DECODE_KERNEL

    def counting_kernel(*args, **kwargs):
        kernel_calls.append(1)
        return real_kernel(*args, **kwargs)

    uniform = []
    with mock.patch.object(vllm_indexer, "_PREPARE_UNIFORM_DECODE_KERNEL", counting_kernel):
        for batch, table in zip(UNIFORM_CASES, inputs["tables"]):
            before = len(kernel_calls)
            out = vllm_prepare(batch, table, use_native=False, adaptive=False)
            uniform.append(
                (*(t.clone() if isinstance(t, torch.Tensor) else t for t in out), len(kernel_calls) - before)
            )
    quant = {}
    with mock.patch.object(interpreter, "_convert_float", rtne_e4m3_cast):
        k = inputs["k"]
        tokens, dim = k.shape
        for fmt in ("fp8", "ue8m0"):
            cache = torch.full((tokens, 1, dim + 4), 0xAB, dtype=torch.uint8)  # block_size 1: NORMAL layout
            slots = inputs["slots"]
            rocm_aiter_mla_sparse.indexer_k_quant_and_cache_triton(k, cache, slots, dim, fmt)
            quant[fmt] = cache.view(tokens, dim + 4)[slots].clone()
    fp8_dtype = str(rocm_aiter_mla_sparse.FP8_DTYPE)
    torch.save(dict(uniform=uniform, quant=quant, casts=sum(casts), fp8_dtype=fp8_dtype), out_path)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    tables = [random_table(batch, i) for i, batch in enumerate(UNIFORM_CASES)]
    gen = torch.Generator().manual_seed(7)
    k = (torch.randn(48, 128, generator=gen) * torch.rand(48, 1, generator=gen).add(0.01) * 20).to(torch.bfloat16)
    inputs = dict(tables=tables, k=k, slots=torch.randperm(48, generator=gen))
    with tempfile.TemporaryDirectory() as tmp:
        in_path, out_path = os.path.join(tmp, "in.pt"), os.path.join(tmp, "out.pt")
        torch.save(inputs, in_path)
        env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
        done = subprocess.run(
            [sys.executable, __file__, in_path, out_path], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return {**torch.load(out_path), **inputs}


def test_uniform_kernel_matches_flatten_metadata(interpreted: dict) -> None:
    for batch, table, out in zip(UNIFORM_CASES, interpreted["tables"], interpreted["uniform"]):
        *prepared, kernel_calls = out
        assert kernel_calls == (1 if uniform_kernel_taken(batch, adaptive=False) else 0), batch
        check_flatten_against_vllm(batch, table, prepared)


def test_uniform_kernel_agrees_with_ragged_path(interpreted: dict) -> None:
    """vLLM's two flatten paths agree on uniform batches, except that only the kernel
    clamps the contexts of a seq_len-0 request that owns tokens."""
    compared = 0
    for batch, table, out in zip(UNIFORM_CASES, interpreted["tables"], interpreted["uniform"]):
        kernel_seq, kernel_table, kernel_lens, *_, kernel_calls = out
        if not kernel_calls:
            continue
        # One spare token sends the same batch down the ragged path; compare its real tokens.
        ragged = vllm_prepare(with_padding(batch, 0, 1), table, use_native=False, adaptive=False)
        tokens = batch.num_decode_tokens
        ragged_seq, ragged_table, ragged_lens = (t[:tokens] for t in ragged[:3])
        assert torch.equal(kernel_seq, ragged_seq.clamp(min=0))
        assert torch.equal(kernel_table, ragged_table) and torch.equal(kernel_lens, ragged_lens)
        compared += 1
        if 0 in batch.seq_lens and batch.decode_lens[batch.seq_lens.index(0)] > 1:
            assert int(ragged_seq.min()) < 0 <= int(kernel_seq.min())
    assert compared == 5


@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_cache_bytes_match_vllm_quantisation(interpreted: dict, ue8m0: bool) -> None:
    """Per token: D e4m3 bytes then a float32 scale, bit for bit (block_size 1 layout)."""
    assert interpreted["fp8_dtype"] == "torch.float8_e4m3fn"  # what vLLM picks with no GPU platform
    assert interpreted["casts"] > 0  # the kernel's e4m3 cast went through the RTNE replacement
    got = interpreted["quant"]["ue8m0" if ue8m0 else "fp8"]
    k = interpreted["k"]
    values, scale = quantize_fp8(k, ue8m0=ue8m0)
    dim = k.shape[1]
    assert torch.equal(got[:, dim:].contiguous().view(torch.float32)[:, 0], scale)
    assert torch.equal(got[:, :dim], values.view(torch.uint8))


if __name__ == "__main__":
    _interpret_worker(sys.argv[1], sys.argv[2])
