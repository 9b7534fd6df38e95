"""Issue 19's whole step on a CUDA GPU (skipped without one): a ragged step at vLLM's logits width,
for each GPU backend available here and both timed units, replayed in a CUDA graph gives what the
eager step gives, its top-k picks what `topk_per_row` picks, and both timing methods measure it.

On the H200: `PYTHONPATH=$PWD:$PWD/.dg python -m pytest tests/test_serving_step_gpu.py -q`.
"""

from __future__ import annotations

import pytest
import torch

from dsa_lab.axes import TIMED_UNITS
from dsa_lab.batch.acceptance import AcceptanceSpec, accepted_batch
from dsa_lab.batch.plan import DEEPSEEK_V32_MAX_MODEL_LEN, LaunchPlan
from dsa_lab.batch.workload import ContextSpec, random_inputs
from dsa_lab.bench.presets import SERVING_ACCEPTANCE
from dsa_lab.bench.timed_unit import check_topk, timed_step
from dsa_lab.bench.timing import TimingConfig, time_step
from dsa_lab.decode import check_launches, launch_call, native_sizes_for, pack_launch, scheduled
from dsa_lab.kernels import get_backend
from dsa_lab.topk import get_topk, topk_names

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
QUICK = TimingConfig(warmup=2, min_samples=5, max_samples=20, max_seconds=0.2)
GPU_BACKENDS = ("deepgemm", "gluon", "triton")


@pytest.mark.parametrize("topk_impl", topk_names())
@pytest.mark.parametrize("unit", TIMED_UNITS)
@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_a_graph_replayed_step_is_the_eager_step(name, unit, topk_impl) -> None:
    device = torch.device("cuda")
    backend = get_backend(name)
    if not backend.availability(device).ok:
        pytest.skip(f"{name}: {backend.availability(device).reason}")
    if unit == "logits+topk" and not get_topk(topk_impl).availability(device).ok:
        pytest.skip(f"top-k {topk_impl}: {get_topk(topk_impl).availability(device).reason}")
    seq_lens = ContextSpec.parse("lognormal:8K:1.5").seq_lens(16, 0)
    batch = accepted_batch(seq_lens, AcceptanceSpec.parse("v4flash-vllm41044"), 3, seed=0)
    inputs = random_inputs(batch, seed=1, device=device)
    sizes = native_sizes_for(backend, device)
    strategy = "native" if batch.max_decode_len in sizes else "atom"
    plan = LaunchPlan(
        batch.seq_lens,
        batch.max_decode_len,
        strategy,
        native_sizes=sizes,
        decode_lens=batch.decode_lens,
        logits_width=DEEPSEEK_V32_MAX_MODEL_LEN,
    )
    metadata = plan.build_metadata(batch, inputs.cache.block_table)
    check_launches(metadata, inputs)
    width = plan.max_context_len
    calls = [scheduled(backend, launch_call(pack_launch(la, inputs), inputs.cache, width)) for la in metadata.launches]
    step = timed_step(unit, backend, calls, batch.max_seq_len, topk_impl=topk_impl)
    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    contexts = [p.context_lens.reshape(-1).long() for p in calls]
    for got, want, lens in zip(captured, eager, contexts):
        if unit == "logits":
            valid = torch.arange(got.shape[1], device=device)[None, :] < lens[:, None]
            assert torch.equal(got[valid], want[valid])
        else:
            assert torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)
    if unit == "logits+topk":
        logits = timed_step("logits", backend, calls, batch.max_seq_len)
        outputs = logits()
        assert check_topk(metadata, outputs, eager, 2048).equal
    for method, name_prefix in (("events", "cuda_events"), ("graph", "cuda_graph_step")):
        measured = time_step(step, device, method, QUICK)
        assert measured.timing_method.startswith(name_prefix) and measured.median_ms > 0


def test_the_fused_step_picks_from_gluons_logits_and_replays_in_a_graph() -> None:
    """Issue 27's `gluon-fused` on a ragged step (front padding rows of context 0, a request shorter than k): its
    picks are the top-k of Gluon's own logits (the same kernel, bit for bit), eager and graph-replayed alike, and
    its select leaves its state zero."""
    device = torch.device("cuda")
    fused, gluon = get_backend("gluon-fused"), get_backend("gluon")
    if not fused.availability(device).ok:
        pytest.skip(f"gluon-fused: {fused.availability(device).reason}")
    seq_lens = (*ContextSpec.parse("mixed:2048-131072").seq_lens(15, 0), 1000)  # one shorter than k
    for next_n, curve in ((1, "v4flash-vllm41044"), *SERVING_ACCEPTANCE[1:3]):  # n = 1, 3 and 4
        batch = accepted_batch(seq_lens, AcceptanceSpec.parse(curve), next_n, seed=next_n)
        inputs = random_inputs(batch, seed=2, device=device)
        plan = LaunchPlan(batch.seq_lens, batch.max_decode_len, "native", decode_lens=batch.decode_lens,
                          logits_width=DEEPSEEK_V32_MAX_MODEL_LEN)  # fmt: skip
        metadata = plan.build_metadata(batch, inputs.cache.block_table)
        calls = [
            scheduled(fused, launch_call(pack_launch(la, inputs), inputs.cache, plan.max_context_len))
            for la in metadata.launches
        ]
        step = timed_step("logits+topk", fused, calls, batch.max_seq_len)
        outputs = timed_step("logits", gluon, calls, batch.max_seq_len)()
        eager = [picks.clone() for picks in step()]
        assert check_topk(metadata, outputs, eager, 2048).equal, f"next_n={next_n}: eager"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        for replay in range(2):  # tie-aware: equal scores may be picked in another order, or others of them
            graph.replay()
            torch.cuda.synchronize()
            assert check_topk(metadata, outputs, captured, 2048).equal, f"next_n={next_n}: replay {replay}"
        assert not any(bool(select.state.any()) for select in fused._selects.values())
