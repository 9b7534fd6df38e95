"""A fake vLLM 0.33.0 environment, and vLLM's own builders driven on CPU, for the conformance tests
(tests/test_conformance_vllm_*.py).

vLLM is imported at module top on purpose: without it every conformance module must fail, not skip.

For one cell of the grid (GPU x DeepGEMM x next_n x adaptive verification x model architecture x MXFP4
cache), `vllm_startup` wires the model's indexer backend as its model code does (V3.2's indexer cache, V4's
attention layer -> indexer -> cache, V4.1's cache built by its own `__init__`), builds that backend's
metadata builder with its real `__init__` (where `dsa_indexer_uses_fp4` may refuse the cache), and runs the
real `maybe_create_adaptive_verification_manager` (where adaptive verification may be refused).
`current_platform`, `has_deep_gemm`, the ROCm CDNA generation and aiter's switch are patched where vLLM reads
them (`vllm_sees`); only GPU-bound pieces are stubbed (the SM count, aiter's cache geometry and schedule, the
adaptive manager's CUDA stream), none of which decides a path. `vllm_build` runs a builder's real `build()`
on one decode step; `vllm_prepare` runs `DeepseekV32IndexerMetadataBuilder._prepare_decode_tensors` on a
builder made without `__init__` (which needs a GPU).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from unittest import mock

import torch
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

from dsa_lab.batch.metadata import build_flatten_metadata
from dsa_lab.batch.workload import DecodeBatch
from dsa_lab.policy.query import Platform

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


STEP_NEXT_NS = range(1, 7)
MODEL_TYPES = {
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "DeepseekV41ForCausalLM": "deepseek_v41",
}
POISON = -777
CAPACITY = 256  # the builders' token buffers


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
