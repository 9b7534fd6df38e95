"""MTP acceptance: per-position acceptance rates -> how many query rows each request brings to one step.

A profile is vLLM's *per-position acceptance rate* (`vllm/v1/spec_decode/metrics.py`,
`SpecDecodingLogging.log`): a_k is the share of a request's steps whose k-th draft was accepted,
every draft before it too (vLLM counts draft k as accepted only inside the accepted prefix), so
a_1 >= a_2 >= ... and the mean acceptance length is 1 + sum(a_k). Each request of a step draws
one uniform u and brings 1 + #{k < next_n : u < a_k} rows: draft k survives only if draft k-1
did, so P(rows >= k + 1) = a_k exactly (the usual chained MTP acceptance).

Why rows: a verify step's request brings 1 + the drafts it verifies. In vLLM 0.33 they differ
per request where drafts are admitted per request, e.g. adaptive verification admits each
request's drafts by their survival probability, the running product of its per-position
confidences (`vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`,
`_assign_draft_token_budget`). The draw here is a model of such a step, not a replay of a trace;
`policy_steps.step_route` then says what vLLM 0.33 does with it.

`PUBLISHED` holds the profiles we quote, each with its source (docs/ARCHITECTURE.md lists them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsa_lab.batch.workload import MAX_NEXT_N, MAX_REQUESTS, DecodeBatch
from dsa_lab.errors import check_range, check_seed

ACCEPTANCE_STREAM = 0xACCE97  # added to the point's seed: the draw never reuses the context lengths' stream


@dataclass(frozen=True)
class PublishedAcceptance:
    """A per-position acceptance curve as someone measured and published it."""

    rates: tuple[float, ...]
    source: str  # who measured what, in words
    url: str


PUBLISHED: dict[str, PublishedAcceptance] = {
    "v3-report": PublishedAcceptance(
        (0.875,),
        "DeepSeek-V3 Technical Report (arXiv 2412.19437), sec. 5.4.3: second token accepted 85-90% of the time (midpoint)",
        "https://arxiv.org/abs/2412.19437",
    ),
    "v4flash-vllm41044": PublishedAcceptance(
        (0.7002, 0.2874),
        "vLLM PR #41044: DeepSeek-V4-Flash, MTP k=2, pos0 / pos1 acceptance 70.02% / 28.74%",
        "https://github.com/vllm-project/vllm/pull/41044",
    ),
    "v4flash-ascend131": PublishedAcceptance(
        (0.98, 0.64, 0.15),
        "GDzhu01/vllm-ascend-deepseekv4 issue #131: DeepSeek-V4-Flash, mtp=3, per-position 0.98 / 0.64 / 0.15",
        "https://github.com/GDzhu01/vllm-ascend-deepseekv4/issues/131",
    ),
    "v4flash-dspark-ascend13640": PublishedAcceptance(
        (0.739, 0.478, 0.261, 0.174, 0.13, 0.087, 0.043),
        "vllm-ascend issue #13640: DeepSeek-V4-Flash-0731 with DSpark (7 drafts) on Ascend A2, reported as too low; "
        "one logged interval, 161 drafted tokens",
        "https://github.com/vllm-project/vllm-ascend/issues/13640",
    ),
    "v3-sglang3582": PublishedAcceptance(
        (0.9,),
        "sglang PR #3582: DeepSeek-V3/R1 NextN, '~1.9 avg accept length' with --speculative-num-draft-tokens 2 "
        "(the verified token and one draft, so a_1 ~ 0.9: our reading of the flags)",
        "https://github.com/sgl-project/sglang/pull/3582",
    ),
}


def _format_rate(rate: float) -> str:
    return repr(float(rate))


@dataclass(frozen=True)
class AcceptanceSpec:
    """Per-position acceptance rates of a point ('accept:0.8,0.6,0.4'), or 'none': every request
    decodes all next_n rows (the uniform step every run before this axis measured).

    A published curve keeps its name as its label ('v3-sglang3582'), so a stored point says where its
    rates came from; 'NAME:K' is the curve's first K positions ('v4flash-dspark-ascend13640:5'), for a
    next_n below the curve's length that should say so."""

    rates: tuple[float, ...] | None = None  # None: 'none'
    name: str | None = None  # a `PUBLISHED` name, ':K' when only its first K positions are taken

    def __post_init__(self) -> None:
        if self.rates is None:
            if self.name is not None:
                raise ValueError(f"name={self.name!r}: 'none' has no published source")
            return
        rates = tuple(self.rates) if isinstance(self.rates, Sequence) and not isinstance(self.rates, str) else None
        if not rates or len(rates) > MAX_NEXT_N - 1:
            raise ValueError(f"rates={self.rates!r}: need 1..{MAX_NEXT_N - 1} per-position acceptance rates")
        for k, rate in enumerate(rates):
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
                raise ValueError(f"rates[{k}]={rate!r}: an acceptance rate is a number in [0, 1]")
            if k and rate > rates[k - 1]:
                raise ValueError(
                    f"rates[{k}]={rate!r} > rates[{k - 1}]={rates[k - 1]!r}: per-position rates cannot grow "
                    "(draft k counts as accepted only when every draft before it was)"
                )
        object.__setattr__(self, "rates", tuple(float(r) for r in rates))
        if self.name is not None and _published(self.name) != self.rates:
            raise ValueError(f"name={self.name!r}: not the published curve {self.rates} (see acceptance.PUBLISHED)")

    @property
    def label(self) -> str:
        if self.rates is None:
            return "none"
        return self.name if self.name is not None else "accept:" + ",".join(map(_format_rate, self.rates))

    @classmethod
    def parse(cls, value: str) -> AcceptanceSpec:
        """'none', 'accept:R1,R2,...' (each in [0, 1], non-increasing), a name of `PUBLISHED`, or
        'NAME:K' (its first K positions; K its length is the name itself)."""
        text = str(value).strip().lower()
        if text == "none":
            return cls()
        name, colon, count = text.partition(":")
        if name in PUBLISHED and (not colon or (count.isascii() and count.isdigit())):
            full = PUBLISHED[name].rates
            if not count or int(count) == len(full):
                return cls(full, name)
            if 1 <= int(count) < len(full):
                return cls(full[: int(count)], f"{name}:{int(count)}")
            raise ValueError(f"acceptance={value!r}: {name} has {len(full)} positions; take 1..{len(full)} of them")
        if text.startswith("accept:"):
            try:
                rates = tuple(float(part) for part in text[len("accept:") :].split(","))
            except ValueError:
                rates = ()
            if rates and all(math.isfinite(r) for r in rates):
                return cls(rates)
        raise ValueError(
            f"acceptance={value!r}: allowed values are 'none', 'accept:R1,R2,...' (per-position acceptance "
            f"rates in [0, 1], non-increasing, e.g. accept:0.8,0.6,0.4) or one of {tuple(PUBLISHED)} "
            "(NAME:K for its first K positions)"
        )

    @property
    def per_request(self) -> bool:
        """Drafts admitted per request, so rows may differ between requests: in vLLM 0.33 that is adaptive
        verification (`PolicyQuery.adaptive_verification`); 'none' is plain MTP, every request at next_n."""
        return self.rates is not None

    def expected_rows(self, next_n: int) -> float:
        """Mean rows a request brings (vLLM's mean acceptance length, capped at next_n rows)."""
        return 1.0 + sum(self.rates_for(next_n)) if self.rates is not None else float(next_n)

    def rates_for(self, next_n: int) -> tuple[float, ...]:
        """The rates of the next_n - 1 draft positions a step with next_n rows has."""
        next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
        if self.rates is None:
            return (1.0,) * (next_n - 1)
        if len(self.rates) < next_n - 1:
            raise ValueError(
                f"acceptance={self.label!r}: gives {len(self.rates)} draft positions, next_n={next_n} needs {next_n - 1}"
            )
        return self.rates[: next_n - 1]

    def decode_lens(self, batch: int, next_n: int, seed: int) -> tuple[int, ...]:
        """Rows each of `batch` requests brings to one step (see the module docstring), seeded."""
        batch = check_range("batch", batch, 1, MAX_REQUESTS)
        if not self.per_request:  # every draft accepted: no draw (the same lengths, without its cost)
            check_seed("seed", seed)
            return (check_range("next_n", next_n, 1, MAX_NEXT_N),) * batch
        rates = torch.tensor(self.rates_for(next_n), dtype=torch.float64)
        gen = torch.Generator().manual_seed(check_seed("seed", seed) + ACCEPTANCE_STREAM)  # below 2**64: torch's
        u = torch.rand(batch, dtype=torch.float64, generator=gen)
        return tuple(int(x) for x in 1 + (u[:, None] < rates[None, :]).sum(dim=1))


def _published(name: str) -> tuple[float, ...] | None:
    """The rates a label names: a `PUBLISHED` curve, or its first K positions for 'NAME:K' (None: no such)."""
    base, _, count = name.partition(":")
    if base not in PUBLISHED:
        return None
    rates = PUBLISHED[base].rates
    if not count:
        return rates
    return rates[: int(count)] if count.isdigit() and 1 <= int(count) < len(rates) else None


def accepted_batch(
    seq_lens: Sequence[int], acceptance: AcceptanceSpec, next_n: int, seed: int, **shape: object
) -> DecodeBatch:
    """The step of requests holding `seq_lens` under `acceptance`: ragged decode lengths, next_n as configured
    (the kernels see `max_decode_len` rows, as vLLM's do)."""
    if not isinstance(acceptance, AcceptanceSpec):
        raise ValueError(f"acceptance: expected an AcceptanceSpec, got {type(acceptance).__name__}")
    lens = acceptance.decode_lens(len(seq_lens), next_n, seed)
    return DecodeBatch(tuple(seq_lens), lens, next_n, **shape)


def parse_acceptance_list(text: str) -> tuple[AcceptanceSpec, ...]:
    """The command line's list of profiles: 'none,accept:0.8,0.6,v3-report' -> three profiles. A comma
    separates profiles, except that the numbers after 'accept:' belong to it."""
    groups: list[list[str]] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        if groups and groups[-1][0].lower().startswith("accept:") and _is_number(part):
            groups[-1].append(part)
        else:
            groups.append([part])
    if not groups:
        raise ValueError("--acceptance: give at least one profile (e.g. none or accept:0.8,0.6,0.4)")
    return tuple(AcceptanceSpec.parse(",".join(group)) for group in groups)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
