"""The decode policies on hand-picked cases, the decision matrix, and the policy / env commands."""

from __future__ import annotations

import socket

import pytest
import torch

from dsa_lab.cli import main
from dsa_lab.env_info import detect_platform, environment_facts
from dsa_lab.policy.query import Decision, Platform, PolicyQuery
from dsa_lab.policy.steps import step_path, step_uses_native
from dsa_lab.policy.vllm import (
    POLICIES,
    RELEASES,
    all_platforms,
    before_pr45322,
    decision_matrix,
    fp4_rejection_0_33,
    indexer_builder,
    pr45322,
    pr52164,
    vllm_0_33_0,
)

SM90 = Platform("sm90", True)
SM100 = Platform("sm100", True)
SM120 = Platform("sm120", True)
ROCM = Platform("rocm", False)
MI355X = Platform("rocm", False, 4, aiter=True)
V4 = "DeepseekV4ForCausalLM"
V41 = "DeepseekV41ForCausalLM"


def path(policy, platform: Platform, next_n: int, **kw) -> str:
    return policy(PolicyQuery(platform, next_n, **kw)).path


def test_policies_are_registered_in_release_order() -> None:
    assert list(POLICIES) == ["before_pr45322", "pr45322", "pr52164", "vllm_0_33_0"]


def test_vllm_0_33_on_sm90_flattens_3_and_5_up() -> None:
    assert [path(vllm_0_33_0, SM90, n) for n in range(1, 9)] == ["native"] * 2 + ["flatten", "native"] + ["flatten"] * 4
    # without DeepGEMM vLLM does not ask the kernel: only next_n in {1, 2} stay native
    assert path(vllm_0_33_0, Platform("sm90", False), 4) == "flatten"


def test_vllm_0_33_on_sm100_never_flattens() -> None:
    for n in range(1, 17):
        decision = vllm_0_33_0(PolicyQuery(SM100, n))
        assert not decision.use_flattening and decision.path == "varlen" and "varlen" in decision.reason
        assert pr45322(PolicyQuery(SM100, n)).path == "native"
        assert pr45322(PolicyQuery(SM100, n, fp4_cache=True)).path == "native"
    # vLLM 0.33 without DeepGEMM on SM100 falls back to {1, 2}
    assert path(vllm_0_33_0, Platform("sm100", False), 3) == "flatten"


def test_adaptive_verification_is_accepted_where_the_indexer_backend_takes_device_lens() -> None:
    """SM90 + DeepGEMM flattens, SM100 + DeepGEMM keeps varlen, ROCm flattens for V4 / V4.1;
    everywhere else vLLM refuses adaptive verification at startup."""
    for n in (1, 2, 4):
        assert path(vllm_0_33_0, SM90, n, adaptive_verification=True) == "flatten"
        assert path(vllm_0_33_0, SM100, n, adaptive_verification=True) == "varlen"
        assert path(vllm_0_33_0, SM120, min(n, 2), adaptive_verification=True) == "rejected"
    assert path(vllm_0_33_0, ROCM, 2, adaptive_verification=True) == "rejected"
    assert path(vllm_0_33_0, ROCM, 2, adaptive_verification=True, model_arch=V4) == "flatten"
    assert path(vllm_0_33_0, Platform("sm90", False), 2, adaptive_verification=True) == "rejected"
    assert "adaptive" in vllm_0_33_0(PolicyQuery(SM90, 1, adaptive_verification=True)).reason
    refused = vllm_0_33_0(PolicyQuery(SM120, 2, adaptive_verification=True, model_arch=V41))
    assert "DeepseekV41IndexerBackend" in refused.reason and refused.reason.endswith("rejected at startup")


def test_rocm_mxfp4_builder_is_native_for_every_next_n_from_2() -> None:
    """DeepSeek-V4 / V4.1 with the MXFP4 cache on a CDNA4 GPU with aiter: the ROCm builder.
    It always sets use_flattening, and launches full uniform steps as next_n-row sequences."""
    for arch in (V4, V41):
        q = PolicyQuery(MI355X, 3, fp4_cache=True, model_arch=arch)
        assert indexer_builder(q) == "rocm_mxfp4"
        decision = vllm_0_33_0(q)
        assert decision == Decision(True, True, decision.reason, "native", "rocm_mxfp4")
        assert [path(vllm_0_33_0, MI355X, n, fp4_cache=True, model_arch=arch) for n in range(1, 9)] == (
            ["flatten"] + ["native"] * 7
        )
        assert path(vllm_0_33_0, MI355X, 4, fp4_cache=True, adaptive_verification=True, model_arch=arch) == "flatten"
    # the same GPU with the FP8 cache, or V3.2, keeps the dense builder
    assert indexer_builder(PolicyQuery(MI355X, 3, model_arch=V4)) == "dense"
    assert path(vllm_0_33_0, MI355X, 3, model_arch=V4) == "flatten"
    assert path(vllm_0_33_0, MI355X, 3, fp4_cache=True) == "rejected"


def test_rocm_mxfp4_steps_are_native_only_when_full() -> None:
    q = PolicyQuery(MI355X, 4, fp4_cache=True, model_arch=V4)
    assert [step_uses_native(q, m) for m in (1, 2, 3, 4)] == [False, False, False, True]
    assert not step_uses_native(q, 4, uniform=False)
    assert step_path(q, 3) == "flatten"
    # the dense builder ignores `uniform`: a native builder sends ragged requests to prefill
    assert step_uses_native(PolicyQuery(SM90, 4), 4, uniform=False)
    with pytest.raises(ValueError, match="uniform"):
        step_uses_native(q, 4, uniform=1)  # type: ignore[arg-type]


def test_fp4_rejections_follow_vllms_order_of_checks() -> None:
    def why(platform: Platform, arch: str = V4) -> str | None:
        return fp4_rejection_0_33(PolicyQuery(platform, 2, fp4_cache=True, model_arch=arch))

    assert "DeepSeek-V4" in why(Platform("rocm", False, 3), "DeepseekV32ForCausalLM")  # model first
    assert "CDNA4" in why(Platform("rocm", False, 3, aiter=True))  # then the generation
    assert "aiter" in why(Platform("rocm", False, 4))  # then aiter
    assert why(MI355X) is None and why(SM100) is None and why(Platform("sm100", False)) is None
    assert "SM10x" in why(SM120)
    assert fp4_rejection_0_33(PolicyQuery(SM90, 2)) is None  # no MXFP4 cache, nothing to refuse


def test_platform_names_its_rocm_generation() -> None:
    assert ROCM.cdna == 3 and ROCM == Platform("rocm", False, 3)  # unnamed generation: MI300
    assert ROCM.name == "rocm-cdna3" and MI355X.label == "rocm-cdna4+aiter"
    assert SM90.name == "sm90" and SM90.label == "sm90+dg"
    with pytest.raises(ValueError, match="ROCm only"):
        Platform("sm90", True, 4)
    with pytest.raises(ValueError, match="ROCm only"):
        Platform("sm100", True, aiter=True)
    with pytest.raises(ValueError, match="cdna"):
        Platform("rocm", False, 7)
    with pytest.raises(ValueError, match="aiter"):
        Platform("rocm", False, 4, aiter="yes")  # type: ignore[arg-type]


def test_sm120_with_deep_gemm_still_flattens_above_2_in_0_33() -> None:
    assert [path(vllm_0_33_0, SM120, n) for n in (1, 2, 3, 4)] == ["native", "native", "flatten", "flatten"]


def test_history_of_the_sm90_and_fp4_rules() -> None:
    assert path(before_pr45322, SM100, 4) == "native"
    assert path(before_pr45322, SM100, 4, fp4_cache=True) == "flatten"
    assert path(pr45322, SM100, 4, fp4_cache=True) == "native"
    assert path(pr45322, SM90, 4) == "flatten"
    assert path(pr52164, SM90, 4) == "native"
    assert path(pr52164, SM90, 3) == "flatten"
    for policy in POLICIES.values():
        assert path(policy, SM90, 2) == "native"
        assert path(policy, SM90, 5) == "flatten"
        assert path(policy, SM90, 2, fp4_cache=True) == "rejected"
    assert path(vllm_0_33_0, MI355X, 2, fp4_cache=True, model_arch=V4) == "native"
    assert path(vllm_0_33_0, ROCM, 2, fp4_cache=True, model_arch=V4) == "rejected"  # CDNA3
    assert path(vllm_0_33_0, MI355X, 2, fp4_cache=True) == "rejected"  # V3.2


def test_per_step_rule_of_vllm_0_33() -> None:
    q = PolicyQuery(SM90, 4)
    assert [step_uses_native(q, m) for m in (1, 2, 3, 4)] == [True, True, False, True]
    assert step_path(q, 3) == "flatten"
    assert not step_uses_native(PolicyQuery(SM90, 4, adaptive_verification=True), 2)
    assert step_path(PolicyQuery(SM100, 6), 3) == "varlen"
    assert [step_uses_native(PolicyQuery(SM90, 3), m) for m in (1, 2, 3)] == [False] * 3  # builder flattened
    with pytest.raises(ValueError, match="max_decode_len"):
        step_uses_native(q, 5)
    with pytest.raises(ValueError, match="rejected"):
        step_uses_native(PolicyQuery(SM90, 2, fp4_cache=True), 1)


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="family"):
        Platform("sm89", True)
    with pytest.raises(ValueError, match="has_deep_gemm"):
        Platform("sm90", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="next_n"):
        PolicyQuery(SM90, 0)
    with pytest.raises(ValueError, match="model_arch"):
        PolicyQuery(SM90, 2, model_arch="Llama")
    with pytest.raises(ValueError, match="path"):
        Decision(False, False, "", "sideways")
    with pytest.raises(ValueError, match="inconsistent"):
        Decision(True, True, "", "native")
    with pytest.raises(ValueError, match="policy"):
        decision_matrix(["vllm_9"])


def test_decision_matrix_is_tidy() -> None:
    frame = decision_matrix(next_ns=range(1, 5), fp4=(False, True), adaptive=(False, True))
    keys = ["policy", "platform", "deep_gemm", "next_n", "fp4", "adaptive"]
    assert list(frame.columns) == [*keys, "model_arch", "builder", "use_flattening", "path", "reason"]
    assert len(frame) == len(POLICIES) * len(all_platforms()) * 4 * 2 * 2
    assert not frame.duplicated(keys).any()
    row = frame.query(
        "policy == 'vllm_0_33_0' and platform == 'sm90' and deep_gemm and next_n == 3 and not fp4 and not adaptive"
    )
    assert row.use_flattening.item() and row.path.item() == "flatten"
    assert set(frame.platform) == {"sm90", "sm100", "sm120", "other", "rocm-cdna3", "rocm-cdna4+aiter"}
    v4 = decision_matrix(["vllm_0_33_0"], [MI355X], range(1, 4), fp4=True, model_arch=V4)
    assert v4.builder.tolist() == ["rocm_mxfp4"] * 3 and v4.path.tolist() == ["flatten", "native", "native"]


def test_detect_matches_torch() -> None:
    detected = detect_platform()
    if not torch.cuda.is_available():
        assert detected.family == "other"
    elif torch.version.hip:
        assert detected.family == "rocm" and detected.cdna in (0, 2, 3, 4, 5)
    else:
        major = torch.cuda.get_device_capability()[0]
        assert detected.family == {9: "sm90", 10: "sm100", 12: "sm120"}.get(major, "other")


def test_detect_reads_the_rocm_generation_and_aiter(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "7.0")
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(gcnArchName="gfx950:sramecc+:xnack-")
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "aiter" else None)
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "1")
    detected = detect_platform()
    assert (detected.family, detected.cdna, detected.aiter) == ("rocm", 4, True)
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "0")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(gcnArchName="gfx1100"))
    assert (detect_platform().cdna, detect_platform().aiter) == (0, False)  # RDNA: not a CDNA GPU


def test_policy_command_prints_one_table_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "--next-n-max", "6"]) == 0
    out = capsys.readouterr().out
    words = " ".join(out.split())  # rich wraps long titles
    for name in POLICIES:
        assert f"{name}: {RELEASES[name][0]}, {RELEASES[name][1]}" in words  # the release beside its policy id
    assert "sm120" in out and "N native" in out
    assert main(["policy", "--policy", "vllm_0_33_0", "--adaptive", "--fp4"]) == 0
    out = capsys.readouterr().out
    assert "vllm_0_33_0" in out and "pr45322" not in out and "fp4=True" in out
    assert main(["policy", "--policy", "vllm_0_33_0", "--fp4", "--model-arch", V4]) == 0
    assert "rocm-cdna4+aiter" in capsys.readouterr().out


def test_policy_command_rejects_bad_next_n_max(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "--next-n-max", "0"]) == 2
    assert "next_n_max" in capsys.readouterr().err


def test_env_command_and_facts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "policy platform" in out and "torch" in out and "reference" in out
    facts = environment_facts()
    assert facts["torch"] == torch.__version__
    assert facts["vllm"] == "0.33.0"
    assert "hostname" not in facts and socket.gethostname() not in map(str, facts.values())
    if not torch.cuda.is_available():
        assert "no GPU" in out and facts["gpu_name"] is None
