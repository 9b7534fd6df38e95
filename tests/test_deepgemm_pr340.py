"""The DeepGEMM PR #340 backend without a GPU: where its module comes from (a user's build, under a
private name beside the vendored deep_gemm), what it records of its origin, why it cannot run, and
its SM90 plumbing (native next_n {1, 2, 3}, one schedule slot an SM) against a stand-in module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dsa_lab.bench.sweep import SweepPoint, skip_reason
from dsa_lab.decode import native_sizes_for
from dsa_lab.errors import UnsupportedShape
from dsa_lab.kernels import backend_names, get_backend
from dsa_lab.kernels import deepgemm_pr340 as pr
from dsa_lab.kernels.descriptor import Availability
from tests.test_deepgemm_backend import NUM_SMS, FakeDeepGemm, launch_for, reference


def fake_build(root: Path, version: str = "2.5.0", origin: str | None = "deepseek-ai/DeepGEMM@57b90e0 (test)") -> Path:
    """A folder laid out like a PR #340 build: deep_gemm/__init__.py (+ ORIGIN)."""
    package = root / "deep_gemm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"from . import helper\n__version__ = {version!r}\n")
    (package / "helper.py").write_text("VALUE = 340\n")  # a relative import must resolve inside the build
    if origin is not None:
        (package / pr.ORIGIN_FILE).write_text(origin + "\n")
    return root


@pytest.fixture
def clean_module():
    """This process as a fresh one for the PR #340 module, which imports one build a process."""
    sys.modules.pop(pr.MODULE_NAME, None)
    pr._LOADED.clear()
    yield
    sys.modules.pop(pr.MODULE_NAME, None)
    pr._LOADED.clear()


def test_registered_beside_the_vendored_deepgemm():
    assert {"deepgemm", "deepgemm-pr340"} <= set(backend_names())
    backend = get_backend("deepgemm-pr340")
    assert isinstance(backend, pr.DeepGemmPR340Backend) and backend.cleans_tail is False
    assert backend.supported_majors == (9,)


def test_without_the_variable_it_says_what_to_set(monkeypatch, clean_module):
    monkeypatch.delenv(pr.ENV_VAR, raising=False)
    module, why = pr.import_pr340()
    assert module is None and pr.ENV_VAR in why and "PR #340" in why


def test_a_folder_without_the_package_is_named(tmp_path, clean_module):
    module, why = pr.import_pr340(str(tmp_path))
    assert module is None and str(tmp_path) in why and "deep_gemm/__init__.py" in why


def test_a_failing_import_is_reported_and_leaves_no_half_module(tmp_path, clean_module):
    package = tmp_path / "deep_gemm"
    package.mkdir()
    (package / "__init__.py").write_text("from . import _C\n")  # no extension built
    module, why = pr.import_pr340(str(tmp_path))
    assert module is None and "importing deep_gemm ended its process" in why and "ImportError" in why
    assert pr.MODULE_NAME not in sys.modules


def test_a_build_imports_under_its_own_name_with_its_origin(tmp_path, clean_module):
    vendored = sys.modules.get("deep_gemm")
    module, origin = pr.import_pr340(str(fake_build(tmp_path)))
    assert module is not None and module.__name__ == pr.MODULE_NAME and module.helper.VALUE == 340
    assert module.__version__ == "2.5.0" and origin == "deepseek-ai/DeepGEMM@57b90e0 (test)"
    assert sys.modules.get("deep_gemm") is vendored  # the vendored name is left alone
    again, _ = pr.import_pr340(str(tmp_path))
    assert again is module  # imported once per process


def test_a_build_without_origin_says_so(tmp_path, clean_module):
    _, origin = pr.import_pr340(str(fake_build(tmp_path, origin=None)))
    assert origin.startswith("unrecorded build") and str(tmp_path) in origin


def test_environment_facts_record_the_build(tmp_path, monkeypatch, clean_module):
    from dsa_lab import env_info

    monkeypatch.setenv(pr.ENV_VAR, str(fake_build(tmp_path, version="2.5.0+pr340")))
    env_info.environment_facts.cache_clear()
    try:
        assert env_info.environment_facts(["reference"])["deepgemm_pr340_origin"] is None  # not asked: not run
        assert pr.MODULE_NAME not in sys.modules
        facts = env_info.environment_facts(["reference", "deepgemm-pr340"])
        assert facts["deepgemm_pr340"] == "2.5.0+pr340" and "57b90e0" in facts["deepgemm_pr340_origin"]
    finally:
        env_info.environment_facts.cache_clear()


def test_unavailable_on_cpu_with_a_reason():
    backend = get_backend("deepgemm-pr340")
    state = backend.availability(torch.device("cpu"))
    assert not state.ok and "deepgemm-pr340" in state.reason and "SM90" in state.reason and "cpu" in state.reason
    point = SweepPoint("deepgemm-pr340", "native", 3, "64", 1, "fp8", 64, 128)
    assert "unavailable on cpu" in skip_reason(point, torch.device("cpu"))


def test_other_architectures_are_refused_by_name(monkeypatch):
    backend = pr.DeepGemmPR340Backend()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability in ((10, 0), (12, 0), (8, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        state = backend.availability(torch.device("cuda"))
        assert not state.ok and f"{capability[0]}.{capability[1]}" in state.reason and "SM90" in state.reason


def sm90_pr340(monkeypatch, fake: FakeDeepGemm) -> pr.DeepGemmPR340Backend:
    backend = pr.DeepGemmPR340Backend()
    backend._module, backend._origin, backend._loaded = fake, "fake", True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(backend, "availability", lambda device: Availability(True, ""))
    return backend


@pytest.mark.parametrize("next_n", [1, 2, 3])
def test_sm90_native_1_to_3_with_one_slot_an_sm(monkeypatch, next_n):
    fake = FakeDeepGemm()
    backend = sm90_pr340(monkeypatch, fake)
    inputs, packed, max_len = launch_for(next_n)
    schedule = backend.schedule(packed.context_lens, 64, packed.block_table)
    assert fake.calls == [("metadata", {"shape": (2, next_n), "block": 64, "slots": NUM_SMS})]
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
    ref = reference(packed, inputs.cache, max_len)
    valid = torch.isfinite(ref)
    assert valid.any() and torch.equal(out[valid], ref[valid])
    cuda = torch.device("cuda")
    assert backend.native_next_n(cuda) == frozenset({1, 2, 3})
    assert native_sizes_for(backend, cuda) == (1, 2, 3)


def test_next_n_4_is_not_native_and_says_what_to_use(monkeypatch):
    backend = sm90_pr340(monkeypatch, FakeDeepGemm())
    with pytest.raises(UnsupportedShape, match=r"next_n=4: backend 'deepgemm-pr340'.*\[1, 2, 3\].*'atom'"):
        backend.require(torch.device("cuda"), 4, 64, 128, "fp8")
