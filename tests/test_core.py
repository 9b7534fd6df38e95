"""Workload, reference kernel and top-k: the pieces every other test stands on."""

from __future__ import annotations

import pytest
import torch

from dsa_lab.batch.cache import gather_request_keys
from dsa_lab.batch.metadata import build_native_metadata, plan_atoms
from dsa_lab.batch.workload import (
    DecodeBatch,
    mixed_length_batch,
    ragged_decode_batch,
    random_inputs,
    uniform_batch,
    with_padding,
)
from dsa_lab.decode import pack_launch, run_decode
from dsa_lab.kernels import backend_names, get_backend
from dsa_lab.kernels.reference import paged_mqa_logits
from dsa_lab.topk import compare_selections, topk_per_row


def brute_force_logits(inputs, batch: DecodeBatch) -> torch.Tensor:
    """float64, one token at a time, from the dequantised keys: the definition itself."""
    rows = []
    contexts = batch.token_context_lens()
    for t, b in enumerate(batch.token_requests()):
        k = gather_request_keys(inputs.cache, b, contexts[t]).double()
        q = inputs.q[t].double()
        scores = torch.relu(q @ k.T)  # [H, S]
        row = torch.full((batch.max_seq_len,), float("-inf"), dtype=torch.float64)
        row[: contexts[t]] = (inputs.weights[t].double()[:, None] * scores).sum(0)
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_matches_float64_definition(seed: int) -> None:
    batch = ragged_decode_batch(3, 40, 200, 4, seed=seed, num_heads=32, head_dim=64)
    inputs = random_inputs(batch, seed=seed)
    launch = build_native_metadata(batch, inputs.cache.block_table).launches[0]
    packed = pack_launch(launch, inputs)
    out = paged_mqa_logits(
        packed.q,
        inputs.cache.data,
        packed.weights,
        packed.context_lens,
        packed.block_table,
        batch.max_seq_len,
        cache_dtype="fp8",
    )
    expected = brute_force_logits(inputs, batch)
    rows = launch.token_rows.reshape(-1)
    got = out[rows >= 0][torch.argsort(rows[rows >= 0])].double()
    valid = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(got), valid)
    err = (got[valid] - expected[valid]).norm() / expected[valid].norm()
    assert err < 1e-5


def test_mxfp4_cache_runs_through_reference() -> None:
    batch = uniform_batch(2, 100, 2, num_heads=32, head_dim=128, cache_dtype="mxfp4")
    inputs = random_inputs(batch, seed=7)
    assert inputs.cache.data.shape[-1] == 68
    expected = brute_force_logits(inputs, batch)
    result = run_decode(inputs, "native", topk=16)
    valid = torch.isfinite(expected)
    assert ((result.logits.double()[valid] - expected[valid]).norm() / expected[valid].norm()) < 1e-5


def test_padding_rows_produce_empty_selections() -> None:
    batch = with_padding(uniform_batch(2, 90, 2, num_heads=32, head_dim=64), padding_requests=1, padding_tokens=3)
    result = run_decode(random_inputs(batch, seed=3), "flatten", topk=8)
    assert result.indices.shape == (batch.num_decode_tokens, 8)
    assert (result.indices[batch.num_real_tokens :] == -1).all()
    assert torch.isinf(result.logits[batch.num_real_tokens :]).all()


def test_topk_fills_minus_one_and_respects_context() -> None:
    logits = torch.randn(3, 10)
    logits[1, 5:] = 100.0  # beyond the row's context: must never be chosen
    idx = topk_per_row(logits, torch.tensor([10, 5, 2]), k=4)
    assert idx.dtype == torch.int32
    assert set(idx[0].tolist()) == set(torch.topk(logits[0], 4).indices.tolist())
    assert all(0 <= i < 5 for i in idx[1].tolist())
    assert idx[2, 2:].tolist() == [-1, -1] and sorted(idx[2, :2].tolist()) == [0, 1]


def test_compare_selections_is_tie_aware() -> None:
    scores = torch.tensor([[1.0, 5.0, 5.0, 0.0]])
    a = torch.tensor([[1, 0]], dtype=torch.int32)
    b = torch.tensor([[2, 0]], dtype=torch.int32)  # swaps a tied index: still equal
    c = torch.tensor([[1, 3]], dtype=torch.int32)  # a lower score: not equal
    assert compare_selections(a, b, scores).equal
    disagreement = compare_selections(a, c, scores)
    assert not disagreement.equal and disagreement.max_score_gap == pytest.approx(1.0)


def test_plan_atoms_prefers_fewest_launches_then_least_padding() -> None:
    sizes = (1, 2, 4)
    shapes = {n: [(p.size, p.offset) for p in plan_atoms(n, sizes)] for n in (1, 3, 5, 6, 7, 8)}
    assert shapes == {
        1: [(1, 0)],
        3: [(4, -1)],
        5: [(4, 0), (1, 4)],
        6: [(4, 0), (2, 4)],
        7: [(4, -1), (4, 3)],
        8: [(4, 0), (4, 4)],
    }
    assert [p.size for p in plan_atoms(3, sizes, allow_padding=False)] == [2, 1]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(seq_lens=(10,), decode_lens=(2,), next_n=0), "next_n"),
        (dict(seq_lens=(-1,), decode_lens=(1,), next_n=1), "seq_lens"),
        (dict(seq_lens=(10,), decode_lens=(3,), next_n=2), "decode_lens"),
        (dict(seq_lens=(10,), decode_lens=(1,), next_n=1, num_heads=48), "num_heads"),
        (dict(seq_lens=(10,), decode_lens=(1,), next_n=1, head_dim=96), "head_dim"),
        (dict(seq_lens=(10,), decode_lens=(1,), next_n=1, cache_dtype="int8"), "cache_dtype"),
        (dict(seq_lens=(10, 4), decode_lens=(1,), next_n=1), "decode_lens"),
    ],
)
def test_decode_batch_rejects_bad_input(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DecodeBatch(**kwargs)


def test_reference_rejects_bad_arguments() -> None:
    batch = uniform_batch(1, 64, 1, num_heads=32, head_dim=64)
    inputs = random_inputs(batch, seed=0)
    packed = pack_launch(build_native_metadata(batch, inputs.cache.block_table).launches[0], inputs)
    good = dict(
        q=packed.q,
        kv_cache=inputs.cache.data,
        weights=packed.weights,
        context_lens=packed.context_lens,
        block_table=packed.block_table,
        max_context_len=64,
        cache_dtype="fp8",
    )
    cases = [
        (dict(q=packed.q.float()), "q"),
        (dict(weights=packed.weights[:, :8]), "weights"),
        (dict(context_lens=packed.context_lens + 1000), "context_lens"),
        (dict(block_table=packed.block_table + 1000), "block_table"),
        (dict(kv_cache=inputs.cache.data[..., :10]), "kv_cache"),
        (dict(max_context_len=0), "max_context_len"),
    ]
    for change, field in cases:
        with pytest.raises(ValueError, match=field):
            paged_mqa_logits(**{**good, **change})


def test_registry_names_and_unknown_backend() -> None:
    assert "reference" in backend_names()
    with pytest.raises(ValueError, match="backend"):
        get_backend("no-such-kernel")
    with pytest.raises(ValueError, match="strategy"):
        run_decode(random_inputs(uniform_batch(1, 64, 1, num_heads=32, head_dim=64)), "sideways")


def test_generators_are_seeded_and_valid() -> None:
    a = mixed_length_batch(8, 100, 5000, 3, seed=4)
    assert a == mixed_length_batch(8, 100, 5000, 3, seed=4)
    assert all(100 <= x <= 5000 for x in a.seq_lens)
    r = ragged_decode_batch(6, 10, 50, 4, seed=2)
    assert all(1 <= d <= 4 for d in r.decode_lens)
    assert r.token_context_lens() == [s - d + 1 + i for s, d in zip(r.seq_lens, r.decode_lens) for i in range(d)]


def test_cli_keeps_working_when_a_command_module_lacks_a_dependency(monkeypatch, capsys) -> None:
    import builtins

    from dsa_lab import cli

    real_import = builtins.__import__

    def no_papermill(name, *args, **kwargs):
        if name == "papermill" or name.startswith("papermill."):
            raise ModuleNotFoundError("No module named 'papermill'", name="papermill")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_papermill)
    monkeypatch.delitem(__import__("sys").modules, "dsa_lab.report.cli", raising=False)
    monkeypatch.delitem(__import__("sys").modules, "dsa_lab.report.execute", raising=False)
    monkeypatch.delitem(__import__("sys").modules, "papermill", raising=False)
    assert cli.main(["policy", "--policy", "vllm_0_33_0"]) == 0
    assert cli.main(["report"]) == 2
    assert "papermill" in capsys.readouterr().err
