"""Adversarial batches and the helpers that build them: cache blocks, seeds, contexts, shapes; ragged and
padded steps must agree across strategies; a dry run of any size answers in seconds."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, refused, run_cli

AREA = "batches"


def small_cache():
    from dsa_lab.batch.workload import random_inputs, uniform_batch

    return random_inputs(uniform_batch(2, 100, 1, num_heads=32, head_dim=64)).cache


for _ids, _label in (([-1], "[-1]"), ([-5, 0], "[-5, 0]"), ([10**6], "[10**6]"), (None, "the block count")):

    def _blocks(tmp: Path, ids=_ids) -> Result:
        from dsa_lab.batch.cache import dequantize_blocks

        cache = small_cache()
        values = [cache.num_blocks] if ids is None else ids
        return refused(lambda: dequantize_blocks(cache, torch.tensor(values)), "block_ids")

    case(AREA, f"dequantize_blocks(cache, {_label})")(_blocks)

for _ids, _label in ((torch.tensor([0.0]), "float ids"), ([0], "a list"), (torch.tensor([[0]]), "2-D ids")):
    case(AREA, f"dequantize_blocks with {_label}")(
        lambda tmp, ids=_ids: refused(
            lambda: __import__("dsa_lab.batch.cache").batch.cache.dequantize_blocks(small_cache(), ids), "block_ids"
        )
    )


SEEDS = (2**70, 2**64, -1, 1.5, True, "7", 2**63)


def _seeded(kind: str, seed):
    from dsa_lab.batch import cache, workload

    calls = {
        "random_inputs": lambda: workload.random_inputs(workload.uniform_batch(1, 64, 1), seed=seed),
        "random_paged_cache": lambda: cache.random_paged_cache((64,), 128, seed=seed),
        "mixed_length_batch": lambda: workload.mixed_length_batch(2, 64, 256, 1, seed),
        "ragged_decode_batch": lambda: workload.ragged_decode_batch(2, 64, 256, 2, seed),
        "SweepSpec": lambda: __import__("dsa_lab.bench.point", fromlist=["x"]).SweepSpec(seed=seed),
        "ContextSpec.seq_lens": lambda: workload.ContextSpec.parse("mixed:64-256").seq_lens(2, seed),
    }
    return calls[kind]()


for _kind in (
    "random_inputs",
    "random_paged_cache",
    "mixed_length_batch",
    "ragged_decode_batch",
    "SweepSpec",
    "ContextSpec.seq_lens",
):
    for _seed in SEEDS:
        case(AREA, f"{_kind} seed={_seed!r}")(lambda tmp, k=_kind, s=_seed: refused(lambda: _seeded(k, s), "seed"))


@case(AREA, "a seed of 2**63 - 1 (the top of the range) is accepted")
def _(tmp: Path) -> Result:
    from dsa_lab.batch import workload

    workload.mixed_length_batch(2, 64, 256, 1, 2**63 - 1)
    return Result(CLEAR, "accepted")


CONTEXTS = (
    "1.5K",
    "64k ",
    "1e3",
    "mixed:5-5",
    "mixed:64-32",
    "0x40",
    "٣٢",
    "²",
    "64KK",
    "mixed:1K-",
    "mixed:-5-9",
    "",
    "K",
    "mixed:0-9",
    "16777217",
    "nan",
    "64 K",
)
for _text in CONTEXTS:

    def _context(tmp: Path, text: str = _text) -> Result:
        from dsa_lab.batch.workload import ContextSpec

        try:
            spec = ContextSpec.parse(text)
        except ValueError as err:
            return Result(CLEAR, str(err)[:150]) if "context=" in str(err) else Result(UNCLEAR, str(err))
        except Exception as err:
            return Result(UNCLEAR, f"raw {type(err).__name__}: {err}")
        plain = text.strip().lower()
        if plain in ("64k",):
            return Result(CLEAR, f"read as {spec.label}")
        return Result(WRONG, f"{text!r} read as {spec.label}")

    case(AREA, f"context {_text!r}")(_context)


def _decode_batch(**kwargs):
    from dsa_lab.batch.workload import DecodeBatch

    args = {"seq_lens": (64, 64), "decode_lens": (1, 1), "next_n": 1}
    return DecodeBatch(**{**args, **kwargs})


for _kwargs, _name in (
    ({"seq_lens": (64, -1)}, "seq_lens[1]"),
    ({"decode_lens": (2, 1)}, "decode_lens[0]"),
    ({"next_n": 17}, "next_n"),
    ({"num_heads": 48}, "num_heads"),
    ({"head_dim": 96}, "head_dim"),
    ({"block_size": 32}, "block_size"),
    ({"cache_dtype": "int4"}, "cache_dtype"),
    ({"seq_lens": (64,)}, "decode_lens"),
    ({"seq_lens": (1, 64), "decode_lens": (2, 1), "next_n": 2}, "seq_lens"),
    ({"num_decode_tokens": 1}, "num_decode_tokens"),
    ({"seq_lens": "64"}, "seq_lens"),
    ({"seq_lens": (64.0, 64)}, "seq_lens[0]"),
):
    case(AREA, f"DecodeBatch({_kwargs})"[:90])(lambda tmp, k=_kwargs, n=_name: refused(lambda: _decode_batch(**k), n))


RAGGED = {
    "block boundaries (63, 64, 65, 128)": dict(seq_lens=(63, 64, 65, 128), decode_lens=(4, 4, 4, 4), next_n=4),
    "ragged decode lens with zeros": dict(seq_lens=(70, 200, 5, 0), decode_lens=(3, 1, 2, 0), next_n=3),
    "next_n = 16 at the shortest contexts": dict(seq_lens=(16, 17, 80), decode_lens=(16, 16, 16), next_n=16),
    "one token requests": dict(seq_lens=(1, 1, 1), decode_lens=(1, 1, 1), next_n=1),
    "padding tokens past the requests": dict(seq_lens=(90, 33), decode_lens=(2, 2), next_n=2, num_decode_tokens=7),
    "contexts orders of magnitude apart": dict(seq_lens=(3, 5000, 64), decode_lens=(3, 2, 1), next_n=3),
}
for _label, _kwargs in RAGGED.items():

    def _ragged(tmp: Path, kwargs=_kwargs) -> Result:
        from dsa_lab.batch.workload import DecodeBatch, random_inputs
        from dsa_lab.decode import run_decode
        from dsa_lab.invariance import StrategiesDisagree, check_agreement, compare_strategies

        batch = DecodeBatch(**kwargs, num_heads=32, head_dim=64)
        inputs = random_inputs(batch, seed=3)
        results = {s: run_decode(inputs, s, "reference", topk=8) for s in ("native", "flatten", "atom")}
        try:
            return Result(CLEAR, check_agreement(compare_strategies(results), 0.0)[:150])
        except StrategiesDisagree as err:
            return Result(WRONG, f"strategies disagree: {err}")

    case(AREA, f"strategies agree on a ragged step: {_label}")(_ragged)


for _flags, _label in (
    (["--batch", ",".join(str(b) for b in range(1, 4097))], "4096 batch values"),
    (
        ["--batch", ",".join(str(b) for b in range(1, 4097)), "--context", "mixed:1K-128K"],
        "4096 batch values, mixed contexts",
    ),
    (["--context", ",".join(str(c) for c in range(64, 64 + 2000)), "--batch", "128"], "2000 contexts at batch 128"),
    (["--preset", "h200-full", "--batch", "1,16,64,128,256,512,1024,2048,4096"], "h200-full at batch up to 4096"),
):

    def _dry(tmp: Path, flags=_flags) -> Result:
        started = time.perf_counter()
        done = run_cli(["bench", "--dry-run", "--device", "cpu", "--root", str(tmp), *flags])
        seconds = time.perf_counter() - started
        if done.code != 0:
            return Result(UNCLEAR, f"exit {done.code}: {done.err[-300:]}")
        if seconds > 10:
            return Result(UNCLEAR, f"answered in {seconds:.0f} s")
        return Result(CLEAR, f"{seconds:.1f} s: {done.out.strip().splitlines()[0][:120]}")

    case(AREA, f"bench --dry-run with {_label} answers in seconds", timeout_s=60)(_dry)


def _inputs():
    from dsa_lab.batch.workload import random_inputs, uniform_batch

    return random_inputs(uniform_batch(2, 100, 2, num_heads=32, head_dim=64))


for _label, _call, _name in (
    ("run_decode topk 0", lambda: __import__("dsa_lab.decode").decode.run_decode(_inputs(), "native", topk=0), "topk"),
    (
        "run_decode strategy 'diagonal'",
        lambda: __import__("dsa_lab.decode").decode.run_decode(_inputs(), "diagonal"),
        "strategy",
    ),
    ("run_decode backend 5", lambda: __import__("dsa_lab.decode").decode.run_decode(_inputs(), "native", 5), "backend"),
    (
        "run_decode backend 'nope'",
        lambda: __import__("dsa_lab.decode").decode.run_decode(_inputs(), "native", "nope"),
        "nope",
    ),
    (
        "topk_per_row with NaN in a context",
        lambda: __import__("dsa_lab.topk").topk.topk_per_row(
            torch.tensor([[float("nan"), 1.0]]), torch.tensor([2], dtype=torch.int32), 1
        ),
        "NaN",
    ),
    (
        "topk_per_row with k 0",
        lambda: __import__("dsa_lab.topk").topk.topk_per_row(
            torch.zeros(1, 4), torch.tensor([4], dtype=torch.int32), 0
        ),
        "k",
    ),
    (
        "topk_per_row with a context past the row",
        lambda: __import__("dsa_lab.topk").topk.topk_per_row(
            torch.zeros(1, 4), torch.tensor([9], dtype=torch.int32), 2
        ),
        "context_lens",
    ),
    (
        "plan_atoms(3, [])",
        lambda: __import__("dsa_lab.batch.metadata").batch.metadata.plan_atoms(3, []),
        "native_sizes",
    ),
    ("plan_atoms(17, [1])", lambda: __import__("dsa_lab.batch.metadata").batch.metadata.plan_atoms(17, [1]), "next_n"),
    (
        "gather_request_keys(cache, -1, 10)",
        lambda: __import__("dsa_lab.batch.cache").batch.cache.gather_request_keys(small_cache(), -1, 10),
        "request",
    ),
    (
        "gather_request_keys(cache, 0, 10**9)",
        lambda: __import__("dsa_lab.batch.cache").batch.cache.gather_request_keys(small_cache(), 0, 10**9),
        "length",
    ),
    (
        "uniform_batch(2, 8, 16)",
        lambda: __import__("dsa_lab.batch.workload").batch.workload.uniform_batch(2, 8, 16),
        "seq_len",
    ),
    (
        "with_padding(batch, -1)",
        lambda: __import__("dsa_lab.batch.workload").batch.workload.with_padding(
            __import__("dsa_lab.batch.workload").batch.workload.uniform_batch(2, 64, 1), -1
        ),
        "padding_requests",
    ),
):
    case(AREA, _label)(lambda tmp, c=_call, n=_name: refused(c, n))


@case(AREA, "random_inputs on a device that does not exist")
def _(tmp: Path) -> Result:
    from dsa_lab.batch.workload import random_inputs, uniform_batch

    return refused(lambda: random_inputs(uniform_batch(1, 64, 1), device="cuda:7"), "cuda")
