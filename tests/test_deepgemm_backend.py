"""The DeepGEMM backend on a machine without a GPU: it says why it cannot run, and its
argument plumbing (API generations, schedule slots, dtypes, and the SM100 form chosen from
the device's compute capability) is right against a stand-in module that reads its inputs
the way DeepGEMM does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dsa_lab.batch.cache import build_paged_cache
from dsa_lab.batch.metadata import build_native_metadata
from dsa_lab.batch.workload import DecodeInputs, random_inputs, uniform_batch
from dsa_lab.bench.sweep import SweepPoint, skip_reason
from dsa_lab.decode import pack_launch
from dsa_lab.errors import BackendUnavailable
from dsa_lab.kernels import get_backend
from dsa_lab.kernels.deepgemm import DeepGemmBackend, ue8m0_kv_cache
from dsa_lab.kernels.descriptor import Availability
from dsa_lab.kernels.reference import paged_mqa_logits

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


def mx_to_float_scales(kv: torch.Tensor) -> torch.Tensor:
    """Undo the SM100 form: four UE8M0 bytes per token -> the float32 power of two they encode."""
    blocks, block_size, _, width = kv.shape
    out = kv.clone()
    scales = kv.view(blocks, -1)[:, block_size * (width - 4) :].view(torch.int32)
    out.view(blocks, -1)[:, block_size * (width - 4) :].view(torch.int32).copy_((scales & 0xFF) << 23)
    return out


class FakeDeepGemm:
    """Stands in for deep_gemm: records calls, computes with the reference, leaves a NaN tail.

    Varlen calls (`indices`) are read as DeepGEMM's SM100 scheduler reads them: a run of
    equal indices is one request, whose block table is the row of the run's first token;
    the cache's scales are UE8M0 bytes, and the logits come back in bf16.
    """

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
        if indices is not None:
            starts = torch.ones_like(indices, dtype=torch.bool)
            starts[1:] = indices[1:] != indices[:-1]
            first_row = torch.cummax(torch.where(starts, torch.arange(len(indices)), 0), 0).values
            table = table[first_row]
            kv = mx_to_float_scales(kv)
        out = paged_mqa_logits(q, kv, w.float(), ctx, table, max_len, cache_dtype="fp8")
        if indices is not None:
            out = out.to(torch.bfloat16)
        return torch.where(torch.isfinite(out), out, torch.full_like(out, float("nan")))

    def _new(self, q, kv, w, ctx, table, schedule, max_len, indices=None):
        values, scales = q
        self.calls.append(("new", {"scales": scales, "weights": w.dtype, "indices": indices, "kv": kv, "table": table}))
        return self._compute(values, kv, w, ctx, table, max_len, indices)

    def _old(self, q, kv, w, ctx, table, schedule, max_len, clean_logits):
        self.calls.append(("old", {"clean_logits": clean_logits}))
        return self._compute(q, kv, w, ctx, table, max_len)


def sm90_backend(monkeypatch, fake: FakeDeepGemm) -> DeepGemmBackend:
    backend = DeepGemmBackend()
    backend._module, backend._origin, backend._loaded = fake, "fake", True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(
        backend, "availability", lambda device: Availability(True, "")
    )  # CPU tensors stand in for the GPU's
    return backend


def launch_for(next_n: int, batch: int = 2, ue8m0: bool = False):
    inputs = random_inputs(uniform_batch(batch, 150, next_n, num_heads=32, head_dim=128), seed=next_n)
    if ue8m0:  # the same keys quantised with power-of-two scales, as vLLM writes the cache on SM100
        gen = torch.Generator().manual_seed(next_n)
        keys = [torch.randn(150, 128, generator=gen) for _ in range(batch)]
        cache = build_paged_cache(keys, ue8m0=True, seed=next_n)
        inputs = DecodeInputs(inputs.batch, inputs.q, inputs.weights, cache)
    meta = build_native_metadata(inputs.batch, inputs.cache.block_table)
    return inputs, pack_launch(meta.launches[0], inputs), meta.max_context_len


def reference(packed, cache, max_len):
    return paged_mqa_logits(
        packed.q, cache.data, packed.weights, packed.context_lens, packed.block_table, max_len, cache_dtype="fp8"
    )


@pytest.mark.parametrize(("next_n", "slots"), [(1, NUM_SMS), (2, NUM_SMS), (4, NUM_SMS // 2)])
def test_sm90_schedule_halves_the_slots_for_next_n_4(monkeypatch, next_n, slots):
    fake = FakeDeepGemm()
    backend = sm90_backend(monkeypatch, fake)
    _, packed, _ = launch_for(next_n)
    meta = backend.schedule(packed.context_lens, 64, packed.block_table)
    assert fake.calls == [("metadata", {"shape": (2, next_n), "block": 64, "slots": slots})]
    assert meta.shape == (slots + 1, 2)
    assert backend.native_next_n(torch.device("cuda")) == frozenset({1, 2, 4})


@pytest.mark.parametrize("new_api", [True, False])
def test_both_api_generations_give_reference_logits_on_valid_positions(monkeypatch, new_api):
    fake = FakeDeepGemm(new_api)
    backend = sm90_backend(monkeypatch, fake)
    inputs, packed, max_len = launch_for(2)
    out = backend.logits(
        packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, max_len, cache_dtype="fp8"
    )
    kind, details = fake.calls[-1]
    if new_api:
        assert kind == "new" and details["scales"] is None and details["weights"] == torch.float32
        assert details["indices"] is None
    else:
        assert kind == "old" and details["clean_logits"] is False
    ref = paged_mqa_logits(
        packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, max_len, cache_dtype="fp8"
    )
    valid = torch.isfinite(ref)
    assert out.dtype == torch.float32 and torch.equal(out[valid], ref[valid])
    assert torch.isnan(out[~valid]).all()  # the tail is not cleaned: callers must mask it


@pytest.mark.parametrize("capability", [(10, 0), (10, 3)])
@pytest.mark.parametrize("next_n", [1, 3, 5])
def test_sm100_takes_the_varlen_form_for_any_next_n(monkeypatch, capability, next_n):
    """SM100 and SM103 (B200, GB300): bf16 weights, unit MX q scales, one row per token with
    its request index, a per-token block table, UE8M0 K scales; reference logits up to bf16."""
    fake = FakeDeepGemm()
    backend = sm90_backend(monkeypatch, fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    inputs, packed, max_len = launch_for(next_n, batch=3, ue8m0=True)
    schedule = backend.schedule(packed.context_lens, 64, packed.block_table)
    assert fake.calls[-1] == ("metadata", {"shape": (3 * next_n, 1), "block": 64, "slots": NUM_SMS})
    out = backend.logits(
        packed.q,
        inputs.cache.data,
        packed.weights,
        packed.context_lens,
        packed.block_table,
        max_len,
        schedule,
        cache_dtype="fp8",
    )
    _, details = fake.calls[-1]
    assert details["weights"] == torch.bfloat16
    assert details["scales"].shape == (3 * next_n, 1, 32) and int(details["scales"][0, 0, 0]) == 0x7F7F7F7F
    assert details["indices"].tolist() == [r for r in range(3) for _ in range(next_n)]
    assert torch.equal(details["table"], packed.block_table.repeat_interleave(next_n, 0))
    ref = reference(packed, inputs.cache, max_len)
    valid = torch.isfinite(ref)
    rel = (out[valid] - ref[valid]).norm() / ref[valid].norm()
    assert out.dtype == torch.float32 and rel < 1e-2  # bf16 weights and logits: ~3e-3
    assert backend.native_next_n(torch.device("cpu")) is None


def test_sm100_needs_power_of_two_scales(monkeypatch):
    """A cache quantised without ue8m0 loses its scales' mantissas in the SM100 form: the
    reference check that precedes every timing then fails, loudly."""
    fake = FakeDeepGemm()
    backend = sm90_backend(monkeypatch, fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    inputs, packed, max_len = launch_for(2)
    out = backend.logits(
        packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, max_len, cache_dtype="fp8"
    )
    ref = reference(packed, inputs.cache, max_len)
    valid = torch.isfinite(ref)
    assert (out[valid] - ref[valid]).norm() / ref[valid].norm() > 0.05


def test_ue8m0_form_is_exact_for_power_of_two_scales():
    keys = [torch.randn(130, 128, generator=torch.Generator().manual_seed(1))]
    cache = build_paged_cache(keys, ue8m0=True)
    converted = ue8m0_kv_cache(cache.data)
    blocks, value_bytes = cache.data.shape[0], 64 * 128
    flat, flat_converted = cache.data.view(blocks, -1), converted.view(blocks, -1)
    assert torch.equal(flat_converted[:, :value_bytes], flat[:, :value_bytes])  # values untouched
    scale_bytes = flat_converted[:, value_bytes:].reshape(blocks, 64, 4)
    assert (scale_bytes == scale_bytes[..., :1]).all()  # four equal UE8M0 bytes per token
    full = cache.block_table[0, :2].long()  # the request's two full blocks: power-of-two scales, decoded exactly
    decoded = mx_to_float_scales(converted).view(blocks, -1)
    assert torch.equal(decoded[full, value_bytes:], flat[full, value_bytes:])


def test_sm100_inputs_are_derived_once_per_unchanged_tensor(monkeypatch):
    fake = FakeDeepGemm()
    backend = sm90_backend(monkeypatch, fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    inputs, packed, max_len = launch_for(2, ue8m0=True)
    args = (packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, max_len)
    backend.logits(*args, cache_dtype="fp8")
    backend.logits(*args, cache_dtype="fp8")
    first, second = fake.calls[-3][1], fake.calls[-1][1]
    assert first["kv"] is second["kv"] and first["table"] is second["table"] and first["indices"] is second["indices"]
    inputs.cache.data[0, 0, 0, 0] ^= 1  # an in-place write: the UE8M0 copy is made again
    backend.logits(*args, cache_dtype="fp8")
    assert fake.calls[-1][1]["kv"] is not first["kv"]


def test_sm120_keeps_float32_weights_and_the_plain_form(monkeypatch):
    fake = FakeDeepGemm()
    backend = sm90_backend(monkeypatch, fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    inputs, packed, max_len = launch_for(3)
    backend.logits(
        packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, max_len, cache_dtype="fp8"
    )
    details = fake.calls[-1][1]
    assert details["weights"] == torch.float32 and details["indices"] is None and details["kv"] is inputs.cache.data
    assert fake.calls[-2] == ("metadata", {"shape": (2, 3), "block": 64, "slots": NUM_SMS})


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


# ---------------------------------------------------------------- the sm100 sweep, end to end


def _sm100_sweep(monkeypatch, run_dir, numerics_table=None):
    """The sm100 preset, narrowed to a CPU-sized grid, swept with DeepGEMM (the stand-in module) and
    the reference on a faked SM100 GPU: every point checked, timed and stored as on a B200."""
    from dsa_lab.bench.presets import preset
    from dsa_lab.bench.sweep import run_sweep
    from dsa_lab.bench.timing import TimingConfig
    from dsa_lab.env_info import environment_facts
    from dsa_lab.store import folders as store

    environment_facts(("deepgemm", "reference"))  # cached before torch.cuda is faked: the run's backends, this machine
    backend = get_backend("deepgemm")
    monkeypatch.setattr(backend, "_module", FakeDeepGemm())
    monkeypatch.setattr(backend, "_origin", "fake")
    monkeypatch.setattr(backend, "_loaded", True)
    monkeypatch.setattr(DeepGemmBackend, "availability", lambda self, device: Availability(True, ""))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    if numerics_table is not None:  # what the backend declares per compute capability, replaced
        monkeypatch.setattr(DeepGemmBackend, "numerics", numerics_table)
    spec = preset("sm100").with_axes(
        backend=("deepgemm", "reference"),
        batch=(2,),
        context=("192",),
        next_n=(1, 3),
        heads=(64,),
        head_dim=(128,),
        timing=TimingConfig(warmup=1, min_samples=2, max_samples=3, max_seconds=0.01, window=2),
    )
    summary = run_sweep(spec, run_dir, "cpu", progress=False, point_timeout_s=None)
    assert summary.stop_reason == "complete"
    run = store.load_run(run_dir)
    return run, run.results.set_index(["backend", "strategy", "next_n"])


def test_sm100_sweep_checks_deepgemm_on_power_of_two_scales_at_its_own_bound(monkeypatch, tmp_path):
    run, rows = _sm100_sweep(monkeypatch, tmp_path / "sm100")
    for n in (1, 3):
        for strategy in ("native", "flatten"):
            row = rows.loc[("deepgemm", strategy, n)]
            assert row["status"] == "ok", row["message"]
            assert 1e-3 < row["rel_err"] < 1e-2  # bf16 weights and logits: above the spec's 1e-3
            assert row["check_tolerance"] == 1e-2 and "bf16" in row["tolerance_reason"]
            assert row["median_ms"] > 0
            reference = rows.loc[("reference", strategy, n)]
            assert reference["status"] == "ok" and reference["check_tolerance"] == 1e-3
        assert "same launch as native" in rows.loc[("deepgemm", "atom", n), "message"]  # SM100: any next_n native
    ok = run.results[run.results["status"] == "ok"]
    assert (ok["k_scales"] == "ue8m0").all()  # one cache per workload, built for DeepGEMM's SM100 form
    recorded = run.provenance["numerics"]
    assert recorded["backends"]["deepgemm"]["k_scales"] == "ue8m0" and recorded["cache_k_scales"] == {"fp8": "ue8m0"}
    assert recorded["backends"]["reference"]["check_tolerance"] == 1e-3


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (dict(k_scales="float32", tolerance=1e-2), "relative error"),  # float32 scales lose their mantissas
        (dict(k_scales="ue8m0", tolerance=None), "> 0.001"),  # bf16 arithmetic against the spec's 1e-3
    ],
)
def test_sm100_deepgemm_points_fail_without_either_half(monkeypatch, tmp_path, entry, expected):
    """The check can fail: without power-of-two scales, or without the SM100 bound, every DeepGEMM
    point of the sweep is recorded as failed (what an SM100 run recorded before both were added)."""
    from dsa_lab.kernels.descriptor import Numerics

    table = {10: Numerics(entry["k_scales"], entry["tolerance"], "test")}
    _, rows = _sm100_sweep(monkeypatch, tmp_path / "sm100", table)
    deepgemm = rows.loc["deepgemm"]
    checked = deepgemm[deepgemm["status"] != "skipped"]
    assert len(checked) == 4 and (checked["status"] == "failed").all()
    assert checked["message"].str.contains(expected, regex=False).all()
    assert (rows.loc["reference"].query("status != 'skipped'")["status"] == "ok").all()
