"""Our CUDA selections (`cuda-radix`, a row a CTA; `cuda-split`, a row over many CTAs: issue 27's selection half):
each compiles for sm_90 with nvcc and spills nothing (here, no GPU needed), says why it cannot run off CUDA, and
on a CUDA GPU picks what `topk_per_row` picks (tie-aware) on fresh ragged rows with a padding row, rows around k
and NaN past every row, into poisoned memory, twice, leaving its inputs bit-identical, and replays in a CUDA graph
over new logits. `cuda-split` also keeps its picks exact when a row's threshold bin overflows its candidates
(near-equal scores: every long row is then selected whole, and counted), never needs that on spread scores, and
leaves its state zero after every call.

On the device: `PYTHONPATH=$PWD python3 -m pytest tests/test_topk_cuda.py -q` (nvcc compiles them there)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from dsa_lab.kernels.nvcc import FLAGS
from dsa_lab.kernels.split_select import CHUNKS, SPLIT_SELECT, chunk_for
from dsa_lab.topk import compare_selections, get_topk, topk_per_row
from dsa_lab.topk.cuda_radix import ROW_SELECT

SOURCES = {"cuda-radix": ROW_SELECT, "cuda-split": SPLIT_SELECT}
ON_GPU = {name: torch.cuda.is_available() and get_topk(name).availability(torch.device("cuda")).ok for name in SOURCES}
WIDTH = 163840


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH")
@pytest.mark.parametrize("name", list(SOURCES))
def test_the_kernel_compiles_for_sm90_and_spills_nothing(name: str, tmp_path) -> None:
    source = SOURCES[name]
    library = source.compile("90", tmp_path)
    assert library.is_file() and library.parent == tmp_path and source.compile("90", tmp_path) == library
    report = subprocess.run(
        ["nvcc", *FLAGS, "-arch=sm_90", "-Xptxas", "-v", "-o", str(tmp_path / "again.so"), str(source.path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-500:]
    assert report.stderr.count("0 bytes spill stores, 0 bytes spill loads") == report.stderr.count("spill stores")


@pytest.mark.parametrize("name", list(SOURCES))
def test_off_cuda_it_says_why(name: str) -> None:
    state = get_topk(name).availability(torch.device("cpu"))
    assert not state.ok and "needs a CUDA device" in state.reason
    assert "not vLLM's" in get_topk(name).label


def test_the_split_spreads_short_steps_wide_and_keeps_long_ones_few() -> None:
    assert chunk_for(4, 65536, 132) == CHUNKS[0]  # one request of 64K, 4 rows: 128 CTAs
    assert chunk_for(384, 131072, 132) == CHUNKS[-1]  # B = 128 at n = 3: the largest chunk
    chunks = [chunk_for(rows, 131072, 132) for rows in (1, 16, 64, 128, 256, 512)]
    assert chunks == sorted(chunks) and all(c in CHUNKS for c in chunks)


def _ragged(rows: int, longest: int, seed: int, spread: float = 3.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    clean = torch.randn(rows, WIDTH, generator=gen, device="cuda") * spread - 1
    clean[:, 5::97] = clean[:, 3:4]  # equal scores, which may swap indices
    lengths = torch.randint(1, longest + 1, (rows,), generator=gen, device="cuda")
    lengths[:6] = torch.tensor([0, 1, 2047, 2048, 2049, longest], device="cuda")[: min(rows, 6)]
    lens = lengths.to(torch.int32)
    poisoned = torch.where(torch.arange(WIDTH, device="cuda")[None, :] < lens[:, None], clean, float("nan"))
    return poisoned, clean, lens


def _zero_state(name: str, call: object) -> bool:
    return name != "cuda-split" or not bool(call.select.state.any())


def _fallbacks(name: str, call: object) -> int:
    """The rows `cuda-split` selected from the whole row (their threshold bin overflowed), over its calls so far."""
    return int(call.select.fallbacks.item()) if name == "cuda-split" else 0


@pytest.mark.parametrize("name", list(SOURCES))
@pytest.mark.parametrize(
    ("rows", "longest", "k", "spread"),
    [(4, 65536, 2048, 3.0), (64, 131072, 2048, 3.0), (384, 163840, 512, 3.0), (8, 131072, 2048, 1e-4)],
    ids=["B1-64K", "B16-128K", "B128-width", "near-equal"],
)
def test_it_picks_what_topk_per_row_picks(name: str, rows: int, longest: int, k: int, spread: float) -> None:
    if not ON_GPU[name]:
        pytest.skip("needs a CUDA GPU and nvcc (or a build of this source)")
    logits, clean, lens = _ragged(rows, longest, rows + k, spread)
    kept = (logits.clone(), lens.clone())
    call = get_topk(name).prepare(rows, WIDTH, k, torch.device("cuda"))
    expected = topk_per_row(clean, lens, k)
    for _ in range(2):
        (call.select if name == "cuda-split" else call).out.fill_(-7)
        picks = call(logits, lens, int(lens.max())).clone()
        assert compare_selections(picks, expected, clean, atol=0.0, rtol=0.0).equal
        counts = (picks >= 0).sum(dim=1)
        assert torch.equal(counts, lens.clamp(max=k).to(counts.dtype))
        assert all(len(set(row[row >= 0].tolist())) == int(n) for row, n in zip(picks.cpu(), counts.cpu()))
        assert _zero_state(name, call)
    assert torch.equal(torch.nan_to_num(logits), torch.nan_to_num(kept[0])) and torch.equal(lens, kept[1])
    # Near-equal scores put a whole row in one bin: every row longer than the candidates is selected whole.
    long_rows = int(((lens > call.select.candidates.shape[1]) & (lens > k)).sum()) if name == "cuda-split" else 0
    assert _fallbacks(name, call) == (2 * long_rows if spread < 1 and name == "cuda-split" else 0)


@pytest.mark.parametrize("name", list(SOURCES))
def test_it_replays_in_a_cuda_graph_over_new_logits(name: str) -> None:
    if not ON_GPU[name]:
        pytest.skip("needs a CUDA GPU and nvcc (or a build of this source)")
    logits, _, lens = _ragged(16, 131072, 7)
    call = get_topk(name).prepare(16, WIDTH, 2048, torch.device("cuda"))
    longest = int(lens.max())  # a host int, read before capture as vLLM reads it
    call(logits, lens, longest)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(logits, lens, longest)
    for seed in (8, 9):
        fresh = torch.randn(16, WIDTH, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda")
        logits.copy_(torch.where(torch.arange(WIDTH, device="cuda")[None, :] < lens[:, None], fresh, float("nan")))
        graph.replay()
        torch.cuda.synchronize()
        assert compare_selections(out, topk_per_row(fresh, lens, 2048), fresh, atol=0.0, rtol=0.0).equal
        assert _zero_state(name, call)
