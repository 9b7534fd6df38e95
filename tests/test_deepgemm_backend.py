"""The DeepGEMM backend on a machine without a GPU: it says why it cannot run, and its
argument plumbing (API generations, schedule slots, dtypes) is right against a stand-in module."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dsa_lab.bench.sweep import SweepPoint, skip_reason
from dsa_lab.decode import pack_launch
from dsa_lab.errors import BackendUnavailable
from dsa_lab.kernels import get_backend
from dsa_lab.kernels.deepgemm import DeepGemmBackend
from dsa_lab.kernels.registry import Availability
from dsa_lab.kernels.reference import paged_mqa_logits
from dsa_lab.metadata import build_native_metadata
from dsa_lab.workload import random_inputs, uniform_batch

NUM_SMS = 132


def test_registered_with_an_unclean_tail():
    backend = get_backend("deepgemm")
    assert isinstance(backend, DeepGemmBackend) and backend.cleans_tail is False
    assert backend.head_dims == (128,) and backend.cache_dtypes == ("fp8",)


def test_unavailable_on_cpu_with_a_reason():
    backend = get_backend("deepgemm")
    state = backend.availability(torch.device("cpu"))
    assert not state.ok and "CUDA GPU" in state.reason and "cpu" in state.reason
    with pytest.raises(BackendUnavailable, match="needs a CUDA GPU"):
        backend.require(torch.device("cpu"), 1, 64, 128, "fp8")
    point = SweepPoint("deepgemm", "native", 1, "64", 1, "fp8", 64, 128)
    assert "unavailable on cpu" in skip_reason(point, torch.device("cpu"))


class FakeDeepGemm:
    """Stands in for deep_gemm: records calls, computes with the reference, leaves a NaN tail."""

    def __init__(self, new_api: bool = True):
        self.calls: list[tuple[str, dict]] = []
        if new_api:
            self.fp8_fp4_paged_mqa_logits = self._new
        else:
            self.fp8_paged_mqa_logits = self._old

    def get_num_sms(self):
        return NUM_SMS

    def get_paged_mqa_logits_metadata(self, context_lens, block_size, slots, indices=None):
        self.calls.append(("metadata", {"shape": tuple(context_lens.shape), "block": block_size, "slots": slots}))
        return torch.zeros(slots + 1, 2, dtype=torch.int32)

    def _compute(self, q, kv, w, ctx, table, max_len, indices=None):
        if indices is not None:  # varlen: each row names its request's block-table row
            table = table[indices.long()]
        out = paged_mqa_logits(q, kv, w.float(), ctx, table, max_len, cache_dtype="fp8")
        return torch.where(torch.isfinite(out), out, torch.full_like(out, float("nan")))

    def _new(self, q, kv, w, ctx, table, schedule, max_len, indices=None):
        values, scales = q
        self.calls.append(("new", {"scales": scales, "weights": w.dtype, "indices": indices}))
        return self._compute(values, kv, w, ctx, table, max_len, indices)

    def _old(self, q, kv, w, ctx, table, schedule, max_len, clean_logits):
        self.calls.append(("old", {"clean_logits": clean_logits}))
        return self._compute(q, kv, w, ctx, table, max_len)


def sm90_backend(monkeypatch, fake: FakeDeepGemm) -> DeepGemmBackend:
    backend = DeepGemmBackend()
    backend._module, backend._origin, backend._loaded = fake, "fake", True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(backend, "availability", lambda device: Availability(True, ""))  # CPU tensors stand in for the GPU's
    return backend


def launch_for(next_n: int):
    inputs = random_inputs(uniform_batch(2, 150, next_n, num_heads=32, head_dim=128), seed=next_n)
    meta = build_native_metadata(inputs.batch, inputs.cache.block_table)
    return inputs, pack_launch(meta.launches[0], inputs), meta.max_context_len


@pytest.mark.parametrize(("next_n", "slots"), [(1, NUM_SMS), (2, NUM_SMS), (4, NUM_SMS // 2)])
def test_sm90_schedule_halves_the_slots_for_next_n_4(monkeypatch, next_n, slots):
    fake = FakeDeepGemm()
    backend = sm90_backend(monkeypatch, fake)
    _, packed, _ = launch_for(next_n)
    meta = backend.schedule(packed.context_lens, 64)
    assert fake.calls == [("metadata", {"shape": (2, next_n), "block": 64, "slots": slots})]
    assert meta.shape == (slots + 1, 2)
    assert backend.native_next_n(torch.device("cuda")) == frozenset({1, 2, 4})


@pytest.mark.parametrize("new_api", [True, False])
def test_both_api_generations_give_reference_logits_on_valid_positions(monkeypatch, new_api):
    fake = FakeDeepGemm(new_api)
    backend = sm90_backend(monkeypatch, fake)
    inputs, packed, max_len = launch_for(2)
    out = backend.logits(packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, max_len, cache_dtype="fp8")
    kind, details = fake.calls[-1]
    if new_api:
        assert kind == "new" and details["scales"] is None and details["weights"] == torch.float32
        assert details["indices"] is None
    else:
        assert kind == "old" and details["clean_logits"] is False
    ref = paged_mqa_logits(packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, max_len, cache_dtype="fp8")
    valid = torch.isfinite(ref)
    assert out.dtype == torch.float32 and torch.equal(out[valid], ref[valid])
    assert torch.isnan(out[~valid]).all()  # the tail is not cleaned: callers must mask it


def test_sm100_uses_the_varlen_form_with_bf16_weights(monkeypatch):
    fake = FakeDeepGemm()
    backend = sm90_backend(monkeypatch, fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    inputs, packed, max_len = launch_for(3)
    schedule = backend.schedule(packed.context_lens, 64)
    assert fake.calls[-1] == ("metadata", {"shape": (6, 1), "block": 64, "slots": NUM_SMS})
    out = backend.logits(packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, max_len, schedule, cache_dtype="fp8")
    _, details = fake.calls[-1]
    ref = paged_mqa_logits(packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, max_len, cache_dtype="fp8")
    valid = torch.isfinite(ref)
    rel = (out[valid] - ref[valid]).norm() / ref[valid].norm()
    assert out.dtype == torch.float32 and rel < 1e-2  # bf16 weights: ~1e-3
    assert details["weights"] == torch.bfloat16
    assert details["scales"].shape == (6, 1, 32) and int(details["scales"][0, 0, 0]) == 0x7F7F7F7F
    assert details["indices"].tolist() == [0, 0, 0, 1, 1, 1]
    assert backend.native_next_n(torch.device("cpu")) is None


def test_missing_module_is_reported_not_hidden(monkeypatch):
    backend = DeepGemmBackend()
    backend._module, backend._origin, backend._loaded = None, "deep_gemm: ImportError: nope", True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    state = backend.availability(torch.device("cuda"))
    assert not state.ok and "could not be imported" in state.reason and "nope" in state.reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "compute capability 8.0" in backend.availability(torch.device("cuda")).reason
    stub = SimpleNamespace(get_paged_mqa_logits_metadata=None, __version__="0.1")
    backend._module = stub
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert "no paged MQA logits API" in backend.availability(torch.device("cuda")).reason
