"""The contract every registered backend keeps, checked over `backend_names()` so that a new backend
gets it by registering: its descriptor declares what the layers above read; where it can run here its
every output element is written (into poisoned memory) and matches the reference on ragged contexts;
where it cannot, it says why, naming itself; and its tuning knobs reach the kernel through the
`config` axis."""

from __future__ import annotations

import pytest
import torch

from dsa_lab import axes
from dsa_lab.batch.metadata import build_native_metadata
from dsa_lab.batch.workload import DecodeBatch, random_inputs
from dsa_lab.bench.presets import PRESETS, preset
from dsa_lab.bench.sweep import run_sweep
from dsa_lab.bench.timing import TimingConfig
from dsa_lab.decode import launch_call, pack_launch
from dsa_lab.env_info import PACKAGES
from dsa_lab.errors import BackendUnavailable, UnsupportedShape
from dsa_lab.kernels import backend_names, baseline_backend, get_backend, vllm_backend
from dsa_lab.kernels.descriptor import ModelTraits, Numerics
from dsa_lab.model.gpus import ARCH_MAJORS
from dsa_lab.store import folders as store

CPU = torch.device("cpu")


@pytest.mark.parametrize("name", backend_names())
def test_every_backend_declares_what_the_layers_above_read(name: str) -> None:
    backend = get_backend(name)
    assert backend.name == name and backend.family and backend.label and len(backend.marker) == 1
    assert {p.partition(":")[0] for p in backend.presets} <= set(PRESETS)  # a preset, or PRESET:PART of one
    for major, sizes in backend.native_sizes.items():
        assert isinstance(major, int) and list(sizes) == sorted(set(sizes)) and 1 <= sizes[0] and sizes[-1] <= 16
    assert all(isinstance(n, Numerics) for n in backend.numerics.values())
    assert set(backend.model_traits) <= set(ARCH_MAJORS)
    assert all(isinstance(t, ModelTraits) for t in backend.model_traits.values())
    recorded = {*backend.environment(), *PACKAGES}
    assert set(backend.resume_fields) <= recorded and set(backend.versions) <= recorded
    if backend.config_space is not None:
        assert backend.configured("rule") is backend and backend.config_space.knobs


def test_one_baseline_one_backend_vllm_runs_and_every_backend_in_a_preset() -> None:
    assert [n for n in backend_names() if get_backend(n).baseline] == [baseline_backend().name]
    assert [n for n in backend_names() if get_backend(n).in_vllm] == [vllm_backend().name]
    joined = {n for p in PRESETS for n in preset(p).backend}
    assert joined == set(backend_names())  # no backend is left out of every preset


def _ragged_launch():
    """A native launch with contexts that differ per request and per row (and cross block boundaries)."""
    heads = 32
    batch = DecodeBatch(seq_lens=(70, 200, 129), decode_lens=(2, 2, 2), next_n=2, num_heads=heads, head_dim=128)
    inputs = random_inputs(batch, seed=5)
    launch = build_native_metadata(batch, inputs.cache.block_table).launches[0]
    return inputs, pack_launch(launch, inputs), batch.max_seq_len


@pytest.mark.parametrize("name", backend_names())
def test_each_backend_writes_every_element_here_or_says_why_not(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend(name)
    inputs, packed, width = _ragged_launch()
    call = launch_call(packed, inputs.cache, width)
    state = backend.availability(CPU)
    if not state.ok:
        assert state.reason
        with pytest.raises(BackendUnavailable, match=rf"backend '{name}' unavailable on cpu: "):
            backend.step(call, topk=4, max_seq_len=width) if backend.fuses_topk else backend.logits(call)
        return
    reference = baseline_backend().logits(call)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))  # poisoned outputs
    out = backend.logits(call)
    valid = torch.arange(width)[None, :] < packed.context_lens.reshape(-1, 1)
    assert not out[valid].isnan().any(), "a valid element was never written"
    assert torch.allclose(out[valid], reference[valid], rtol=1e-3, atol=1e-3)
    if backend.cleans_tail:
        assert (out[~valid] == float("-inf")).all()


def test_a_config_reaches_the_kernel_and_a_backend_without_the_knob_skips(tmp_path) -> None:
    timing = TimingConfig(warmup=1, min_samples=2, max_samples=3, max_seconds=0.01, window=2)
    spec = preset("ci").with_axes(
        backend=("reference", "triton"),
        strategy=("native",),
        context=("96",),
        next_n=(2,),
        config=("rule", "dot_rows=64/resident_weights=false"),
        timing=timing,
    )
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    rows = store.load_run(tmp_path / "run").results.set_index(["backend", "config"])
    assert rows.loc[("triton", "dot_rows=64/resident_weights=false"), "status"] == "ok"
    assert rows.loc[("triton", "rule"), "status"] == "ok"
    skipped = rows.loc[("reference", "dot_rows=64/resident_weights=false")]
    assert skipped["status"] == "skipped" and "has no tuning knobs" in skipped["message"]
    assert "config=dot_rows=64/resident_weights=false" in skipped["point_key"]
    assert "config=" not in rows.loc[("reference", "rule"), "point_key"]  # 'rule' is not part of a key
    with pytest.raises(UnsupportedShape, match=r"knobs \['blocks_per_program', 'dot_rows'"):
        get_backend("triton").configured("stages=3")
    with pytest.raises(ValueError, match=r"dot_rows='many': must be an integer"):
        get_backend("triton").configured("dot_rows=many")
    with pytest.raises(ValueError, match=r"config='stages=3': no backend of the grid takes it"):
        spec.with_axes(config=("stages=3",))
    assert axes.axis("config").old_value == "rule"
