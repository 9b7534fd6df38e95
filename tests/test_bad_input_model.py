"""Bad input to the performance model: one next_n range with the rest of the project, shapes no kernel has
labelled as an extrapolation, and every refusal naming its argument."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.batch.workload import MAX_NEXT_N
from dsa_lab.cli import main
from dsa_lab.model.decode_step import decode_step
from dsa_lab.model.indexer import predict


def model(*flags: str, capsys) -> tuple[int, str, str]:
    code = main(["model", *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("next_n", [17, 33, 0])
def test_one_next_n_range_everywhere(capsys, next_n: int) -> None:
    """`model --next-n 17` used to say 'size=17: ... [1, 16]' and 33 'next_n=33: ... [1, 32]'."""
    code, _, err = model("--next-n", str(next_n), capsys=capsys)
    assert code == 2 and err.strip() == f"dsa-lab model: error: next_n={next_n}: allowed range is [1, {MAX_NEXT_N}]"


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--heads", "3"], "heads=3: deepgemm's kernel has heads in (32, 64)"),
        (["--head-dim", "64"], "head_dim=64: deepgemm's kernel has head_dim in (128,)"),
        (["--heads", "65", "--backend", "triton"], "heads=65: triton's kernel"),
    ],
)
def test_a_shape_no_kernel_has_is_labelled_an_extrapolation(capsys, flags: list[str], says: str) -> None:
    """`--heads 3` used to be modeled without comment."""
    code, out, _ = model(*flags, "--json", capsys=capsys)
    notes = json.loads(out)["assumptions"]
    assert code == 0 and any(says in note and "modeled as an extrapolation, never measured" in note for note in notes)
    code, out, _ = model(*flags, capsys=capsys)
    assert code == 0 and "extrapolation" in out


def test_a_kernel_s_own_shape_carries_no_label(capsys) -> None:
    code, out, _ = model("--json", capsys=capsys)
    assert code == 0 and not [n for n in json.loads(out)["assumptions"] if "extrapolation" in n]


CASES = {
    "predict next_n True": (lambda: predict("H200", "deepgemm", "native", [4096], True), r"next_n=True"),
    "predict head_dim 0": (lambda: predict("H200", "deepgemm", "native", [4096], 1, head_dim=0), r"head_dim=0"),
    "predict mxfp4 head_dim 48": (
        lambda: predict("B200", "deepgemm", "native", [4096], 1, head_dim=48, cache_dtype="mxfp4"),
        r"head_dim=48",
    ),
    "decode_step next_n 17": (
        lambda: decode_step("H200", 8, 4096, 17, 10.0, 5.0),
        r"next_n=17: allowed range is \[1, 16\]",
    ),
    "decode_step context -1": (lambda: decode_step("H200", 8, -1, 2, 10.0, 5.0), r"context=-1"),
    "decode_step context 1.5": (lambda: decode_step("H200", 8, 1.5, 2, 10.0, 5.0), r"context=1\.5"),
    "decode_step indexer_us negative": (lambda: decode_step("H200", 8, 4096, 2, -5.0, 5.0), r"indexer_us=-5\.0"),
    "decode_step indexer_us NaN": (lambda: decode_step("H200", 8, 4096, 2, float("nan"), 5.0), r"indexer_us=nan"),
    "decode_step draft inf": (lambda: decode_step("H200", 8, 4096, 2, 1.0, float("inf")), r"draft_indexer_us=inf"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_model_refuses_bad_input_by_name(case: str) -> None:
    call, says = CASES[case]
    with pytest.raises(ValueError, match=says):
        call()


def test_a_seed_out_of_range_is_named(capsys) -> None:
    """A seed of 2**70 used to give 'Overflow when unpacking long long'."""
    code, _, err = model("--context", "mixed:1K-64K", "--seed", str(2**70), capsys=capsys)
    assert code == 2 and "seed=1180591620717411303424: allowed range is [0, 9223372036854775807]" in err


@settings(max_examples=30, deadline=None)
@given(next_n=st.integers().filter(lambda n: not 1 <= n <= MAX_NEXT_N))
def test_predict_and_decode_step_share_the_range(next_n: int) -> None:
    for call in (
        lambda: predict("H200", "deepgemm", "native", [1 << 20], next_n),
        lambda: decode_step("H200", 8, 4096, next_n, 10.0, 5.0),
    ):
        with pytest.raises(ValueError, match=rf"next_n={next_n}: allowed range is \[1, {MAX_NEXT_N}\]"):
            call()
