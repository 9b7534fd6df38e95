"""Conformance with the real vLLM 0.33.0 (a): its decode-path rules.

`dsa_lab.policy.vllm.vllm_0_33_0` against vLLM itself on the whole grid (GPU x DeepGEMM x next_n x adaptive
verification x model architecture x MXFP4 cache): for each cell vLLM wires, builds and starts as
tests/vllm_support.py describes, and what survives gives the builder class, its `use_flattening` and
`supports_varlen`, and the ROCm MXFP4 builder's `native_next_n`. The per-step rule runs against the real
`build()` of both builders.

vLLM is imported at module top on purpose (here and in tests/vllm_support.py): without it this module must
fail, not skip.
"""

from __future__ import annotations

import collections
import itertools

import torch
import vllm
import vllm.utils.deep_gemm as vllm_deep_gemm
import vllm.v1.attention.backends.mla.indexer as vllm_indexer
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm_support import (
    ADAPTIVE,
    DEEP_GEMM,
    FAKE_PLATFORMS,
    FP4,
    NEXT_NS,
    STEP_CASES,
    STEP_NEXT_NS,
    fake_vllm_config,
    our_platform,
    vllm_build,
    vllm_sees,
    vllm_startup,
    vllm_step_is_native,
)

from dsa_lab.policy.query import MODEL_ARCHS, PolicyQuery
from dsa_lab.policy.steps import step_uses_native
from dsa_lab.policy.vllm import (
    adaptive_rejection_0_33,
    fp4_rejection_0_33,
    indexer_backend_takes_device_query_lens,
    indexer_builder,
    native_next_n_supported,
    supports_native_decode,
    supports_varlen,
    use_flattening_0_33,
    vllm_0_33_0,
)

# Full grid of (a): GPUs x deep_gemm present x next_n 1..16 x adaptive x model arch x MXFP4 cache.
POLICY_GRID_SIZE = len(FAKE_PLATFORMS) * len(DEEP_GEMM) * len(NEXT_NS) * len(ADAPTIVE) * len(MODEL_ARCHS) * len(FP4)


def test_vllm_is_the_pinned_release() -> None:
    assert vllm.__version__ == "0.33.0"


# --- (a) the decode-path rules ----------------------------------------------------------


def test_policy_matches_vllm_on_full_grid() -> None:
    """Path, builder, `use_flattening` and the reason's kind, on every cell of the grid."""
    checked, paths = 0, collections.Counter()
    for name, deep_gemm in itertools.product(FAKE_PLATFORMS, DEEP_GEMM):
        plat = our_platform(name, deep_gemm)
        with vllm_sees(name, deep_gemm):
            assert supports_varlen(plat) == vllm_indexer._supports_varlen_paged_mqa_logits(), name
        for next_n, adaptive, arch, fp4 in itertools.product(NEXT_NS, ADAPTIVE, MODEL_ARCHS, FP4):
            where = f"{name} deep_gemm={deep_gemm} next_n={next_n} adaptive={adaptive} {arch} fp4={fp4}"
            query = PolicyQuery(plat, next_n, fp4, adaptive, arch)
            with vllm_sees(name, deep_gemm):
                config = fake_vllm_config(next_n, adaptive, arch, fp4)
                assert use_flattening_0_33(query) == vllm_indexer._use_flattening(config), where
                assert supports_native_decode(plat, next_n) == vllm_indexer._supports_native_decode(next_n), where
                assert native_next_n_supported(plat, next_n) == vllm_deep_gemm.native_next_n_supported(next_n), where
                try:
                    vllm_indexer.dsa_indexer_uses_fp4(config)
                    fp4_refused = False
                except ValueError:
                    fp4_refused = True
            assert (fp4_rejection_0_33(query) is not None) == fp4_refused, where
            vllm = vllm_startup(name, deep_gemm, next_n, adaptive, arch, fp4)
            decision = vllm_0_33_0(query)
            assert decision.path == vllm.path, f"{where}: ours {decision.path} ({decision.reason}), vLLM {vllm.error}"
            if vllm.error is None:
                assert decision.builder == indexer_builder(query) == vllm.builder_name, where
                assert decision.use_flattening == vllm.builder.use_flattening, where
                assert indexer_backend_takes_device_query_lens(query) == vllm.takes_device_query_lens, where
            else:
                vllm_adaptive_refusal = vllm.error.startswith("Adaptive verification")
                assert (adaptive_rejection_0_33(query) is not None and not fp4_refused) == vllm_adaptive_refusal, where
                assert decision.reason.endswith("rejected at startup"), where
            checked += 1
            paths[decision.path, decision.builder] += 1
    assert checked == POLICY_GRID_SIZE == 3456
    # every kind of answer occurs: native / flatten / varlen / rejected, and the ROCm MXFP4 builder
    assert set(paths) == {
        ("native", "dense"),
        ("flatten", "dense"),
        ("varlen", "dense"),
        ("rejected", "dense"),
        ("native", "rocm_mxfp4"),
        ("flatten", "rocm_mxfp4"),
    }


def test_rejection_reasons_name_what_vllm_names() -> None:
    """Each refusal says the same thing vLLM's error says, in vLLM's order of checks."""
    cases = [  # (GPU, arch, fp4, adaptive, word in vLLM's error, word in ours)
        ("h200_sm90", "DeepseekV4ForCausalLM", True, False, "sm_10x", "SM10x"),
        ("mi355x_gfx950_aiter", "DeepseekV32ForCausalLM", True, False, "DeepSeek-V4", "DeepSeek-V4"),
        ("mi300x_gfx942_aiter", "DeepseekV4ForCausalLM", True, False, "CDNA4", "CDNA4"),
        ("mi355x_gfx950", "DeepseekV41ForCausalLM", True, False, "aiter", "aiter"),
        (
            "rtx_pro_sm120",
            "DeepseekV32ForCausalLM",
            False,
            True,
            "DeepseekV32IndexerBackend",
            "DeepseekV32IndexerBackend",
        ),
        ("cpu_no_gpu", "DeepseekV41ForCausalLM", False, True, "DeepseekV41IndexerBackend", "DeepseekV41IndexerBackend"),
        ("mi300x_gfx942_aiter", "DeepseekV32ForCausalLM", False, True, "DeepseekV32IndexerBackend", "adaptive"),
    ]
    for name, arch, fp4, adaptive, theirs, ours in cases:
        vllm = vllm_startup(name, True, 2, adaptive, arch, fp4)
        decision = vllm_0_33_0(PolicyQuery(our_platform(name, True), 2, fp4, adaptive, arch))
        assert vllm.error is not None and theirs in vllm.error, (name, arch, vllm.error)
        assert decision.path == "rejected" and ours in decision.reason, (name, arch, decision.reason)


def run_vllm_build(
    name: str, deep_gemm: bool, next_n: int, adaptive: bool, arch: str, fp4: bool, decode_lens: tuple[int, ...]
):
    """vLLM's real `build()` of the builder it wires, for one decode step of requests decoding
    `decode_lens` rows (`vllm_step_metadata`)."""
    startup = vllm_startup(name, deep_gemm, next_n, adaptive, arch, fp4)
    assert startup.error is None, startup.error
    return vllm_build(startup, name, deep_gemm, decode_lens)


STEP_GRID_BUILDS = 808


def test_step_rule_matches_vllm_build() -> None:
    """`step_uses_native` against the native/flatten choice of vLLM's own `build()`, for
    uniform steps of 1..next_n rows and a ragged one (one request a row short).

    SM100 + DeepGEMM takes the varlen Triton kernel, which cannot run in-process on a
    CPU; there we only check that we never call it native (its flags are checked above).
    Configurations vLLM refuses at startup have no step. A native dense builder sends a
    ragged step's odd requests to the prefill path (pinned below), so ragged steps run
    where vLLM keeps every request a decode: flattening builders and the ROCm MXFP4 one.
    """
    builds, outcomes = 0, set()
    for (name, deep_gemm, arch, fp4), adaptive, next_n in itertools.product(STEP_CASES, ADAPTIVE, STEP_NEXT_NS):
        query = PolicyQuery(our_platform(name, deep_gemm), next_n, fp4, adaptive, arch)
        if vllm_0_33_0(query).path == "rejected":
            assert vllm_startup(name, deep_gemm, next_n, adaptive, arch, fp4).error is not None
            continue
        keeps_ragged_decodes = vllm_0_33_0(query).use_flattening
        for decode_len, uniform in itertools.product(range(1, next_n + 1), (True, False)):
            if not uniform and (decode_len == 1 or not keeps_ragged_decodes):
                continue
            ours = step_uses_native(query, decode_len, uniform)
            if supports_varlen(query.platform):
                assert not ours
                continue
            decode_lens = (decode_len,) * 3 if uniform else (decode_len, decode_len - 1, decode_len)
            if vllm_0_33_0(query).builder == "dense":  # a padding request: native and flatten differ in shape
                decode_lens += (0,)
            meta = run_vllm_build(name, deep_gemm, next_n, adaptive, arch, fp4, decode_lens)
            where = f"{name} dg={deep_gemm} {arch} fp4={fp4} next_n={next_n} adaptive={adaptive} lens={decode_lens}"
            assert meta.num_decodes == len(decode_lens) and meta.num_prefills == 0, where
            assert ours == vllm_step_is_native(meta, decode_len), where
            builds += 1
            outcomes.add((vllm_0_33_0(query).builder, ours))
    assert builds == STEP_GRID_BUILDS
    assert outcomes == {("dense", True), ("dense", False), ("rocm_mxfp4", True), ("rocm_mxfp4", False)}


def test_native_builder_sends_ragged_decodes_to_prefill() -> None:
    """Documented vLLM 0.33 behaviour, pinned: a builder that may go native (SM90,
    next_n = 4) asks `split_decodes_and_prefills` for uniform decodes, so in a step with
    decode lens (4, 2, 4) only the first request stays a decode (the other two, the 4-row
    one included, take the prefill path); a flattening builder (adaptive verification)
    keeps all three as decodes."""
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    query_start_loc = torch.tensor([0, 4, 6, 10], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc.clone(),
        seq_lens=torch.tensor([90, 60, 70], dtype=torch.int32),
        num_reqs=3,
        num_actual_tokens=10,
        max_query_len=4,
        max_seq_len=90,
        block_table_tensor=torch.zeros(3, 2, dtype=torch.int32),
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
