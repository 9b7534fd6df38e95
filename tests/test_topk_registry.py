"""The step's top-k as a declared part of the step (issue 26): the registry refuses by name, the stand-in picks what
`topk_per_row` picks, the `topk_impl` axis is implied on logits-only points and old runs read as what they ran,
and the C launch rules of the vLLM top-k build choose what vLLM 0.33's own Python dispatch chooses."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from dsa_lab import axes
from dsa_lab.bench.point import Point, SweepSpec
from dsa_lab.bench.presets import step_grids
from dsa_lab.errors import BackendUnavailable
from dsa_lab.store import load_run
from dsa_lab.topk import (
    TopkImpl,
    compare_selections,
    get_topk,
    register_topk,
    topk_names,
    topk_per_row,
    vllm_kernels,
    vllm_topk,
)
from dsa_lab.topk.registry import _IMPLS

CSRC = Path(vllm_kernels.__file__).parent / "csrc"
DATA = Path(__file__).resolve().parents[1] / "data"


def test_the_registry_holds_vllms_top_k_and_the_labelled_stand_in() -> None:
    assert set(topk_names()) >= {"vllm", "torch"}
    assert vllm_topk().name == "vllm" and vllm_topk().sizes == (512, 1024, 2048)
    assert "not vLLM's" in get_topk("torch").label


def test_an_unknown_top_k_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"topk_impl.*'torch'.*'vllm'"):
        get_topk("radix")


@pytest.mark.parametrize("k", [256, 2047, 4096])
def test_vllms_top_k_refuses_a_k_outside_its_kernels(k: int) -> None:
    with pytest.raises(ValueError, match=r"topk=.*512, 1024, 2048"):
        vllm_topk().require(torch.device("cpu"), k)


def test_vllms_top_k_off_cuda_says_why() -> None:
    state = vllm_topk().availability(torch.device("cpu"))
    assert not state.ok and "CUDA" in state.reason
    with pytest.raises(BackendUnavailable, match="'vllm' unavailable on cpu"):
        vllm_topk().require(torch.device("cpu"), 2048)


@pytest.mark.parametrize("name", ["", "Top K", "a,b", "none", "x" * 41, None])
def test_a_top_k_with_a_bad_name_is_refused_at_registration(name) -> None:
    with pytest.raises(ValueError, match="plain name"):
        register_topk(type("Bad", (TopkImpl,), {"name": name, "label": "bad"}))


def test_a_top_k_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register_topk(type("Again", (TopkImpl,), {"name": "torch", "label": "again"}))
    assert type(_IMPLS["torch"]).__name__ == "TorchTopk"


@pytest.mark.parametrize("lengths", [[0, 1, 5, 300], [2048, 2049, 4000, 64], [17, 0, 0, 3]])
def test_the_stand_in_picks_what_topk_per_row_picks_short_rows_included(lengths: list[int]) -> None:
    gen = torch.Generator().manual_seed(sum(lengths))
    logits = torch.randn(len(lengths), 4096, generator=gen)
    logits[:, ::7] = logits[:, :1]  # ties: equal scores may swap indices
    lens = torch.tensor(lengths, dtype=torch.int32)
    poisoned = torch.where(torch.arange(4096)[None, :] < lens[:, None], logits, float("nan"))
    picks = get_topk("torch").prepare(len(lengths), 4096, 2048, torch.device("cpu"))(poisoned, lens, max(lengths))
    expected = topk_per_row(logits, lens, 2048)
    assert compare_selections(picks, expected, logits, atol=0.0, rtol=0.0).equal
    assert [(row >= 0).sum().item() for row in picks] == [min(n, 2048) for n in lengths]


def test_a_logits_only_point_runs_no_top_k_and_its_key_is_an_older_runs() -> None:
    spec = SweepSpec(backend=("reference",), timed=("logits", "logits+topk"), topk_impl=("vllm", "torch"))
    pairs = {(p.timed, p.topk_impl) for p in spec.points()}
    assert pairs == {("logits", "none"), ("logits+topk", "vllm"), ("logits+topk", "torch")}
    logits_only = next(p for p in spec.points() if p.timed == "logits")
    assert "topk_impl" not in logits_only.key and "timed" not in logits_only.key
    torch_step = next(p for p in spec.points() if p.topk_impl == "torch")
    assert "topk_impl" not in torch_step.key  # what 'logits+topk' ran before the axis
    assert "topk_impl=vllm" in next(p for p in spec.points() if p.topk_impl == "vllm").key


def test_none_is_refused_where_a_point_runs_a_top_k() -> None:
    with pytest.raises(ValueError, match=r"topk_impl='none'"):
        Point(**{**SweepSpec().points()[0].axes(), "timed": "logits+topk", "topk_impl": "none"})


def test_an_older_spec_without_the_axis_resumes_with_the_torch_stand_in() -> None:
    recorded = SweepSpec(timed=("logits+topk",), topk_impl=("torch",)).to_dict()
    assert "topk_impl" not in recorded
    assert SweepSpec.from_dict(recorded).topk_impl == ("torch",)


def test_the_shipped_serving_run_reads_torch_on_its_step_rows_and_none_on_its_logits_rows() -> None:
    results = load_run(DATA / "h200" / "h200-serving-20261201").results
    by_unit = results.groupby("timed")["topk_impl"].unique()
    assert list(by_unit["logits+topk"]) == ["torch"] and list(by_unit["logits"]) == ["none"]
    assert results["point_key"].tolist() == [axes.point_key(row) for row in results.to_dict("records")]


def test_the_step_preset_times_vllms_top_k_and_the_logits_alone_under_the_same_timers() -> None:
    grids = step_grids()
    for grid in grids:
        values = grid.axes()
        assert values["topk_impl"] == ("vllm",) and set(values["timed"]) == {"logits", "logits+topk"}
    assert {g.axes()["timer"][0] for g in grids} == {"graph", "events", "replay"}
    assert set(next(iter(grids)).axes()["batch"]) == {1, 16, 64, 128, 256}


# ---------------------------------------------------------------- the C launch rules against vLLM's dispatch


class Query(ctypes.Structure):
    _fields_ = [
        (name, kind)
        for name, kind in (
            ("rows", ctypes.c_uint32),
            ("stride", ctypes.c_uint32),
            ("width", ctypes.c_uint32),
            ("k", ctypes.c_uint32),
            ("max_seq_len", ctypes.c_uint32),
            ("address", ctypes.c_uint64),
            ("policy", ctypes.c_int),
            ("sms", ctypes.c_int),
            ("smem_optin", ctypes.c_int),
            ("cc_major", ctypes.c_int),
            ("cc_minor", ctypes.c_int),
        )
    ]


SHIM = """
#include "vllm_topk_rules.h"
static int fixed(int vec, uint32_t smem, void *context) { (void)vec; (void)smem; return *(int *)context; }
int rules_choose(const dsa_topk_query *q, int occupancy, dsa_topk_plan *out) {
    const char *why;
    *out = dsa_topk_choose(q, fixed, &occupancy, &why);
    return out->kernel;
}
"""


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory):
    """vllm_topk_rules.h compiled by the system's C compiler (no CUDA: the rules are plain C)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler is not None, "a C compiler (gcc) is needed to test the C launch rules"
    folder = tmp_path_factory.mktemp("rules")
    (folder / "shim.c").write_text(SHIM)
    library = folder / "librules.so"
    command = [compiler, "-std=c99", "-Wall", "-Werror", "-O1", "-shared", "-fPIC", f"-I{CSRC}"]
    subprocess.run([*command, "-o", str(library), str(folder / "shim.c")], check=True)
    lib = ctypes.CDLL(str(library))
    lib.rules_choose.argtypes = [ctypes.POINTER(Query), ctypes.c_int, ctypes.POINTER(vllm_kernels._Plan)]
    return lib


def choose(rules, rows: int, k: int = 2048, stride: int = 163840, max_seq_len: int = 65536, occupancy: int = 1):
    query = Query(rows, stride, stride, k, max_seq_len, 0, 0, 132, 232448, 9, 0)
    plan = vllm_kernels._Plan()
    rules.rules_choose(ctypes.byref(query), occupancy, ctypes.byref(plan))
    return plan


@pytest.fixture(scope="module")
def vllm_dispatch():
    """vLLM 0.33.0's own `SparseIndexerTopk('auto')`, told it runs on an SM90 CUDA GPU."""
    from vllm.model_executor.layers.indexer_topk import SparseIndexerTopk

    dispatch = SparseIndexerTopk("auto")
    dispatch._is_cuda, dispatch._cooperative_capable = True, True
    return dispatch


@pytest.mark.parametrize("stride", [163840, 163842, 65536])
@pytest.mark.parametrize("k", [512, 1024, 2048, 256])
def test_the_c_rules_pick_the_family_vllms_python_dispatch_picks(rules, vllm_dispatch, k: int, stride: int) -> None:
    for rows in [1, 2, 4, 5, 8, 9, 33, 34, 63, 64, 65, 96, 128, 257, 1024]:
        theirs = vllm_dispatch._resolve_auto(torch.empty(rows, stride), k, rows)
        ours = vllm_kernels.KERNELS.get(choose(rules, rows, k, stride).kernel, "refused")
        if theirs == "per_row":  # vLLM's k-agnostic fallback kernel: not in the build, refused by name
            assert ours == "refused", (rows, k, stride)
        else:
            assert (ours == "cooperative") == (theirs == "cooperative"), (rows, k, stride, ours, theirs)


def test_the_cooperative_cluster_grows_as_rows_shrink(rules) -> None:
    sizes = {rows: choose(rules, rows).cluster for rows in (1, 4, 5, 8, 9, 33, 34, 64)}
    assert sizes == {1: 8, 4: 8, 5: 8, 8: 8, 9: 4, 33: 4, 34: 2, 64: 2}  # 16 only on SM100 and newer


@pytest.mark.parametrize(
    ("rows", "max_seq_len", "k", "kernel"),
    [
        (65, 65536, 2048, "sampled"),  # many rows, some as long as the sampled kernel's bound
        (65, 65535, 2048, "filtered"),
        (65, 65536, 512, "filtered"),  # k = 512 samples only from 98304
        (65, 98304, 512, "sampled"),
        (1024, 163840, 2048, "sampled"),
    ],
)
def test_the_persistent_family_picks_its_kernel_by_rows_and_the_longest_context(rules, rows, max_seq_len, k, kernel):
    assert vllm_kernels.KERNELS[choose(rules, rows, k, max_seq_len=max_seq_len).kernel] == kernel


def test_the_radix_kernel_takes_rows_the_others_do_not_with_its_groups_within_the_chip(rules) -> None:
    # an odd stride rules the cooperative kernel out; 32 rows or fewer are below the filtered kernel
    short = choose(rules, 16, stride=163842, max_seq_len=16384, occupancy=2)
    assert vllm_kernels.KERNELS[short.kernel] == "radix" and short.vec == 2
    assert short.groups * short.ctas_per_group <= 132 * 2 and short.groups <= 16
    assert short.workspace_bytes == short.groups * 3088
    long = choose(rules, 16, stride=163842, max_seq_len=163840, occupancy=1)
    assert vllm_kernels.KERNELS[long.kernel] in ("radix", "filtered")
    if long.kernel == 4:
        assert long.groups * long.ctas_per_group <= 132  # the cross-CTA barrier fits on the chip
