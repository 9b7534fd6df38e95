"""The reference backend is batch-invariant by construction: a token row's logits are the same
bits however rows are grouped into launches, on any thread count or CPU code path.

Run as a script (`python tests/test_reference_invariance.py INPUTS OUT THREADS`) this file is
also the worker the subprocess tests start under each setting.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsa_lab.batch.cache import E2M1_VALUES, MX_GROUP, PagedCache, split_block
from dsa_lab.batch.metadata import build_native_metadata
from dsa_lab.batch.workload import (
    DecodeBatch,
    DecodeInputs,
    mixed_length_batch,
    ragged_decode_batch,
    random_inputs,
    uniform_batch,
    with_padding,
)
from dsa_lab.decode import DecodeResult, pack_launch, run_decode
from dsa_lab.invariance import (
    GPU_RELATIVE_TOLERANCE,
    LOGITS_COLUMN,
    StrategiesDisagree,
    check_agreement,
    compare_strategies,
    tolerance_for,
)
from dsa_lab.kernels import reference
from dsa_lab.kernels.reference import paged_mqa_logits

STRATEGIES = ("native", "flatten", "atom")
SMALL = dict(num_heads=32, head_dim=64)

BATCHES = {
    "issue example (B=1, L=2, next_n=2)": (DecodeBatch(seq_lens=(2,), decode_lens=(2,), next_n=2), 0),
    "ragged + padding, next_n=3": (with_padding(ragged_decode_batch(4, 3, 400, 3, seed=1, **SMALL), 1, 2), 1),
    "ragged + padding, next_n=6": (with_padding(ragged_decode_batch(3, 6, 300, 6, seed=2, **SMALL), 2, 3), 2),
    "mixed lengths, next_n=4": (mixed_length_batch(4, 4, 700, 4, seed=3, **SMALL), 3),
    "uniform H=64 D=128, next_n=5": (uniform_batch(2, 150, 5), 4),
    "mxfp4 ragged + padding": (
        with_padding(ragged_decode_batch(3, 4, 300, 4, seed=5, num_heads=32, head_dim=128, cache_dtype="mxfp4"), 1, 1),
        5,
    ),
}


def decode_all(inputs: DecodeInputs, topk: int = 16) -> dict[str, DecodeResult]:
    return {s: run_decode(inputs, s, "reference", topk=topk) for s in STRATEGIES}


def valid_mask(result: DecodeResult) -> torch.Tensor:
    pos = torch.arange(result.logits.shape[1])
    return pos[None, :] < result.context_lens[:, None]


def bits(x: torch.Tensor) -> torch.Tensor:
    """The float32 bit patterns: +0.0 and -0.0 differ here, unlike in torch.equal."""
    return x.contiguous().view(torch.int32)


@pytest.mark.parametrize("name", list(BATCHES))
def test_strategies_give_bit_identical_logits(name: str) -> None:
    batch, seed = BATCHES[name]
    results = decode_all(random_inputs(batch, seed=seed))
    base = results["native"]
    valid = valid_mask(base)
    assert int(valid.sum()) == sum(batch.token_context_lens())
    for strategy, result in results.items():
        assert torch.equal(torch.isfinite(result.logits), valid), strategy
        assert torch.equal(bits(result.logits[valid]), bits(base.logits[valid])), strategy
    table = compare_strategies(results)
    assert (table[LOGITS_COLUMN] == 0.0).all() and table["top-k equal"].all(), table
    assert "agree" in check_agreement(table, tolerance_for("reference", table.attrs["scale"]))


def sub_inputs(inputs: DecodeInputs, requests: list[int]) -> DecodeInputs:
    """The same requests (same q, weights and cache blocks) as a batch of their own, in this order."""
    batch = inputs.batch
    first = [sum(batch.decode_lens[:b]) for b in range(batch.batch_size)]
    rows = [first[b] + i for b in requests for i in range(batch.decode_lens[b])]
    sub = dataclasses.replace(
        batch,
        seq_lens=tuple(batch.seq_lens[b] for b in requests),
        decode_lens=tuple(batch.decode_lens[b] for b in requests),
        num_decode_tokens=len(rows),
    )
    cache = inputs.cache
    table = cache.block_table[torch.tensor(requests)].contiguous()
    cache = PagedCache(cache.data, table, cache.head_dim, cache.cache_dtype)
    return DecodeInputs(sub, inputs.q[rows], inputs.weights[rows], cache)


@pytest.mark.parametrize("cache_dtype", ["fp8", "mxfp4"])
def test_a_row_is_the_same_alone_in_a_batch_and_permuted(cache_dtype: str) -> None:
    head_dim = 64 if cache_dtype == "fp8" else 128
    batch = with_padding(
        ragged_decode_batch(5, 4, 500, 4, seed=11, num_heads=32, head_dim=head_dim, cache_dtype=cache_dtype), 1
    )
    inputs = random_inputs(batch, seed=11)
    full = {s: r.logits for s, r in decode_all(inputs, topk=8).items()}
    first = [sum(batch.decode_lens[:b]) for b in range(batch.batch_size)]
    real = [b for b in range(batch.batch_size) if batch.decode_lens[b]]
    perm = [real[i] for i in torch.randperm(len(real), generator=torch.Generator().manual_seed(0)).tolist()]
    permuted = decode_all(sub_inputs(inputs, perm), topk=8)
    offset = 0
    for b in perm:
        alone = decode_all(sub_inputs(inputs, [b]), topk=8)
        for i in range(batch.decode_lens[b]):
            context = batch.token_context_lens()[first[b] + i]
            want = bits(full["native"][first[b] + i, :context])
            for strategy in STRATEGIES:
                assert torch.equal(bits(full[strategy][first[b] + i, :context]), want), (strategy, b, i)
                assert torch.equal(bits(alone[strategy].logits[i, :context]), want), ("alone", strategy, b, i)
                assert torch.equal(bits(permuted[strategy].logits[offset + i, :context]), want), (
                    "permuted",
                    strategy,
                    b,
                    i,
                )
        offset += batch.decode_lens[b]


def test_mxfp4_tokens_with_far_apart_group_scales() -> None:
    """Tokens whose group exponents lie further apart than one exact matmul allows take the
    fixed-order group sum; every strategy still agrees bit for bit, and other tokens get the
    same bits from either path (both are exact there)."""
    batch = ragged_decode_batch(3, 4, 200, 3, seed=7, num_heads=32, head_dim=128, cache_dtype="mxfp4")
    inputs = random_inputs(batch, seed=7)
    _, scales = split_block(inputs.cache)
    scales[:, ::5, 0] = 127 + 40  # view into the cache: every 5th slot gets a 2^80 ... 2^-40 spread
    scales[:, ::5, 3] = 127 - 40
    results = decode_all(inputs)
    valid = valid_mask(results["native"])
    for strategy, result in results.items():
        assert torch.equal(bits(result.logits[valid]), bits(results["native"].logits[valid])), strategy
    assert_matches_float64(inputs, results["native"].logits, valid)


def test_mxfp4_group_path_equals_one_matmul_where_both_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = with_padding(ragged_decode_batch(3, 4, 300, 4, seed=8, num_heads=32, head_dim=128, cache_dtype="mxfp4"), 1)
    inputs = random_inputs(batch, seed=8)
    one_matmul = decode_all(inputs)["native"].logits
    monkeypatch.setattr(reference, "mxfp4_exact_spread", lambda head_dim: -1)  # every token by groups
    grouped = decode_all(inputs)["native"].logits
    assert torch.equal(bits(one_matmul), bits(grouped))


def dequantised_float64(inputs: DecodeInputs, request: int, length: int) -> torch.Tensor:
    """K `[length, D]` in float64, decoded here from the cache bytes (not with cache.py's dequantise)."""
    cache = inputs.cache
    values, scales = split_block(cache)
    ids = cache.block_table[request, : -(-length // cache.block_size)].long()
    v, s = values[ids], scales[ids]
    if cache.cache_dtype == "fp8":
        return (v.double() * s.double()[..., None]).reshape(-1, cache.head_dim)[:length]
    table = torch.tensor(E2M1_VALUES + tuple(-x for x in E2M1_VALUES), dtype=torch.float64)
    low, high = table[(v & 0xF).long()], table[(v >> 4).long()]
    k = torch.stack([low, high], dim=-1).reshape(-1, cache.head_dim)
    scale = torch.exp2(s.reshape(-1, cache.head_dim // MX_GROUP).double() - 127)
    return (k * scale.repeat_interleave(MX_GROUP, dim=1))[:length]


def assert_matches_float64(inputs: DecodeInputs, logits: torch.Tensor, valid: torch.Tensor) -> None:
    """Each valid logit is the float64 definition rounded to float32 (relative 2^-24), up to
    float64 rounding of the head sum (1e-12 of the largest |logit|)."""
    batch = inputs.batch
    expected = torch.full(logits.shape, float("-inf"), dtype=torch.float64)
    for t, (b, context) in enumerate(zip(batch.token_requests(), batch.token_context_lens())):
        k = dequantised_float64(inputs, b, context)
        scores = torch.relu(inputs.q[t].double() @ k.T)  # [H, S]
        expected[t, :context] = (inputs.weights[t].double()[:, None] * scores).sum(0)
    assert torch.equal(torch.isfinite(expected), valid)
    got, want = logits[valid].double(), expected[valid]
    scale = float(want.abs().max())
    assert ((got - want).abs() <= 2.0**-24 * want.abs() + 1e-12 * scale).all(), float((got - want).abs().max())


@pytest.mark.parametrize(
    "name", ["ragged + padding, next_n=3", "uniform H=64 D=128, next_n=5", "mxfp4 ragged + padding"]
)
def test_reference_is_the_float64_definition_rounded_once(name: str) -> None:
    batch, seed = BATCHES[name]
    inputs = random_inputs(batch, seed=seed)
    result = run_decode(inputs, "flatten", "reference", topk=8)
    assert_matches_float64(inputs, result.logits, valid_mask(result))


@pytest.mark.parametrize("cache_dtype", ["fp8", "mxfp4"])
def test_positions_past_context_are_minus_inf_and_nothing_is_nan(cache_dtype: str) -> None:
    """Unused cache slots hold random bytes (NaN e4m3 codes, huge MXFP4 scales); the kernel's own
    output must still be -inf past every row's context, also in columns no block covers."""
    batch = with_padding(
        ragged_decode_batch(3, 4, 150, 4, seed=9, num_heads=32, head_dim=128, cache_dtype=cache_dtype), 1
    )
    inputs = random_inputs(batch, seed=9)
    launch = build_native_metadata(batch, inputs.cache.block_table).launches[0]
    packed = pack_launch(launch, inputs)
    width = batch.max_seq_len + 100
    out = paged_mqa_logits(
        packed.q,
        inputs.cache.data,
        packed.weights,
        packed.context_lens,
        packed.block_table,
        width,
        cache_dtype=cache_dtype,
    )
    context = launch.context_lens.reshape(-1, 1)
    past = torch.arange(width)[None, :] >= context
    assert not out.isnan().any()
    assert (out[past] == float("-inf")).all()
    assert torch.isfinite(out[~past]).all()


# --- the invariant under other thread counts and CPU code paths, in subprocesses ---------------
# The parent draws the inputs and hands them over: torch.randn itself gives other bits under
# ATEN_CPU_CAPABILITY=default, so each worker drawing its own would test the generator.

SETTINGS = {  # name: (threads, extra environment)
    "threads=1": (1, {}),
    "threads=2": (2, {}),
    "ATEN_CPU_CAPABILITY=default": (1, {"ATEN_CPU_CAPABILITY": "default"}),
    "ATEN_CPU_CAPABILITY=avx2": (2, {"ATEN_CPU_CAPABILITY": "avx2"}),
    "ATEN_CPU_CAPABILITY=avx512": (2, {"ATEN_CPU_CAPABILITY": "avx512"}),
    "MKL_CBWR=COMPATIBLE": (1, {"MKL_CBWR": "COMPATIBLE"}),  # MKL's conservative code path
}
WORKER_BATCHES = ("issue example (B=1, L=2, next_n=2)", "ragged + padding, next_n=6", "mxfp4 ragged + padding")


def save_inputs(path: Path) -> dict[str, DecodeInputs]:
    inputs = {name: random_inputs(BATCHES[name][0], seed=BATCHES[name][1]) for name in WORKER_BATCHES}
    torch.save(
        {
            name: {
                "batch": json.dumps(dataclasses.asdict(i.batch)),
                "q": i.q.view(torch.uint8),
                "weights": i.weights,
                "data": i.cache.data,
                "block_table": i.cache.block_table,
            }
            for name, i in inputs.items()
        },
        path,
    )
    return inputs


def load_inputs(path: Path) -> dict[str, DecodeInputs]:
    loaded = {}
    for name, saved in torch.load(path).items():
        batch = DecodeBatch(**json.loads(saved["batch"]))
        cache = PagedCache(saved["data"], saved["block_table"], batch.head_dim, batch.cache_dtype)
        loaded[name] = DecodeInputs(batch, saved["q"].view(torch.float8_e4m3fn), saved["weights"], cache)
    return loaded


def strategy_logits(inputs: dict[str, DecodeInputs]) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {s: r.logits for s, r in decode_all(i, topk=4).items()} for name, i in inputs.items()}


def _worker(inputs_path: str, folder: str, threads: int) -> None:
    torch.set_num_threads(threads)
    torch.save(strategy_logits(load_inputs(Path(inputs_path))), Path(folder) / "logits.pt")
    facts = {"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    (Path(folder) / "facts.json").write_text(json.dumps(facts))


@pytest.fixture(scope="module")
def setting_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[str, tuple[dict, dict]]]:
    """This process's logits, and one subprocess per setting: (its facts, its logits)."""
    inputs_path = tmp_path_factory.mktemp("inputs") / "inputs.pt"
    inputs = save_inputs(inputs_path)
    here = strategy_logits(inputs)
    runs = {}
    for name, (threads, extra) in SETTINGS.items():
        folder = tmp_path_factory.mktemp(name.replace("=", "_"))
        env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")])
        )
        done = subprocess.run(
            [sys.executable, __file__, str(inputs_path), str(folder), str(threads)],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{name}: worker failed\n{done.stderr[-3000:]}"
        facts = json.loads((folder / "facts.json").read_text())
        runs[name] = (facts, torch.load(folder / "logits.pt"))
    return here, runs


def test_settings_took_effect(setting_runs: tuple) -> None:
    facts = {name: run[0] for name, run in setting_runs[1].items()}
    print("\n" + "\n".join(f"{name}: {f}" for name, f in facts.items()))
    assert facts["threads=1"]["threads"] == 1 and facts["threads=2"]["threads"] == 2
    assert facts["ATEN_CPU_CAPABILITY=default"]["capability"] == "DEFAULT"
    # torch caps a capability the CPU lacks at the best one it has, never above the request
    assert facts["ATEN_CPU_CAPABILITY=avx2"]["capability"] in ("DEFAULT", "AVX2")


def test_logits_are_bitwise_equal_across_settings_and_strategies(setting_runs: tuple) -> None:
    here, runs = setting_runs
    for name, (facts, logits) in runs.items():
        for batch_name, per_strategy in here.items():
            base = per_strategy["native"]
            valid = torch.isfinite(base)
            for strategy in STRATEGIES:
                there = logits[batch_name][strategy]
                assert torch.equal(torch.isfinite(there), valid), (name, batch_name, strategy)
                assert torch.equal(bits(there[valid]), bits(base[valid])), (name, facts, batch_name, strategy)


# --- the verdict ---------------------------------------------------------------------------------


def test_check_agreement_names_what_differs() -> None:
    batch, seed = BATCHES["ragged + padding, next_n=3"]
    results = decode_all(random_inputs(batch, seed=seed))
    row = int(results["native"].context_lens.argmax())  # longer than the top-16
    col = 5

    logits = results["flatten"].logits.clone()
    logits[row, col] += 0.25
    table = compare_strategies({**results, "flatten": dataclasses.replace(results["flatten"], logits=logits)})
    with pytest.raises(StrategiesDisagree, match=r"'flatten'.*logits.*max \|diff\|.* 0\.25.*tolerance 0") as err:
        check_agreement(table, tolerance_for("reference", table.attrs["scale"]))
    assert isinstance(err.value, ValueError)
    assert "agree" in check_agreement(table, 0.5)  # within a looser tolerance the logits pass

    logits[row, col] = float("nan")
    table = compare_strategies({**results, "flatten": dataclasses.replace(results["flatten"], logits=logits)})
    with pytest.raises(StrategiesDisagree, match=r"'flatten'.*max \|diff\|.* nan"):
        check_agreement(table, 1.0)

    lens = results["atom"].context_lens.clone()
    lens[0] -= 1
    table = compare_strategies({**results, "atom": dataclasses.replace(results["atom"], context_lens=lens)})
    with pytest.raises(StrategiesDisagree, match=r"'atom'.*context lens"):
        check_agreement(table, 0.0)

    indices = results["atom"].indices.clone()
    indices[row, 0] = indices[row, -1]  # drops the best position for the 16th best
    worse = dataclasses.replace(results["atom"], indices=indices)
    table = compare_strategies({**results, "atom": worse})
    with pytest.raises(StrategiesDisagree, match=r"'atom' picks a different top-k .* in 1 of"):
        check_agreement(table, 0.0)


def test_tolerance_for_backends() -> None:
    assert tolerance_for("reference", 123.0) == 0.0
    assert tolerance_for("triton", 100.0) == pytest.approx(GPU_RELATIVE_TOLERANCE * 100.0)
    with pytest.raises(ValueError, match="backend"):
        tolerance_for("no-such-kernel", 1.0)
    with pytest.raises(ValueError, match="scale"):
        tolerance_for("triton", float("nan"))
    with pytest.raises(ValueError, match="baseline"):
        compare_strategies({}, baseline="native")


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
