"""vLLM 0.33's decisions per decode step: which path one step takes, once the builder's choice is made.

`policy` says what a release does with a configuration (`vllm_0_33_0`: native, flatten, varlen,
rejected); a step can still go another way. The kernel sees the step's longest decode, so on SM90 a
step whose longest request has 3 rows flattens even when next_n = 4 (`step_uses_native`,
`step_path`), and a ragged step is split into decodes and prefills before any of that
(`step_route`, `decode_count_0_33`: what `split_decodes_and_prefills` keeps as decodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dsa_lab.errors import check_choice, check_int_sequence, check_range
from dsa_lab.policy.query import PolicyQuery
from dsa_lab.policy.vllm import supports_native_decode, supports_varlen, use_flattening_0_33, vllm_0_33_0


def step_uses_native(q: PolicyQuery, max_decode_len: int, uniform: bool = True) -> bool:
    """vLLM 0.33's per-step rule: does this decode step's kernel see rows per request?

    Dense builder (`build()`): native only if the builder did not flatten (nor take
    varlen) and the kernel takes this step's `max_decode_len` rows natively; a native
    builder sends ragged requests to the prefill path, so `uniform` does not matter.
    e.g. SM90 + DeepGEMM, next_n = 4: a step whose longest request has 3 rows flattens.
    ROCm MXFP4 builder (`native_decode`): native only if every decoding request has all
    next_n rows (`uniform` and `max_decode_len == next_n`; padding requests aside).
    """
    check_range("max_decode_len", max_decode_len, 1, q.next_n)
    if not isinstance(uniform, bool):
        raise ValueError(f"uniform={uniform!r}: must be a bool")
    decision = vllm_0_33_0(q)
    if decision.path == "rejected":
        raise ValueError(f"{q}: rejected at startup; no decode step exists")
    if decision.builder == "rocm_mxfp4":
        return decision.native_next_n and uniform and max_decode_len == q.next_n
    builder_native = not (use_flattening_0_33(q) or supports_varlen(q.platform))
    return builder_native and (max_decode_len <= 1 or supports_native_decode(q.platform, max_decode_len))


def step_path(q: PolicyQuery, max_decode_len: int, uniform: bool = True) -> str:
    """'native', 'flatten' or 'varlen' for one vLLM 0.33 decode step."""
    if step_uses_native(q, max_decode_len, uniform):
        return "native"
    return "varlen" if vllm_0_33_0(q).path == "varlen" else "flatten"


STEP_ROUTES = ("native", "padded", "flatten", "varlen")


@dataclass(frozen=True)
class StepRoute:
    """What vLLM 0.33 does with one decode step whose requests bring `decode_lens` rows.

    `decodes` requests take the indexer's decode path (padding requests included), the other
    `prefills` its prefill path; `path` is how the decodes reach the paged kernel: 'native'
    (`[B, max_decode_len]` rows), 'padded' (native, shorter requests packed up to
    max_decode_len rows by `pack_seq_triton`: vLLM's `requires_padding`), 'flatten' (one row
    per token) or 'varlen' (SM100 + DeepGEMM).
    """

    path: str
    decodes: int
    prefills: int
    max_decode_len: int

    def __post_init__(self) -> None:
        check_choice("path", self.path, STEP_ROUTES)


def decode_count_0_33(decode_lens: Sequence[int], decode_threshold: int, require_uniform: bool) -> int:
    """`split_decodes_and_prefills` (vllm/v1/attention/backends/utils.py) on a batch with no
    prefill: how many leading requests stay decodes. A builder that may go native asks for
    uniform decodes (`require_uniform`), so the first request whose rows differ from the first
    request's (padding requests, 0 rows, aside) and every request after it go to the prefill path."""
    lens = tuple(decode_lens)
    if max(lens) <= decode_threshold and (not require_uniform or decode_threshold <= 1):
        return len(lens)
    if lens[0] > decode_threshold:
        return 0
    if require_uniform:
        is_prefill = [n != lens[0] and n != 0 for n in lens]
    else:
        is_prefill = [n > decode_threshold for n in lens]
    return is_prefill.index(True) if any(is_prefill) else len(lens)


def step_route(q: PolicyQuery, decode_lens: Sequence[int]) -> StepRoute:
    """vLLM 0.33's `DeepseekV32IndexerMetadataBuilder.build()` on one decode step: the split
    (`decode_count_0_33`, with the builder's `decode_threshold = next_n` and `require_uniform =
    not (use_flattening or supports_varlen)`), then the per-step path of the decodes
    (`step_uses_native` on their longest request; `requires_padding` when their rows differ).
    `decode_lens` run in vLLM's batch order; padding requests (0 rows) come last."""
    lens = check_int_sequence("decode_lens", decode_lens, 0, q.next_n)
    if not lens or lens[0] == 0:
        raise ValueError(f"decode_lens={lens!r:.80}: need requests, the first decoding (padding requests come last)")
    decision = vllm_0_33_0(q)
    if decision.path == "rejected":
        raise ValueError(f"{q}: rejected at startup; no decode step exists")
    require_uniform = not (decision.use_flattening or supports_varlen(q.platform))
    decodes = decode_count_0_33(lens, q.next_n, require_uniform)
    kept = lens[:decodes]
    longest, uniform = max(kept), min(kept) == max(kept)
    path = step_path(q, longest, uniform)
    if path == "native" and decision.builder == "dense" and not uniform:
        path = "padded"
    return StepRoute(path, decodes, len(lens) - decodes, longest)
