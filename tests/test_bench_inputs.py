"""What a point is checked and timed on: the device-side paged cache, and the numerics (K scales, check
tolerance) decided per backend and platform."""

from __future__ import annotations

import pytest
import torch
from bench_support import tiny

from dsa_lab.batch.cache import build_paged_cache, gather_request_keys, random_paged_cache, split_block
from dsa_lab.bench import numerics
from dsa_lab.bench.sweep import run_sweep
from dsa_lab.kernels.reference import paged_mqa_logits
from dsa_lab.store import folders as store

# ---------------------------------------------------------------- inputs


def test_device_side_cache_holds_what_the_reference_path_reads():
    lens = [130, 1, 64]
    cache = random_paged_cache(lens, 64, 64, "fp8", seed=3, chunk_tokens=50)
    used = torch.cat([cache.block_table[b, : -(-n // 64)] for b, n in enumerate(lens)])
    assert len(set(used.tolist())) == used.numel()  # each block belongs to one request
    keys = [gather_request_keys(cache, b, n) for b, n in enumerate(lens)]
    assert all(torch.isfinite(k).all() and k.abs().max() > 0.5 for k in keys)
    rebuilt = build_paged_cache(keys, 64, "fp8", seed=9)  # FP8 re-quantises its own values exactly
    q = torch.randn(3, 1, 32, 64).to(torch.float8_e4m3fn)
    w = torch.randn(3, 32)
    ctx = torch.tensor([[130], [1], [64]], dtype=torch.int32)
    a = paged_mqa_logits(q, cache.data, w, ctx, cache.block_table, 130, cache_dtype="fp8")
    b = paged_mqa_logits(q, rebuilt.data, w, ctx, rebuilt.block_table, 130, cache_dtype="fp8")
    assert torch.equal(a, b)


def test_device_side_cache_with_power_of_two_scales():
    """ue8m0: the same keys (same seed), each FP8 token's scale rounded up to a power of two, as
    `quantize_fp8(..., ue8m0=True)` does; the keys a kernel reads differ by the FP8 rounding only."""
    lens = [130, 70]
    plain = random_paged_cache(lens, 64, 64, "fp8", seed=5, chunk_tokens=64)
    pow2 = random_paged_cache(lens, 64, 64, "fp8", seed=5, chunk_tokens=64, ue8m0=True)
    assert torch.equal(plain.block_table, pow2.block_table)
    for b, n in enumerate(lens):
        blocks = pow2.block_table[b, : -(-n // 64)].long()
        scales = split_block(pow2)[1][blocks].reshape(-1)[:n]
        assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))  # powers of two
        assert not torch.equal(scales, split_block(plain)[1][blocks].reshape(-1)[:n])
        a, k = gather_request_keys(plain, b, n), gather_request_keys(pow2, b, n)
        assert ((a - k).norm() / a.norm()) < 0.05  # same keys, re-rounded
    with pytest.raises(ValueError, match="ue8m0=1"):
        random_paged_cache(lens, 64, ue8m0=1)
    mx = random_paged_cache(lens, 64, 64, "mxfp4", seed=5, ue8m0=True)  # MXFP4 scales are powers of two anyway
    assert torch.equal(mx.data, random_paged_cache(lens, 64, 64, "mxfp4", seed=5).data)


# ---------------------------------------------------------------- numerics per backend and platform


def _fake_capability(monkeypatch, capability, deepgemm_available=True):
    from dsa_lab.env_info import environment_facts
    from dsa_lab.kernels.deepgemm import DeepGemmBackend
    from dsa_lab.kernels.descriptor import Availability

    environment_facts()  # cached before torch.cuda is faked: provenance describes this machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    state = Availability(True, "") if deepgemm_available else Availability(False, "faked away")
    monkeypatch.setattr(DeepGemmBackend, "availability", lambda self, device: state)


def test_numerics_are_decided_per_backend_and_capability(monkeypatch):
    cpu = torch.device("cpu")
    assert numerics.backend_numerics("deepgemm", cpu) == numerics.DEFAULT  # unavailable here: points skipped
    assert numerics.cache_k_scales("fp8", ("deepgemm", "reference"), cpu) == "float32"
    _fake_capability(monkeypatch, (10, 0))
    sm100 = numerics.backend_numerics("deepgemm", cpu)
    assert (sm100.k_scales, sm100.tolerance) == ("ue8m0", 1e-2) and "bf16" in sm100.reason
    assert sm100.check_tolerance(1e-3) == (1e-2, sm100.reason)
    assert sm100.check_tolerance(0.05) == (0.05, "the spec's check_tolerance")  # never tighter than the spec
    assert numerics.backend_numerics("reference", cpu) == numerics.DEFAULT
    assert numerics.cache_k_scales("fp8", ("triton", "deepgemm"), cpu) == "ue8m0"  # one cache, shared
    assert numerics.cache_k_scales("fp8", ("triton",), cpu) == "float32"
    assert numerics.cache_k_scales("mxfp4", ("triton",), cpu) == "ue8m0"
    record = numerics.numerics_record(("deepgemm", "reference"), ("fp8",), 1e-3, cpu)
    assert record["backends"]["deepgemm"]["check_tolerance"] == 1e-2
    assert record["backends"]["reference"] == {
        "k_scales": "float32",
        "check_tolerance": 1e-3,
        "reason": "the spec's check_tolerance",
    }
    assert record["cache_k_scales"] == {"fp8": "ue8m0"}
    for capability in ((9, 0), (12, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert numerics.backend_numerics("deepgemm", cpu) == numerics.DEFAULT
    with pytest.raises(ValueError, match="k_scales='fp32'"):
        numerics.Numerics("fp32")


def test_reference_sweep_records_its_numerics(tmp_path):
    run_sweep(tiny(next_n=(1,)), tmp_path / "run", "cpu", progress=False)
    loaded = store.load_run(tmp_path / "run")
    ok = loaded.results[loaded.results["status"] == "ok"]
    assert len(ok) and (ok["check_tolerance"] == 1e-3).all() and (ok["k_scales"] == "float32").all()
    assert (ok["tolerance_reason"] == "the spec's check_tolerance").all()
    assert loaded.provenance["numerics"]["backends"]["reference"]["check_tolerance"] == 1e-3
    assert loaded.provenance["numerics"]["cache_k_scales"] == {"fp8": "float32"}
