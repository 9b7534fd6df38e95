"""Conformance with the real vLLM 0.33.0: its decode-path rules, metadata and FP8 cache bytes.

vLLM is imported at module top on purpose: without it this module must fail, not skip.

(a) `dsa_lab.policy.vllm_0_33_0` against vLLM's own `_use_flattening`,
    `_supports_native_decode`, `native_next_n_supported` and
    `_supports_varlen_paged_mqa_logits`, with `current_platform` / `has_deep_gemm`
    patched where vLLM looks them up; the per-step rule against vLLM's real `build()`.
(b) `build_flatten_metadata` / `build_native_metadata` against vLLM's
    `DeepseekV32IndexerMetadataBuilder._prepare_decode_tensors` on a builder made
    without `__init__` (which needs a GPU). The ragged and native paths run here on CPU.
(c) `quantize_fp8` against vLLM's Triton `indexer_k_quant_and_cache_triton`.

The uniform-decode Triton kernel and the quantisation kernel run in one subprocess under
TRITON_INTERPRET=1 with CUDA_VISIBLE_DEVICES="" (vLLM disables Triton on a machine with no
active GPU driver unless the visible-device list is explicitly empty). Triton 3.8's
interpreter casts float32 -> e4m3 wrongly (rounds halves up and drops the carry into the
exponent: 125.9 -> 64), so the worker replaces that one cast with torch's round-to-nearest-
even cast, which is what the GPU's `cvt.rn` does; everything else is vLLM's kernel as shipped.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace
from unittest import mock

import pytest
import torch

import vllm
import vllm.utils.deep_gemm as vllm_deep_gemm
import vllm.v1.attention.backends.mla.indexer as vllm_indexer
from vllm.platforms.interface import DeviceCapability, PlatformEnum
from vllm.platforms.interface import Platform as VllmPlatform
from vllm.v1.attention.backend import CommonAttentionMetadata

from dsa_lab.cache import quantize_fp8
from dsa_lab.metadata import build_flatten_metadata, build_native_metadata
from dsa_lab.policy import (
    MODEL_ARCHS,
    Platform,
    PolicyQuery,
    native_next_n_supported,
    step_uses_native,
    supports_native_decode,
    supports_varlen,
    use_flattening_0_33,
    vllm_0_33_0,
)
from dsa_lab.workload import DecodeBatch, ragged_decode_batch, uniform_batch, with_padding

# name: (vLLM platform enum, device capability or None, our family)
FAKE_PLATFORMS = {
    "h200_sm90": (PlatformEnum.CUDA, (9, 0), "sm90"),
    "b200_sm100": (PlatformEnum.CUDA, (10, 0), "sm100"),
    "gb300_sm103": (PlatformEnum.CUDA, (10, 3), "sm100"),
    "rtx_pro_sm120": (PlatformEnum.CUDA, (12, 0), "sm120"),
    "a100_sm80": (PlatformEnum.CUDA, (8, 0), "other"),
    "mi300x_gfx942": (PlatformEnum.ROCM, (9, 4), "rocm"),
    "mi355x_gfx950": (PlatformEnum.ROCM, (9, 5), "rocm"),
    "cpu_no_gpu": (PlatformEnum.CPU, None, "other"),
}
NEXT_NS = range(1, 17)
ADAPTIVE = (False, True)
DEEP_GEMM = (True, False)
# Full grid of (a): platforms x deep_gemm present x next_n 1..16 x adaptive x model arch.
POLICY_GRID_SIZE = len(FAKE_PLATFORMS) * len(DEEP_GEMM) * len(NEXT_NS) * len(ADAPTIVE) * len(MODEL_ARCHS)
STEP_NEXT_NS = range(1, 7)
# vLLM build() calls in the step-rule test: every (platform, deep_gemm, adaptive, next_n,
# decode_len <= next_n) except SM100 + DeepGEMM (varlen kernel, Triton only).
STEP_GRID_BUILDS = 588
MODEL_TYPES = {
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "DeepseekV41ForCausalLM": "deepseek_v41",
}
POISON = -777


def test_vllm_is_the_pinned_release() -> None:
    assert vllm.__version__ == "0.33.0"


# --- a fake vLLM environment -------------------------------------------------------


def fake_vllm_platform(name: str) -> VllmPlatform:
    """A vLLM `Platform` whose capability is fixed, so vLLM's own family logic runs."""
    enum, capability, _ = FAKE_PLATFORMS[name]

    class FakePlatform(VllmPlatform):
        _enum = enum

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability | None:
            return None if capability is None else DeviceCapability(*capability)

    return FakePlatform()


@contextmanager
def vllm_sees(name: str, deep_gemm: bool) -> Iterator[None]:
    """Patch `current_platform` and `has_deep_gemm` in the modules whose functions read them."""
    plat = fake_vllm_platform(name)
    with (
        mock.patch.object(vllm_indexer, "current_platform", plat),
        mock.patch.object(vllm_deep_gemm, "current_platform", plat),
        mock.patch.object(vllm_indexer, "has_deep_gemm", lambda: deep_gemm),
    ):
        yield


def fake_vllm_config(
    next_n: int, adaptive: bool, arch: str = "DeepseekV32ForCausalLM", fp4: bool = False
) -> SimpleNamespace:
    """The attributes of `VllmConfig` that the indexer's decode-path functions read."""
    spec = None
    if next_n > 1 or adaptive:
        spec = SimpleNamespace(num_speculative_tokens=next_n - 1, enable_adaptive_verification=adaptive)
    return SimpleNamespace(
        speculative_config=spec,
        num_speculative_tokens=next_n - 1,
        model_config=SimpleNamespace(architectures=[arch], hf_config=SimpleNamespace(model_type=MODEL_TYPES[arch])),
        attention_config=SimpleNamespace(resolve_indexer_kv_dtype=lambda default: "mxfp4" if fp4 else default),
    )


def our_platform(name: str, deep_gemm: bool) -> Platform:
    return Platform(FAKE_PLATFORMS[name][2], deep_gemm)


# --- (a) the decode-path rules ----------------------------------------------------------


def test_policy_matches_vllm_functions_on_full_grid() -> None:
    checked = 0
    for name, deep_gemm in itertools.product(FAKE_PLATFORMS, DEEP_GEMM):
        plat = our_platform(name, deep_gemm)
        with vllm_sees(name, deep_gemm):
            vllm_varlen = vllm_indexer._supports_varlen_paged_mqa_logits()
            assert supports_varlen(plat) == vllm_varlen, name
            for next_n, adaptive, arch in itertools.product(NEXT_NS, ADAPTIVE, MODEL_ARCHS):
                where = f"{name} deep_gemm={deep_gemm} next_n={next_n} adaptive={adaptive} {arch}"
                vllm_flatten = vllm_indexer._use_flattening(fake_vllm_config(next_n, adaptive, arch))
                vllm_native = vllm_indexer._supports_native_decode(next_n)
                query = PolicyQuery(plat, next_n, adaptive_verification=adaptive, model_arch=arch)
                decision = vllm_0_33_0(query)
                assert use_flattening_0_33(query) == vllm_flatten, where
                assert decision.use_flattening == vllm_flatten, where
                assert supports_native_decode(plat, next_n) == vllm_native, where
                assert native_next_n_supported(plat, next_n) == vllm_deep_gemm.native_next_n_supported(next_n), where
                expected_path = "varlen" if vllm_varlen else "flatten" if vllm_flatten else "native"
                assert decision.path == expected_path, where
                checked += 1
    assert checked == POLICY_GRID_SIZE == 1536


def test_fp4_acceptance_matches_dsa_indexer_uses_fp4() -> None:
    """MXFP4 is accepted exactly where vLLM's startup check accepts it (ROCm: CDNA4 + aiter assumed)."""
    fake_rocm = ModuleType("vllm.platforms.rocm")
    fake_rocm.get_cdna_version = lambda: 4  # type: ignore[attr-defined]
    from vllm._aiter_ops import rocm_aiter_ops

    with mock.patch.dict(sys.modules, {"vllm.platforms.rocm": fake_rocm}), mock.patch.object(
        rocm_aiter_ops, "is_enabled", classmethod(lambda cls: True)
    ):
        accepted_count = 0
        for name, arch in itertools.product(FAKE_PLATFORMS, MODEL_ARCHS):
            with vllm_sees(name, True):
                try:
                    accepted = vllm_indexer.dsa_indexer_uses_fp4(fake_vllm_config(2, False, arch, fp4=True))
                except ValueError:
                    accepted = False
            decision = vllm_0_33_0(PolicyQuery(our_platform(name, True), 2, fp4_cache=True, model_arch=arch))
            assert (decision.path != "rejected") == accepted, f"{name} {arch}"
            accepted_count += accepted
    assert accepted_count == 2 * len(MODEL_ARCHS) + 2 * 2  # SM100 / SM103 any model; two ROCm GPUs x V4, V4.1


def run_vllm_build(name: str, deep_gemm: bool, next_n: int, adaptive: bool, decode_len: int):
    """vLLM's real `build()` for three requests decoding `decode_len` rows plus one
    CUDA-graph padding request (seq_len 0, no tokens), on a builder set up as `__init__` would."""
    seq_lens = torch.tensor([50, 70, 90, 0], dtype=torch.int32)
    query_lens = torch.tensor([decode_len] * 3 + [0], dtype=torch.int32)
    query_start_loc = torch.zeros(5, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(query_lens, 0)
    tokens = int(query_lens.sum())
    capacity = 256

    def no_deep_gemm_schedule(lens, block, sms, indices=None):  # DeepGEMM's planner needs a GPU
        return torch.zeros(sms + 1, 2, dtype=torch.int32)

    with vllm_sees(name, deep_gemm), mock.patch.object(vllm_indexer, "get_paged_mqa_logits_metadata", no_deep_gemm_schedule):
        config = fake_vllm_config(next_n, adaptive)
        builder = object.__new__(vllm_indexer.DeepseekV32IndexerMetadataBuilder)
        builder.vllm_config = config
        builder.compress_ratio, builder.use_pcp, builder.dcp_world_size = 1, False, 1
        builder.num_speculative_tokens, builder.decode_threshold = next_n - 1, next_n
        builder.use_flattening = vllm_indexer._use_flattening(config)
        builder.supports_varlen = vllm_indexer._supports_varlen_paged_mqa_logits()
        builder.num_sms, builder.kv_cache_spec = 132, SimpleNamespace(num_states=64)
        builder.scheduler_metadata_buffer = torch.zeros(133, 2, dtype=torch.int32)
        for buffer in ("decode_lens_buffer", "per_req_decode_lens_buffer", "decode_seq_lens_buffer"):
            setattr(builder, buffer, torch.zeros(capacity, dtype=torch.int32))
        builder.arange_buffer = torch.arange(capacity, dtype=torch.int32)
        builder.offsets_buffer = torch.arange(next_n, dtype=torch.int32)
        builder.expanded_block_table_buffer = torch.zeros(capacity, 4, dtype=torch.int32)
        common = CommonAttentionMetadata(
            query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc.clone(),
            seq_lens=seq_lens, num_reqs=4, num_actual_tokens=tokens, max_query_len=decode_len,
            max_seq_len=90, block_table_tensor=torch.arange(16, dtype=torch.int32).view(4, 4),
            slot_mapping=torch.zeros(tokens, dtype=torch.int64),
        )
        return builder.build(0, common)


def test_step_rule_matches_vllm_build() -> None:
    """`step_uses_native` against the native/flatten choice of vLLM's own `build()`.

    SM100 + DeepGEMM takes the varlen Triton kernel, which cannot run in-process on a
    CPU; there we only check that we never call it native (its flags are checked above).
    """
    builds = 0
    for name, deep_gemm, adaptive in itertools.product(FAKE_PLATFORMS, DEEP_GEMM, ADAPTIVE):
        plat = our_platform(name, deep_gemm)
        for next_n in STEP_NEXT_NS:
            query = PolicyQuery(plat, next_n, adaptive_verification=adaptive)
            for decode_len in range(1, next_n + 1):
                ours = step_uses_native(query, decode_len)
                if supports_varlen(plat):
                    assert not ours
                    continue
                meta = run_vllm_build(name, deep_gemm, next_n, adaptive, decode_len)
                assert meta.num_decodes == 4 and meta.num_prefills == 0
                # native keeps one row per request ([B, max_decode_len]); flatten one per token.
                vllm_native = tuple(meta.decode.seq_lens.shape) == (4, decode_len)
                if not vllm_native:
                    assert tuple(meta.decode.seq_lens.shape) == (3 * decode_len, 1)
                assert ours == vllm_native, f"{name} dg={deep_gemm} next_n={next_n} adaptive={adaptive} m={decode_len}"
                builds += 1
    steps_per_combo = sum(STEP_NEXT_NS)  # decode_len 1..next_n for each next_n
    varlen_combos = sum(FAKE_PLATFORMS[n][2] == "sm100" for n in FAKE_PLATFORMS) * len(ADAPTIVE)
    all_combos = len(FAKE_PLATFORMS) * len(DEEP_GEMM) * len(ADAPTIVE)
    assert builds == (all_combos - varlen_combos) * steps_per_combo == STEP_GRID_BUILDS


def test_native_builder_sends_ragged_decodes_to_prefill() -> None:
    """Documented vLLM 0.33 behaviour, pinned: a builder that may go native (SM90,
    next_n = 4) asks `split_decodes_and_prefills` for uniform decodes, so in a step with
    decode lens (4, 2, 4) only the first request stays a decode (the other two, the 4-row
    one included, take the prefill path); a flattening builder (adaptive verification)
    keeps all three as decodes."""
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    query_start_loc = torch.tensor([0, 4, 6, 10], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc.clone(),
        seq_lens=torch.tensor([90, 60, 70], dtype=torch.int32), num_reqs=3, num_actual_tokens=10,
        max_query_len=4, max_seq_len=90, block_table_tensor=torch.zeros(3, 2, dtype=torch.int32),
        slot_mapping=torch.zeros(10, dtype=torch.int64),
    )
    for adaptive, expected in ((False, (1, 2, 4, 6)), (True, (3, 0, 10, 0))):
        with vllm_sees("h200_sm90", True):
            flattening = vllm_indexer._use_flattening(fake_vllm_config(4, adaptive))
            require_uniform = not (flattening or vllm_indexer._supports_varlen_paged_mqa_logits())
        query = PolicyQuery(our_platform("h200_sm90", True), 4, adaptive_verification=adaptive)
        assert require_uniform == (vllm_0_33_0(query).path == "native")
        # the arguments DeepseekV32IndexerMetadataBuilder.build() passes
        assert split_decodes_and_prefills(common, 4, require_uniform, True) == expected


# --- (b) decode metadata ------------------------------------------------------------------


def vllm_builder(next_n: int, adaptive: bool, table_width: int, capacity: int = 512):
    """A `DeepseekV32IndexerMetadataBuilder` holding only what `_prepare_decode_tensors`
    reads; its buffers are poisoned so that unwritten entries show."""
    builder = object.__new__(vllm_indexer.DeepseekV32IndexerMetadataBuilder)
    builder.vllm_config = fake_vllm_config(next_n, adaptive)
    builder.supports_varlen = False
    builder.decode_seq_lens_buffer = torch.full((capacity,), POISON, dtype=torch.int32)
    builder.expanded_block_table_buffer = torch.full((capacity, table_width), POISON, dtype=torch.int32)
    builder.decode_lens_buffer = torch.full((capacity,), POISON, dtype=torch.int32)
    builder.arange_buffer = torch.arange(capacity, dtype=torch.int32)
    builder.offsets_buffer = torch.arange(next_n, dtype=torch.int32)
    return builder


def vllm_prepare(batch: DecodeBatch, table: torch.Tensor, use_native: bool, adaptive: bool):
    """vLLM's (seq_lens, block_table, decode_lens, batch_size, requires_padding) for `batch`."""
    builder = vllm_builder(batch.next_n, adaptive, table.shape[1])
    decode_lens = torch.tensor(batch.decode_lens, dtype=torch.int32)
    start = torch.cumsum(decode_lens, 0) - decode_lens
    return builder._prepare_decode_tensors(
        seq_lens=torch.tensor(batch.seq_lens, dtype=torch.int32),
        block_table=table,
        decode_lens=decode_lens,
        decode_lens_cpu=decode_lens.clone(),
        query_start_loc=start,
        num_decodes=batch.batch_size,
        num_decode_tokens=batch.num_decode_tokens,
        use_native=use_native,
        next_n=batch.next_n,
        max_decode_len=batch.max_decode_len,
    )


def random_table(batch: DecodeBatch, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 10_000, (batch.batch_size, batch.max_blocks_per_request + 1), generator=gen, dtype=torch.int32)


def random_batch(seed: int) -> DecodeBatch:
    """Ragged decode lens, CUDA-graph padding requests (seq_len 0, no tokens) and spare tokens."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    next_n = draw(1, 8)
    batch = ragged_decode_batch(draw(1, 6), 1, 400, next_n, seed=seed)
    return with_padding(batch, draw(0, 2), draw(0, 5))


def uniform_kernel_taken(batch: DecodeBatch, adaptive: bool) -> bool:
    """vLLM's condition for its uniform-decode Triton kernel (which needs Triton)."""
    return (
        (batch.batch_size == 1 or not adaptive)
        and len(set(batch.decode_lens)) == 1
        and batch.batch_size * batch.max_decode_len == batch.num_decode_tokens
    )


def check_flatten_against_vllm(batch: DecodeBatch, table: torch.Tensor, vllm_out) -> None:
    seq_lens, block_table, decode_lens, batch_size, requires_padding = vllm_out
    meta = build_flatten_metadata(batch, table)
    (launch,) = meta.launches
    real = batch.num_real_tokens
    assert batch_size == launch.batch_size == batch.num_decode_tokens
    assert torch.equal(seq_lens, launch.context_lens[:, 0])
    assert torch.equal(meta.token_context_lens(), seq_lens)
    assert torch.equal(block_table[:real], launch.block_table[:real])
    # For CUDA-graph padding tokens vLLM defines (zeroes) only column 0 of the row.
    assert torch.equal(block_table[real:, 0], launch.block_table[real:, 0])
    assert torch.equal(decode_lens, torch.ones(batch.num_decode_tokens, dtype=torch.int32))
    assert requires_padding is False


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
            uniform.append((*(t.clone() if isinstance(t, torch.Tensor) else t for t in out), len(kernel_calls) - before))
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
