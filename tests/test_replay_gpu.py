"""Ragged verification on a CUDA GPU (issue 26; skipped without one): one graph captured once and replayed over
steps whose requests verify different numbers of drafts, natively (a kernel that reads each row's context from
the device) and by vLLM's route (flatten), with vLLM's top-k; every replay checked, none wrong.

On the device: `PYTHONPATH=$PWD:$PWD/.dg python3 -m pytest tests/test_replay_gpu.py -q` (vLLM's top-k from
`build/vllm_topk`, see tests/test_topk_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from dsa_lab.batch.acceptance import AcceptanceSpec, accepted_batch
from dsa_lab.batch.workload import ContextSpec, random_inputs
from dsa_lab.bench.point import Point
from dsa_lab.bench.replay import replay_point
from dsa_lab.bench.timing import TimingConfig
from dsa_lab.decode import native_sizes_for
from dsa_lab.kernels import backend_names, get_backend, vllm_backend
from dsa_lab.topk import vllm_topk

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
QUICK = TimingConfig(warmup=2, min_samples=5, max_samples=20, max_seconds=0.2)
CURVE, NEXT_N = "v4flash-dspark-ascend13640:5", 6


def _routes() -> list[tuple[str, str]]:
    """(backend, strategy): every backend native for next_n 6 here, and vLLM's route (its library, flatten)."""
    device = torch.device("cuda")
    native = [
        (name, "native")
        for name in backend_names()
        if get_backend(name).availability(device).ok
        and name != "reference"
        and (
            native_sizes_for(get_backend(name), device) is None or NEXT_N in native_sizes_for(get_backend(name), device)
        )
    ]
    return [*native, (vllm_backend().name, "flatten")]


@pytest.mark.parametrize("timed", ["logits", "logits+topk"])
def test_one_graph_replays_ragged_steps_right_every_time(timed: str) -> None:
    device = torch.device("cuda")
    if timed == "logits+topk" and not vllm_topk().availability(device).ok:
        pytest.skip(vllm_topk().availability(device).reason)
    seq_lens = ContextSpec.parse("mixed:2048-131072").seq_lens(16, 0)
    batch = accepted_batch(seq_lens, AcceptanceSpec.parse(CURVE), NEXT_N, seed=0)
    inputs = random_inputs(batch, seed=1, device=device)
    for name, strategy in _routes():
        backend = get_backend(name)
        if not backend.availability(device).ok:
            continue
        point = Point(name, strategy, 16, "mixed:2048-131072", NEXT_N, "fp8", 64, 128, acceptance=CURVE,
                      logits_width="model:163840", timed=timed, timer="replay", topk_impl="vllm")  # fmt: skip
        row = replay_point(point, backend, inputs, 163840, 1e-3, 2, 0, QUICK, replays=20)
        assert row["status"] == "ok" and row["replays_wrong"] == 0, (name, strategy, row["message"])
        assert row["samples"] == 20 and row["median_ms"] > 0
        if timed == "logits+topk":
            assert row["topk_rows"] == row["topk_rows_equal"] == 20 * 17 * NEXT_N
