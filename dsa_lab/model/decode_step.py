"""A model of one DeepSeek-V3.2 decode step, layer by layer, to put the indexer in proportion.

One GPU of an 8-GPU deployment with data-parallel attention and expert-parallel MoE (the
layout vLLM's recipe uses for DeepSeek-V3.2 on one node): each GPU runs the attention of
its own `batch` requests, holds 256 / 8 routed experts and receives its share of every
rank's tokens. Per layer it costs

- the indexer: its logits kernel (given: measured on the H200, `indexer.predict` elsewhere)
  and the top-k that reads those logits back;
- sparse MLA: 2048 selected KV entries of 656 B per query row (FP8 latent + scales + bf16
  rope, vLLM's `fp8_ds_mla` layout), and the attention weights (FP8, read once a step);
- the feed-forward: the distinct routed experts its tokens touch plus the shared expert
  (58 MoE layers), or the dense MLP (3 layers), FP8 weights, and the GEMM FLOPs; the MoE's
  all-to-all (FP8 dispatch, bf16 combine) over NVLink;

plus the bf16 LM head once a step. With MTP the target pass sees next_n = 1 + k rows a
request, and k draft passes of the single MTP layer (next_n = 1) and the LM head come
first. Streams run at the H200's measured share of its bandwidth, GEMMs at its measured
share of its FP8 rate (the same shares are assumed on Blackwell). Kernel launch gaps,
norms, rope, sampling and scheduling are not modeled, so shares of the indexer are upper
bounds of a sort: whatever is missing would dilute them. Everything here is modeled.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsa_lab.batch.acceptance import PUBLISHED
from dsa_lab.batch.workload import MAX_NEXT_N, MAX_SEQ_LEN
from dsa_lab.errors import check_positive, check_range
from dsa_lab.kernels import vllm_backend
from dsa_lab.model.gpus import GpuCeilings, get_gpu
from dsa_lab.topk import DEFAULT_TOPK

STREAM_EFFICIENCY = 4.35 / 4.8  # the H200's measured read rate over its spec (model.gpus)
GEMM_EFFICIENCY = 1254.0 / 1979.0  # the H200's measured 8192^3 FP8 GEMM rate over its dense spec


@dataclass(frozen=True)
class ModelShape:
    """DeepSeek-V3.2's dimensions (its config.json on Hugging Face, deepseek-ai/DeepSeek-V3.2)."""

    layers: int = 61
    dense_layers: int = 3  # first_k_dense_replace
    hidden: int = 7168
    heads: int = 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_dim: int = 128
    qk_rope_dim: int = 64
    v_head_dim: int = 128
    routed_experts: int = 256
    active_experts: int = 8
    shared_experts: int = 1
    expert_ffn: int = 2048  # moe_intermediate_size
    dense_ffn: int = 18432  # intermediate_size
    vocab: int = 129280
    index_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = DEFAULT_TOPK  # what vLLM keeps per row (`topk.DEFAULT_TOPK`)
    mla_entry_bytes: int = 656  # 512 FP8 latent + 4 float32 scales + 64 bf16 rope values
    index_entry_bytes: int = 132  # 128 FP8 + one float32 scale

    @property
    def attention_params(self) -> int:
        """q down/up, kv down (latent + rope), k/v up (absorbed), o projection; plus the indexer's."""
        q = self.hidden * self.q_lora_rank + self.q_lora_rank * self.heads * (self.qk_nope_dim + self.qk_rope_dim)
        kv = self.hidden * (self.kv_lora_rank + self.qk_rope_dim)
        kv_up = self.kv_lora_rank * self.heads * (self.qk_nope_dim + self.v_head_dim)
        out = self.heads * self.v_head_dim * self.hidden
        indexer = self.q_lora_rank * self.index_heads * self.index_head_dim + self.hidden * (
            self.index_head_dim + self.index_heads
        )
        return q + kv + kv_up + out + indexer

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_ffn

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.dense_ffn


DEEPSEEK_V32 = ModelShape()
DEPLOYMENT_GPUS = 8  # vLLM recipe for DeepSeek-V3.2: data-parallel attention (-dp 8) with expert parallelism
DEPLOYMENT = "8 GPUs, data-parallel attention + expert-parallel MoE (vLLM's DeepSeek-V3.2 recipe)"


@dataclass(frozen=True)
class Part:
    """Bytes from HBM, FP8 FLOPs and NVLink bytes of one part of one layer."""

    hbm_bytes: float = 0.0
    flops: float = 0.0
    link_bytes: float = 0.0

    def time_us(self, gpu: GpuCeilings) -> float:
        stream = self.hbm_bytes / (gpu.hbm_tbps.value * 1e6 * STREAM_EFFICIENCY)
        compute = self.flops / (gpu.fp8_tflops.value * 1e6 * GEMM_EFFICIENCY)
        return max(stream, compute) + self.link_bytes / (gpu.nvlink_gbs.value * 1e3)


def distinct_experts(tokens: int, shape: ModelShape = DEEPSEEK_V32, gpus: int = DEPLOYMENT_GPUS) -> float:
    """Expected routed experts one GPU must read: its 256 / gpus, each idle only if all tokens
    of all ranks (`tokens` in total, 8 experts each, routed uniformly) miss it."""
    local = shape.routed_experts / gpus
    miss = (1 - shape.active_experts / shape.routed_experts) ** tokens
    return local * (1 - miss)


def layer_parts(
    batch: int,
    context: int,
    rows: int,
    logit_bytes: int,
    moe: bool,
    shape: ModelShape = DEEPSEEK_V32,
    gpus: int = DEPLOYMENT_GPUS,
) -> dict[str, Part]:
    """One layer's parts besides the indexer's logits kernel, for `batch` requests of `rows`
    query rows (next_n) with `context` cached tokens on this GPU."""
    tokens = batch * rows
    parts = {
        "indexer top-k": Part(hbm_bytes=tokens * context * logit_bytes),
        "sparse MLA": Part(hbm_bytes=tokens * min(context, shape.index_topk) * shape.mla_entry_bytes),
        "attention weights": Part(hbm_bytes=shape.attention_params, flops=2 * shape.attention_params * tokens),
    }
    if moe:
        experts = distinct_experts(tokens * gpus, shape, gpus) + shape.shared_experts
        routed = tokens * (shape.active_experts + shape.shared_experts)  # token-expert pairs this GPU computes
        parts["MoE experts"] = Part(hbm_bytes=experts * shape.expert_params, flops=2 * shape.expert_params * routed)
        remote = tokens * shape.active_experts * (gpus - 1) / gpus
        parts["MoE all-to-all"] = Part(link_bytes=remote * shape.hidden * 3)  # FP8 out, bf16 back
    else:
        parts["dense MLP"] = Part(hbm_bytes=shape.dense_mlp_params, flops=2 * shape.dense_mlp_params * tokens)
    return parts


@dataclass(frozen=True)
class StepBreakdown:
    """µs per component of one decode step on one GPU (target pass and drafts), modeled."""

    gpu: str
    batch: int
    context: int
    next_n: int
    components: dict[str, float]
    source: str = "modeled"

    @property
    def total_us(self) -> float:
        return sum(self.components.values())

    @property
    def indexer_us(self) -> float:
        return sum(v for k, v in self.components.items() if k.startswith("indexer"))

    @property
    def indexer_share(self) -> float:
        return self.indexer_us / self.total_us


def decode_step(
    gpu: str | GpuCeilings,
    batch: int,
    context: int,
    next_n: int,
    indexer_us: float,
    draft_indexer_us: float | None = None,
    shape: ModelShape = DEEPSEEK_V32,
    gpus: int = DEPLOYMENT_GPUS,
) -> StepBreakdown:
    """One decode step: the target pass over next_n rows a request, after next_n - 1 draft
    passes of the MTP layer. `indexer_us` is one layer's logits kernel at (batch, context,
    next_n); `draft_indexer_us` the same at next_n = 1 (needed when next_n > 1)."""
    spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    batch = check_range("batch", batch, 1, 1 << 16)
    context = check_range("context", context, 1, MAX_SEQ_LEN)
    next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
    check_positive("indexer_us", indexer_us, allow_zero=True)
    if draft_indexer_us is not None:
        check_positive("draft_indexer_us", draft_indexer_us, allow_zero=True)
    if next_n > 1 and draft_indexer_us is None:
        raise ValueError(f"draft_indexer_us: needed for next_n={next_n} (the MTP drafts run the indexer at next_n = 1)")
    logit_bytes = vllm_backend().model_traits[spec.arch].logit_bytes  # what vLLM's kernel writes there (SM100: bf16)
    components: dict[str, float] = {"indexer logits": shape.layers * indexer_us}
    lm_head = Part(hbm_bytes=2 * shape.vocab * shape.hidden, flops=0.0)
    for layers, moe in ((shape.layers - shape.dense_layers, True), (shape.dense_layers, False)):
        for part, cost in layer_parts(batch, context, next_n, logit_bytes, moe, shape, gpus).items():
            components[part] = components.get(part, 0.0) + layers * cost.time_us(spec)
    components["LM head"] = Part(
        hbm_bytes=lm_head.hbm_bytes, flops=2 * shape.vocab * shape.hidden * batch * next_n
    ).time_us(spec)
    drafts = next_n - 1
    if drafts:
        draft_layer = sum(
            cost.time_us(spec) for cost in layer_parts(batch, context, 1, logit_bytes, True, shape, gpus).values()
        )
        lm = Part(hbm_bytes=lm_head.hbm_bytes, flops=2 * shape.vocab * shape.hidden * batch).time_us(spec)
        components["indexer (MTP drafts)"] = drafts * draft_indexer_us
        components["MTP draft layers + LM head"] = drafts * (draft_layer + lm)
    return StepBreakdown(spec.name, batch, context, next_n, components)


def tokens_per_step(acceptance: tuple[float, ...], next_n: int) -> float:
    """Expected tokens a request emits per step: 1 + the per-position acceptance rates of its
    next_n - 1 drafts (a_k: the share of steps whose k-th draft is accepted, all before it too)."""
    if next_n - 1 > len(acceptance):
        raise ValueError(f"next_n={next_n}: the acceptance curve covers {len(acceptance)} draft positions")
    return 1.0 + sum(acceptance[: next_n - 1])


# Per-position acceptance a_k of MTP drafts (k = 1, 2, ...), as published: named for notebook 05, the
# numbers and sources declared once in `dsa_lab.batch.acceptance.PUBLISHED`.
ACCEPTANCE_PRESETS: dict[str, tuple[tuple[float, ...], str]] = {
    name: (PUBLISHED[key].rates, PUBLISHED[key].source)
    for name, key in (
        ("DeepSeek-V3, 1 draft", "v3-report"),
        ("V4-Flash, 2 drafts", "v4flash-vllm41044"),
        ("V4-Flash, 3 drafts, long text", "v4flash-ascend131"),
    )
}
