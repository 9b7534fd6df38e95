"""The Gluon kernel against the reference on its GPU (skipped elsewhere: Gluon has no interpreter), at the
edge cases a sweep's grid does not reach (what `scripts/gluon_dev.py check` ran until issue 30).

Each case runs into a NaN-filled output and is compared with the reference backend: relative error at
most 1e-3 over the valid positions, exactly -inf past each row's context inside its request's scored
blocks, and, as the kernel leaves the tail (DeepGEMM's convention), the columns past those blocks still
NaN; with `clean_tail` every column past a row's context -inf. Cases: uniform, ragged decode lengths plus
CUDA-graph padding (requests and tokens), zero-length requests among real ones, contexts of 1 and at
block boundaries (63, 64, 65), a block table wider than needed, a logits width past every context
(vLLM's max_model_len), one long request among short ones (a CTA range crossing requests), H = 32 /
D = 64, every next_n 1..8 and 16, and configs other than the rule's (the `config` axis's spelling).

On the H200: `timeout 300 python -m pytest tests/test_gluon_gpu.py -q` (the timeout stands in for the
harness's watchdog: a hung kernel never returns).
"""

from __future__ import annotations

import pytest
import torch

from dsa_lab.batch.metadata import build_native_metadata
from dsa_lab.batch.workload import (
    DecodeBatch,
    mixed_length_batch,
    ragged_decode_batch,
    random_inputs,
    uniform_batch,
    with_padding,
)
from dsa_lab.decode import check_launches, pack_launch
from dsa_lab.kernels import get_backend
from dsa_lab.kernels.gluon import launch as gn
from dsa_lab.kernels.reference import paged_mqa_logits as reference

GLUON = get_backend("gluon")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not GLUON.availability(torch.device("cuda")).ok,
    reason="needs the Gluon kernel's GPU (SM90)",
)
TOLERANCE = 1e-3
MODEL_WIDTH = 163840  # DeepSeek-V3.2's max_model_len: vLLM's logits width


def _cases() -> dict[str, dict]:
    out = {}
    for n in range(1, 9):
        out[f"uniform n={n}"] = {"kind": "uniform", "n": n, "B": 3, "L": 3000}
        out[f"ragged+pad n={n}"] = {"kind": "ragged", "n": n, "B": 5, "L": 2500}
        out[f"edges n={n}"] = {"kind": "lens", "n": n, "lens": [0, 1, 63, 64, 65, 0, 129, 2000, 0]}
        out[f"long among short n={n} clean"] = {"kind": "lens", "n": n, "lens": [40000] + [700] * 30, "clean": True}
    out["mixed n=3"] = {"kind": "mixed", "n": 3, "B": 6, "L": 5000}
    out["long n=4"] = {"kind": "uniform", "n": 4, "B": 2, "L": 40000}
    out["uniform n=16"] = {"kind": "uniform", "n": 16, "B": 2, "L": 1500}
    out["edges n=16 clean"] = {"kind": "lens", "n": 16, "lens": [0, 16, 63, 64, 65, 0, 1000], "clean": True}
    out["H32 D64 n=3"] = {"kind": "ragged", "n": 3, "B": 4, "L": 2000, "H": 32, "D": 64}
    out["wide table, model width n=3"] = {"kind": "lens", "n": 3, "lens": [3000, 0, 70, 4100], "spare": 40,
                                          "width": MODEL_WIDTH}  # fmt: skip
    out["model width n=4 clean"] = {"kind": "lens", "n": 4, "lens": [3000, 70], "width": MODEL_WIDTH, "clean": True}
    out["all padding but one n=2"] = {"kind": "lens", "n": 2, "lens": [0, 0, 2, 0]}
    configs = {
        3: ("plan=row/mma_columns=64/group_columns=192", "plan=pad/mma_columns=256/group_columns=256",
            "plan=pair/mma_columns=128/group_columns=128", "query_slots=1"),
        1: ("consumers=4/stages=8", "consumers=2/stages=8", "query_slots=1"),
        8: ("mma_columns=128/group_columns=128/loader_registers=72",),
    }  # fmt: skip
    for n, texts in configs.items():
        for text in texts:
            out[f"ragged+pad n={n} {text}"] = {"kind": "ragged", "n": n, "B": 5, "L": 2500, "config": text}
    return out


CASES = _cases()


def _inputs(case: dict, seed: int, device: torch.device):
    """The case's batch, its inputs and its one native launch, packed (block table widened if asked)."""
    n, shape = case["n"], {"num_heads": case.get("H", 64), "head_dim": case.get("D", 128)}
    if case["kind"] == "uniform":
        batch = uniform_batch(case["B"], case["L"], n, **shape)
    elif case["kind"] == "mixed":
        batch = mixed_length_batch(case["B"], 100, case["L"], n, seed, **shape)
    elif case["kind"] == "lens":  # given lengths: 0 is a padding request, 1..n-1 decode that many rows
        batch = DecodeBatch(tuple(case["lens"]), tuple(min(n, length) for length in case["lens"]), n, **shape)
    else:  # ragged decode lens, two padding requests and three padding tokens
        batch = with_padding(ragged_decode_batch(case["B"], n, case["L"], n, seed, **shape), 2, 3)
    inputs = random_inputs(batch, seed=seed, device=device)
    metadata = build_native_metadata(batch, inputs.cache.block_table)
    check_launches(metadata, inputs)
    packed = pack_launch(metadata.launches[0], inputs)
    if case.get("spare"):  # a block table wider than any request needs, its spare ids valid but unused
        spare = torch.zeros(packed.block_table.shape[0], case["spare"], dtype=torch.int32, device=device)
        packed = type(packed)(packed.q, packed.weights, packed.context_lens, torch.cat([packed.block_table, spare], 1))
    return inputs, metadata, packed


@pytest.mark.parametrize("name", CASES)
def test_gluon_matches_the_reference_and_writes_only_its_blocks(name: str) -> None:
    case, device = CASES[name], torch.device("cuda")
    inputs, metadata, packed = _inputs(case, list(CASES).index(name), device)
    batch, n, heads, dim = packed.q.shape
    space = GLUON.config_space
    config = space.config(space.parse(GLUON.name, case.get("config", "rule")), n, heads, dim)
    width, clean = case.get("width", metadata.max_context_len), case.get("clean", False)
    args = (packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, width)
    out = torch.full((batch * n, width), float("nan"), dtype=torch.float32, device=device)
    gn.paged_mqa_logits_gluon(*args, config=config, out=out, cache_dtype="fp8", clean_tail=clean)
    want = reference(*args, cache_dtype="fp8")
    torch.cuda.synchronize()
    pos = torch.arange(width, device=device)[None, :]
    valid = pos < packed.context_lens.reshape(-1).long()[:, None]
    blocks = (packed.context_lens.amax(dim=1).long().repeat_interleave(n)[:, None] + 63) // 64  # scored per row
    scored = pos < blocks * 64
    got = out[valid].double()
    assert not torch.isnan(got).any(), f"{name}: NaN at a valid position (never written)"
    if got.numel():
        rel = float((got - want[valid].double()).norm() / want[valid].double().norm().clamp(min=1e-30))
        assert rel <= TOLERANCE, f"{name} ({config.describe()}): relative error {rel:.2e}"
    past = out[~valid & (scored | clean)]  # past the context inside scored blocks (every column, if clean)
    assert (past == float("-inf")).all(), f"{name}: {int((past != float('-inf')).sum())} values where -inf belongs"
    if not clean:
        assert torch.isnan(out[~scored]).all(), f"{name}: written past the scored blocks (the tail is the caller's)"
