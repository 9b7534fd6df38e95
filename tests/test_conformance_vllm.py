"""Conformance with the real vLLM 0.33.0: its decode-path rules, metadata and FP8 cache bytes.

vLLM is imported at module top on purpose: without it this module must fail, not skip.

(a) `dsa_lab.policy.vllm.vllm_0_33_0` against vLLM itself on the whole grid (GPU x DeepGEMM x
    next_n x adaptive verification x model architecture x MXFP4 cache). For each cell vLLM
    wires the model's indexer backend as its model code does (V3.2's indexer cache, V4's
    attention layer -> indexer -> cache, V4.1's cache built by its own `__init__`), builds
    that backend's metadata builder with its real `__init__` (where `dsa_indexer_uses_fp4`
    may refuse the cache), and runs the real `maybe_create_adaptive_verification_manager`
    (where adaptive verification may be refused); what survives gives the builder class,
    its `use_flattening` and `supports_varlen`, and the ROCm MXFP4 builder's `native_next_n`.
    `current_platform`, `has_deep_gemm`, the ROCm CDNA generation and aiter's switch are
    patched where vLLM reads them; only GPU-bound pieces are stubbed (the SM count, aiter's
    cache geometry and schedule, the adaptive manager's CUDA stream), none of which decides
    a path. The per-step rule runs against the real `build()` of both builders.
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

import collections
import itertools
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from unittest import mock

import pytest
import torch
import vllm
import vllm.model_executor.models.deepseek_v2 as vllm_v32_model
import vllm.models.deepseek_v4.attention as vllm_v4_attention
import vllm.models.deepseek_v32.amd.rocm as vllm_v32_rocm
import vllm.models.deepseek_v41.attention as vllm_v41_attention
import vllm.utils.deep_gemm as vllm_deep_gemm
import vllm.v1.attention.backends.mla.indexer as vllm_indexer
import vllm.v1.attention.backends.mla.rocm_paged_mxfp4_indexer as vllm_rocm_mxfp4
import vllm.v1.worker.gpu.spec_decode.adaptive_verification as vllm_adaptive
from vllm._aiter_ops import rocm_aiter_ops
from vllm.platforms.interface import DeviceCapability, PlatformEnum
from vllm.platforms.interface import Platform as VllmPlatform
from vllm.v1.attention.backend import CommonAttentionMetadata

from dsa_lab.batch.acceptance import AcceptanceSpec
from dsa_lab.batch.cache import quantize_fp8
from dsa_lab.batch.metadata import build_flatten_metadata, build_native_metadata
from dsa_lab.batch.workload import DecodeBatch, ragged_decode_batch, uniform_batch, with_padding
from dsa_lab.policy.query import MODEL_ARCHS, Platform, PolicyQuery
from dsa_lab.policy.steps import step_route, step_uses_native
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

# DeepSeek-V4's ROCm attention layer lives in a module that reads the GPU arch when imported;
# vLLM asks amdsmi, then torch. Imported once, seeing a gfx950 (the arch only sets module flags).
with mock.patch.object(torch.cuda, "get_device_properties", lambda *a, **k: SimpleNamespace(gcnArchName="gfx950")):
    from vllm.models.deepseek_v4.amd.rocm import DeepseekV4ROCMAiterMLAAttention


@dataclass(frozen=True)
class FakeGpu:
    """A GPU as vLLM sees it (platform enum, capability) and as dsa_lab's `Platform` names it."""

    enum: PlatformEnum
    capability: tuple[int, int] | None
    family: str
    cdna: int | None = None  # ROCm: what vLLM's get_cdna_version() returns
    aiter: bool = False  # ROCm: rocm_aiter_ops.is_enabled()


FAKE_PLATFORMS = {
    "h200_sm90": FakeGpu(PlatformEnum.CUDA, (9, 0), "sm90"),
    "b200_sm100": FakeGpu(PlatformEnum.CUDA, (10, 0), "sm100"),
    "gb300_sm103": FakeGpu(PlatformEnum.CUDA, (10, 3), "sm100"),
    "rtx_pro_sm120": FakeGpu(PlatformEnum.CUDA, (12, 0), "sm120"),
    "a100_sm80": FakeGpu(PlatformEnum.CUDA, (8, 0), "other"),
    "mi300x_gfx942_aiter": FakeGpu(PlatformEnum.ROCM, (9, 4), "rocm", 3, True),
    "mi355x_gfx950": FakeGpu(PlatformEnum.ROCM, (9, 5), "rocm", 4, False),
    "mi355x_gfx950_aiter": FakeGpu(PlatformEnum.ROCM, (9, 5), "rocm", 4, True),
    "cpu_no_gpu": FakeGpu(PlatformEnum.CPU, None, "other"),
}
NEXT_NS = range(1, 17)
ADAPTIVE = (False, True)
DEEP_GEMM = (True, False)
FP4 = (False, True)
# Full grid of (a): GPUs x deep_gemm present x next_n 1..16 x adaptive x model arch x MXFP4 cache.
POLICY_GRID_SIZE = len(FAKE_PLATFORMS) * len(DEEP_GEMM) * len(NEXT_NS) * len(ADAPTIVE) * len(MODEL_ARCHS) * len(FP4)
STEP_NEXT_NS = range(1, 7)
MODEL_TYPES = {
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "DeepseekV41ForCausalLM": "deepseek_v41",
}
POISON = -777
CAPACITY = 256  # the builders' token buffers


def test_vllm_is_the_pinned_release() -> None:
    assert vllm.__version__ == "0.33.0"


# --- a fake vLLM environment -------------------------------------------------------


def fake_vllm_platform(name: str) -> VllmPlatform:
    """A vLLM `Platform` whose capability is fixed, so vLLM's own family logic runs."""
    gpu = FAKE_PLATFORMS[name]

    class FakePlatform(VllmPlatform):
        _enum = gpu.enum

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability | None:
            return None if gpu.capability is None else DeviceCapability(*gpu.capability)

    return FakePlatform()


def _no_aiter_layout(*args: object) -> SimpleNamespace:
    return SimpleNamespace(n_per_tile=16)  # aiter's K page geometry, which needs aiter installed


@contextmanager
def vllm_sees(name: str, deep_gemm: bool) -> Iterator[None]:
    """Patch what vLLM reads to tell the platform: `current_platform` where it is looked up,
    `has_deep_gemm`, the ROCm CDNA generation and aiter's switch; stub the SM count and
    aiter's cache geometry and schedule size (GPU- or aiter-bound, never a path decision)."""
    gpu = FAKE_PLATFORMS[name]
    plat = fake_vllm_platform(name)
    rocm = ModuleType("vllm.platforms.rocm")
    rocm.get_cdna_version = lambda: gpu.cdna or 0  # type: ignore[attr-defined]
    with ExitStack() as stack:
        for module in (vllm_indexer, vllm_deep_gemm, vllm_v41_attention):
            stack.enter_context(mock.patch.object(module, "current_platform", plat))
        stack.enter_context(mock.patch.object(vllm_indexer, "has_deep_gemm", lambda: deep_gemm))
        stack.enter_context(mock.patch.dict(sys.modules, {"vllm.platforms.rocm": rocm}))
        stack.enter_context(mock.patch.object(rocm_aiter_ops, "is_enabled", classmethod(lambda cls: gpu.aiter)))
        stack.enter_context(mock.patch.object(vllm_indexer, "num_compute_units", lambda device_id=0: 132))
        stack.enter_context(mock.patch.object(vllm_rocm_mxfp4, "rocm_paged_mxfp4_cache_layout", _no_aiter_layout))
        stack.enter_context(mock.patch.object(vllm_rocm_mxfp4, "rocm_mxfp4_decode_schedule_words", lambda *a: 64))
        yield


def fake_vllm_config(
    next_n: int, adaptive: bool, arch: str = "DeepseekV32ForCausalLM", fp4: bool = False
) -> SimpleNamespace:
    """The attributes of `VllmConfig` that the indexer's wiring, builders and startup checks read."""
    spec = None
    if next_n > 1 or adaptive:
        spec = SimpleNamespace(num_speculative_tokens=next_n - 1, enable_adaptive_verification=adaptive)
    hf_config = SimpleNamespace(model_type=MODEL_TYPES[arch], index_n_heads=64, index_head_dim=128)
    return SimpleNamespace(
        speculative_config=spec,
        num_speculative_tokens=next_n - 1,
        model_config=SimpleNamespace(
            architectures=[arch], hf_config=hf_config, hf_text_config=hf_config, max_model_len=4096
        ),
        attention_config=SimpleNamespace(
            resolve_indexer_kv_dtype=lambda default: "mxfp4" if fp4 else default,
            sparse_mla_prefill_workspace_factor=5,
            indexer_sparse_logits=False,
        ),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=CAPACITY, max_num_seqs=32),
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=1,
            tensor_parallel_size=1,
            prefill_context_parallel_size=1,
            cp_kv_cache_interleave_size=1,
        ),
        compilation_config=SimpleNamespace(static_forward_context={}),
    )


def our_platform(name: str, deep_gemm: bool) -> Platform:
    gpu = FAKE_PLATFORMS[name]
    return Platform(gpu.family, deep_gemm, gpu.cdna, gpu.aiter)


def vllm_indexer_backend(name: str, arch: str, config: SimpleNamespace) -> type:
    """The indexer backend the model's code wires on this platform (may raise ValueError:
    V4's ROCm layer and V4.1's cache ask `dsa_indexer_uses_fp4` while choosing)."""
    rocm = FAKE_PLATFORMS[name].enum == PlatformEnum.ROCM
    if arch == "DeepseekV32ForCausalLM":
        cache = vllm_v32_rocm.DeepseekV32ROCmIndexerCache if rocm else vllm_v32_model.DeepseekV32IndexerCache
        return cache.get_attn_backend(object.__new__(cache))
    if arch == "DeepseekV4ForCausalLM":
        # the CUDA layers are subclasses that do not override the choice; the base is abstract
        layer = object.__new__(DeepseekV4ROCMAiterMLAAttention) if rocm else None
        layer_cls = DeepseekV4ROCMAiterMLAAttention if rocm else vllm_v4_attention.DeepseekV4Attention
        indexer = layer_cls._get_indexer_cls(layer, config)
        cache = indexer._get_cache_cls(object.__new__(indexer))
        return cache.get_attn_backend(object.__new__(cache))
    with mock.patch.object(vllm_v41_attention, "get_current_vllm_config", lambda: config):
        cache = vllm_v41_attention.DeepseekV4IndexerCache(
            128, torch.uint8, "model.layers.0.attn.indexer.k_cache", SimpleNamespace(block_size=64)
        )
    return cache.get_attn_backend()


@dataclass
class VllmStartup:
    """What vLLM 0.33 does with one configuration: refuses it (`error`), or builds this builder."""

    error: str | None = None
    backend: type | None = None
    builder: object | None = None
    takes_device_query_lens: bool | None = None  # the backend's answer, asked on this platform

    @property
    def builder_name(self) -> str:
        rocm = isinstance(self.builder, vllm_rocm_mxfp4.RocmMxfp4IndexerMetadataBuilder)
        return "rocm_mxfp4" if rocm else "dense"

    @property
    def path(self) -> str:
        """The path of a full step (every request decoding next_n rows)."""
        if self.error is not None:
            return "rejected"
        if self.builder.supports_varlen:
            return "varlen"
        if self.builder_name == "rocm_mxfp4":
            return "native" if self.builder.native_next_n > 1 else "flatten"
        return "flatten" if self.builder.use_flattening else "native"


def vllm_startup(name: str, deep_gemm: bool, next_n: int, adaptive: bool, arch: str, fp4: bool) -> VllmStartup:
    """Wire the indexer backend, build its metadata builder, create the adaptive manager."""
    config = fake_vllm_config(next_n, adaptive, arch, fp4)
    spec = SimpleNamespace(block_size=64, num_states=64)
    startup = VllmStartup()
    with vllm_sees(name, deep_gemm):
        try:
            startup.backend = vllm_indexer_backend(name, arch, config)
            startup.takes_device_query_lens = startup.backend.supports_device_cpu_query_lens_mismatch()
            builder_cls = startup.backend.get_builder_cls()
            startup.builder = builder_cls(spec, ["indexer"], config, torch.device("cpu"), block_table_width=4)
            group = SimpleNamespace(
                backend=startup.backend,
                layer_names=["indexer"],
                kv_cache_spec=spec,
                get_metadata_builder=lambda index=0: startup.builder,
            )
            with mock.patch.object(vllm_adaptive, "AdaptiveVerificationManager", lambda *a, **k: object()):
                vllm_adaptive.maybe_create_adaptive_verification_manager(
                    enable_adaptive_verification=adaptive,
                    attn_groups=[[group]],
                    req_states=SimpleNamespace(num_speculative_steps=next_n - 1),
                    query_start_loc=None,
                    num_bonus_tokens=1,
                    max_total_logits=1 << 20,
                    vllm_config=config,
                )
        except ValueError as err:
            startup.error = str(err)
    return startup


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


def vllm_step_metadata(decode_lens: tuple[int, ...]) -> CommonAttentionMetadata:
    """One decode step of requests decoding `decode_lens` rows, as vLLM's builders get it
    (request i holds 50 + 20 i tokens; a 0 is a CUDA-graph padding request: no tokens, seq_len 0)."""
    lens = torch.tensor(decode_lens, dtype=torch.int32)
    reqs, tokens = len(decode_lens), int(lens.sum())
    query_start_loc = torch.zeros(reqs + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(lens, 0)
    seq_lens = torch.tensor([50 + 20 * i if rows else 0 for i, rows in enumerate(decode_lens)], dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc.clone(),
        seq_lens=seq_lens,
        num_reqs=reqs,
        num_actual_tokens=tokens,
        max_query_len=max(decode_lens),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=torch.arange(reqs * 4, dtype=torch.int32).view(reqs, 4),
        slot_mapping=torch.zeros(tokens, dtype=torch.int64),
    )


def run_vllm_build(
    name: str, deep_gemm: bool, next_n: int, adaptive: bool, arch: str, fp4: bool, decode_lens: tuple[int, ...]
):
    """vLLM's real `build()` of the builder it wires, for one decode step of requests decoding
    `decode_lens` rows (`vllm_step_metadata`)."""
    startup = vllm_startup(name, deep_gemm, next_n, adaptive, arch, fp4)
    assert startup.error is None, startup.error
    return vllm_build(startup, name, deep_gemm, decode_lens)


def vllm_build(startup: VllmStartup, name: str, deep_gemm: bool, decode_lens: tuple[int, ...]):
    """`build()` of a builder vLLM made (`vllm_startup`) on the step `vllm_step_metadata(decode_lens)`.

    GPU- or aiter-bound calls are stubbed: DeepGEMM's SM planner, the uniform-decode Triton
    kernel (which fills buffers whose shapes are what decides), aiter's decode schedule.
    """
    common = vllm_step_metadata(decode_lens)

    def no_deep_gemm_schedule(lens, block, sms, indices=None):  # DeepGEMM's planner needs a GPU
        return torch.zeros(sms + 1, 2, dtype=torch.int32)

    with (
        vllm_sees(name, deep_gemm),
        mock.patch.object(vllm_indexer, "get_paged_mqa_logits_metadata", no_deep_gemm_schedule),
        mock.patch.object(vllm_indexer, "_PREPARE_UNIFORM_DECODE_KERNEL", lambda *args: None),
        mock.patch.object(vllm_rocm_mxfp4, "build_rocm_mxfp4_decode_schedule", lambda *args, **kw: None),
    ):
        return startup.builder.build(0, common)


def vllm_step_is_native(meta: object, max_decode_len: int) -> bool:
    """Native: the dense builder keeps one row per request (`[B, max_decode_len]` lens, B
    counting the padding request; flattened it would be one row per token), the ROCm
    MXFP4 builder hands its launches next_n-row sequences (`decode_native`)."""
    if isinstance(meta, vllm_rocm_mxfp4.RocmMxfp4IndexerMetadata):
        return meta.decode_native is not None
    return tuple(meta.decode.seq_lens.shape) == (meta.num_decodes, max_decode_len)


STEP_CASES = [  # (GPU, deep_gemm, arch, fp4): the dense builder on each kind of GPU, and the ROCm MXFP4 builder
    *[(name, dg, "DeepseekV32ForCausalLM", False) for name in FAKE_PLATFORMS for dg in DEEP_GEMM],
    ("mi300x_gfx942_aiter", False, "DeepseekV4ForCausalLM", False),  # dense, adaptive accepted on ROCm
    ("mi355x_gfx950_aiter", False, "DeepseekV4ForCausalLM", True),
    ("mi355x_gfx950_aiter", False, "DeepseekV41ForCausalLM", True),
]
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
    return torch.randint(
        0, 10_000, (batch.batch_size, batch.max_blocks_per_request + 1), generator=gen, dtype=torch.int32
    )


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


# --- (d) MTP acceptance -> ragged decode lengths -> the step's path -------------------------------

ROUTE_PROFILES = ("accept:0.9,0.7,0.5,0.3,0.1", "accept:0.6,0.3,0.1,0.05,0.02")
ROUTE_GRID_BUILDS = 276


def vllm_route(startup: VllmStartup, name: str, deep_gemm: bool, decode_lens: tuple[int, ...]):
    """vLLM's own answer for one step: the builder's split (`split_decodes_and_prefills` with the
    arguments its `build()` passes), then its `build()` on the requests that stay decodes, read as
    native / padded (native with `requires_padding`) / flatten. (`build()` on the whole step would also
    build the prefill part, which launches a Triton kernel this CPU process cannot run.)"""
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    builder = startup.builder
    require_uniform = not (builder.use_flattening or builder.supports_varlen)
    decodes, prefills, _, _ = split_decodes_and_prefills(
        vllm_step_metadata(decode_lens), builder.decode_threshold, require_uniform, not builder.use_pcp
    )
    kept = decode_lens[:decodes]
    meta = vllm_build(startup, name, deep_gemm, kept)
    assert meta.num_decodes == decodes and meta.num_prefills == 0
    if not vllm_step_is_native(meta, max(kept)):
        return "flatten", decodes, prefills
    rocm = isinstance(meta, vllm_rocm_mxfp4.RocmMxfp4IndexerMetadata)
    return ("padded" if meta.decode.requires_padding and not rocm else "native"), decodes, prefills


def test_acceptance_decode_lengths_take_vllms_path() -> None:
    """Acceptance profile -> seeded decode lengths (`AcceptanceSpec.decode_lens`) -> `policy.step_route`,
    against vLLM 0.33's own split and `build()` on every builder case, with and without adaptive
    verification: the requests it keeps as decodes, those it sends to prefill, and the path. A dense
    builder's step ends in a CUDA-graph padding request (0 rows). SM100 + DeepGEMM takes the varlen
    kernel, which cannot run here: there only our answer is checked ('varlen')."""
    builds, outcomes = 0, set()
    for (name, deep_gemm, arch, fp4), adaptive, next_n in itertools.product(STEP_CASES, ADAPTIVE, STEP_NEXT_NS):
        query = PolicyQuery(our_platform(name, deep_gemm), next_n, fp4, adaptive, arch)
        if vllm_0_33_0(query).path == "rejected":
            continue
        startup = vllm_startup(name, deep_gemm, next_n, adaptive, arch, fp4)
        for profile in ROUTE_PROFILES:
            lens = AcceptanceSpec.parse(profile).decode_lens(5, next_n, seed=next_n)
            if vllm_0_33_0(query).builder == "dense":
                lens += (0,)
            ours = step_route(query, lens)
            where = f"{name} dg={deep_gemm} {arch} fp4={fp4} next_n={next_n} adaptive={adaptive} lens={lens}"
            if supports_varlen(query.platform):
                assert ours.path == "varlen" and ours.prefills == 0, where
                continue
            assert (ours.path, ours.decodes, ours.prefills) == vllm_route(startup, name, deep_gemm, lens), where
            assert ours.max_decode_len == max(lens[: ours.decodes]), where
            builds += 1
            outcomes.add((ours.path, ours.prefills > 0))
    assert builds == ROUTE_GRID_BUILDS
    assert outcomes == {("native", True), ("native", False), ("padded", False), ("flatten", False)}


if __name__ == "__main__":
    _interpret_worker(sys.argv[1], sys.argv[2])


def test_the_shipped_serving_runs_routes_are_what_vllm_builds(monkeypatch) -> None:
    """Every acceptance point the H200 serving run stored: the point's own seeded decode lengths
    (`bench.point.Point.decode_lens`, B = 128) through vLLM 0.33's split and `build()` on SM90 + DeepGEMM
    with adaptive verification (drafts admitted per request) give the route the run recorded (`vllm_route`)."""
    from dsa_lab import axes
    from dsa_lab.bench.point import Point
    from dsa_lab.paths import resolve_data_path
    from dsa_lab.store import folders as store

    run = store.load_run(resolve_data_path("h200/h200-serving-20261201"))
    rows = run.results[run.results["acceptance"] != "none"].drop_duplicates("next_n")
    assert len(rows) == 5
    monkeypatch.setattr(sys.modules[__name__], "CAPACITY", 128 * 8)  # a B = 128 step's tokens
    for row in rows.to_dict("records"):
        point = Point(**{name: row[name] for name in axes.NAMES})
        lens = point.decode_lens(run.provenance["seed"])
        startup = vllm_startup("h200_sm90", True, point.next_n, True, "DeepseekV32ForCausalLM", False)
        assert startup.error is None, startup.error
        where = f"next_n={point.next_n} acceptance={point.acceptance}"
        route = vllm_route(startup, "h200_sm90", True, lens)
        assert (row["vllm_route"], row["vllm_decodes"], row["vllm_prefills"]) == route, where
