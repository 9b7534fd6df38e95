"""Our CUDA radix select (`cuda-radix`, issue 27's selection half): it compiles for sm_90 with nvcc and spills
nothing (here, no GPU needed), says why it cannot run off CUDA, and on a CUDA GPU picks what `topk_per_row` picks
(tie-aware) on fresh ragged rows with a padding row, rows around k and NaN past every row, into poisoned memory,
twice, leaving its inputs bit-identical, and replays in a CUDA graph over new logits.

On the device: `PYTHONPATH=$PWD python3 -m pytest tests/test_topk_cuda_radix.py -q` (nvcc compiles it there)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from dsa_lab.topk import compare_selections, get_topk, topk_per_row
from dsa_lab.topk.cuda_radix import FLAGS, SOURCE, compile_library

ON_GPU = torch.cuda.is_available() and get_topk("cuda-radix").availability(torch.device("cuda")).ok
WIDTH = 163840


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH")
def test_the_kernel_compiles_for_sm90_and_spills_nothing(tmp_path) -> None:
    library = compile_library("90", tmp_path)
    assert library.is_file() and library.parent == tmp_path and compile_library("90", tmp_path) == library
    report = subprocess.run(
        ["nvcc", *FLAGS, "-arch=sm_90", "-Xptxas", "-v", "-o", str(tmp_path / "again.so"), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-500:]
    assert "0 bytes spill stores, 0 bytes spill loads" in report.stderr


def test_off_cuda_it_says_why() -> None:
    state = get_topk("cuda-radix").availability(torch.device("cpu"))
    assert not state.ok and "needs a CUDA device" in state.reason
    assert "not vLLM's" in get_topk("cuda-radix").label


def _ragged(rows: int, longest: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    clean = torch.randn(rows, WIDTH, generator=gen, device="cuda") * 3 - 1
    clean[:, 5::97] = clean[:, 3:4]  # equal scores, which may swap indices
    lengths = torch.randint(1, longest + 1, (rows,), generator=gen, device="cuda")
    lengths[:6] = torch.tensor([0, 1, 2047, 2048, 2049, longest], device="cuda")[: min(rows, 6)]
    lens = lengths.to(torch.int32)
    poisoned = torch.where(torch.arange(WIDTH, device="cuda")[None, :] < lens[:, None], clean, float("nan"))
    return poisoned, clean, lens


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU and nvcc (or a build of this source)")
@pytest.mark.parametrize(("rows", "longest", "k"), [(4, 65536, 2048), (64, 131072, 2048), (384, 163840, 512)])
def test_it_picks_what_topk_per_row_picks(rows: int, longest: int, k: int) -> None:
    logits, clean, lens = _ragged(rows, longest, rows + k)
    kept = (logits.clone(), lens.clone())
    call = get_topk("cuda-radix").prepare(rows, WIDTH, k, torch.device("cuda"))
    expected = topk_per_row(clean, lens, k)
    for _ in range(2):
        call.out.fill_(-7)
        picks = call(logits, lens, int(lens.max())).clone()
        assert compare_selections(picks, expected, clean, atol=0.0, rtol=0.0).equal
        counts = (picks >= 0).sum(dim=1)
        assert torch.equal(counts, lens.clamp(max=k).to(counts.dtype))
        assert all(len(set(row[row >= 0].tolist())) == int(n) for row, n in zip(picks.cpu(), counts.cpu()))
    assert torch.equal(torch.nan_to_num(logits), torch.nan_to_num(kept[0])) and torch.equal(lens, kept[1])


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU and nvcc (or a build of this source)")
def test_it_replays_in_a_cuda_graph_over_new_logits() -> None:
    logits, _, lens = _ragged(16, 131072, 7)
    call = get_topk("cuda-radix").prepare(16, WIDTH, 2048, torch.device("cuda"))
    longest = int(lens.max())  # a host int, read before capture as vLLM reads it
    call(logits, lens, longest)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(logits, lens, longest)
    fresh = torch.randn(16, WIDTH, generator=torch.Generator(device="cuda").manual_seed(8), device="cuda")
    logits.copy_(torch.where(torch.arange(WIDTH, device="cuda")[None, :] < lens[:, None], fresh, float("nan")))
    graph.replay()
    torch.cuda.synchronize()
    assert compare_selections(out, topk_per_row(fresh, lens, 2048), fresh, atol=0.0, rtol=0.0).equal
