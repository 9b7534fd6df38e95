"""One call object (issue 30): a backend's `logits` and `step` take a `LogitsCall`, checked when made, and a
backend written for DeepGEMM's eight arguments keeps working, warned once naming what changed."""

from __future__ import annotations

import warnings

import pytest
import torch

from dsa_lab.batch.metadata import build_native_metadata
from dsa_lab.batch.workload import DecodeBatch, random_inputs
from dsa_lab.decode import launch_call, pack_launch, run_decode
from dsa_lab.kernels import LogitsCall, get_backend
from dsa_lab.kernels.reference import ReferenceBackend

BATCH = DecodeBatch(seq_lens=(70, 130), decode_lens=(2, 2), next_n=2, num_heads=32, head_dim=64)
INPUTS = random_inputs(BATCH, seed=3)
PACKED = pack_launch(build_native_metadata(BATCH, INPUTS.cache.block_table).launches[0], INPUTS)
CALL = launch_call(PACKED, INPUTS.cache, BATCH.max_seq_len)
EXPECTED = get_backend("reference").logits(CALL)


def _defined_quietly(body: dict) -> type:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a backend of the new form is not warned about
        return type("NewForm", (ReferenceBackend,), {"name": "new-form", "baseline": False, **body})


def test_a_call_is_checked_when_made_naming_the_field() -> None:
    for change, named in (
        ({"weights": PACKED.weights[:, :4]}, r"weights: expected shape"),
        ({"max_context_len": 0}, r"max_context_len=0"),
        ({"cache_dtype": "int4"}, r"cache_dtype='int4'"),
        ({"context_lens": PACKED.context_lens.long()}, r"context_lens: dtype"),
    ):
        with pytest.raises(ValueError, match=named):
            LogitsCall(**{**vars(CALL), **change})
    with pytest.raises(ValueError, match=r"cache: expected a PagedCache"):
        launch_call(PACKED, INPUTS.cache.data, BATCH.max_seq_len)
    assert CALL.args == (PACKED.q, INPUTS.cache.data, PACKED.weights, PACKED.context_lens, PACKED.block_table, 130)
    assert CALL.rows == 4 and CALL.schedule is None and CALL.scheduled("plan").schedule == "plan"


def test_a_backend_of_the_new_form_reads_the_call_and_is_not_warned() -> None:
    seen = []
    cls = _defined_quietly({"logits": lambda self, call: seen.append(call) or ReferenceBackend.logits(self, call)})
    out = cls().logits(CALL)
    assert seen == [CALL] and torch.equal(out, EXPECTED)


def test_a_backend_written_for_the_eight_arguments_is_handed_them_and_warned_once() -> None:
    handed = []

    def logits(self, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule=None, *, cache_dtype):
        handed.append((q, kv_cache, weights, context_lens, block_table, max_context_len, schedule, cache_dtype))
        return super(type(self), self).logits(q, kv_cache, weights, context_lens, block_table, max_context_len,
                                              schedule, cache_dtype=cache_dtype)  # fmt: skip

    with pytest.warns(FutureWarning, match=r"Old\.logits reads DeepGEMM's eight arguments .* now takes one LogitsCall"):
        cls = type("Old", (ReferenceBackend,), {"name": "old", "baseline": False, "logits": logits})
    out = cls().logits(CALL.scheduled("plan"))
    assert torch.equal(out, EXPECTED)
    assert handed == [(*CALL.args, "plan", "fp8")]


def test_a_backend_reading_star_args_positionally_gets_deepgemms_order() -> None:
    """What the battery's mutants and many plug-ins do: `logits(self, *args, **kwargs)`, args[4] the block table."""

    def logits(self, *args, **kwargs):
        type(self).tables.append(args[4])
        return ReferenceBackend.logits(self, *args, **kwargs)

    with pytest.warns(FutureWarning):
        cls = type("Star", (ReferenceBackend,), {"name": "star", "baseline": False, "logits": logits, "tables": []})
    result = run_decode(INPUTS, "native", cls())
    assert cls.tables and all(table is PACKED.block_table for table in cls.tables)
    assert torch.equal(result.logits, run_decode(INPUTS, "native", "reference").logits)


def test_a_caller_may_still_pass_the_eight_arguments() -> None:
    for name in ("reference", "triton"):
        backend = get_backend(name)
        out = backend.logits(*CALL.args, cache_dtype="fp8")
        assert torch.allclose(out, EXPECTED, rtol=1e-3, atol=1e-3, equal_nan=True), name
    with pytest.raises(TypeError, match="cache_dtype"):
        get_backend("reference").logits(*CALL.args)


def test_a_fused_step_of_either_form_gets_k_and_the_longest_context() -> None:
    got = {}

    def new(self, call, *, topk, max_seq_len):
        got["new"] = (call, topk, max_seq_len)
        return torch.zeros(call.rows, topk, dtype=torch.int32)

    def old(self, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule=None, *, cache_dtype,
            topk, max_seq_len):  # fmt: skip
        got["old"] = (q, cache_dtype, topk, max_seq_len)
        return torch.zeros(weights.shape[0], topk, dtype=torch.int32)

    fused = _defined_quietly({"fuses_topk": True, "step": new})()
    assert fused.step(CALL, topk=8, max_seq_len=130).shape == (4, 8) and got["new"] == (CALL, 8, 130)
    with pytest.warns(FutureWarning, match=r"OldFused\.step"):
        cls = type("OldFused", (ReferenceBackend,), {"name": "old-fused", "fuses_topk": True, "step": old})
    assert cls().step(CALL, topk=8, max_seq_len=130).shape == (4, 8) and got["old"] == (CALL.q, "fp8", 8, 130)
    with pytest.raises(NotImplementedError, match="does not fuse the top-k"):
        get_backend("reference").step(CALL, topk=8, max_seq_len=130)
