"""Ragged verification (issue 26): one CUDA graph, captured once, replayed over decode steps whose requests
verify different numbers of drafts, the per-request lengths living only in device tensors.

Adaptive verification (vLLM #51303) lets every request verify its own number of drafts, chosen on the
device inside one CUDA graph. vLLM 0.33 flattens every such step on SM90 (`policy.steps.step_route`):
no SM90 kernel there takes per-request query lengths from the device. A kernel that reads each row's
context from a device tensor and skips a row of context 0 can take the step natively: that is what the
timer 'replay' measures.

The graph holds, for B requests of the point's cached lengths and one CUDA-graph padding request
(length 0), every row a step may bring (next_n each), in one of two layouts: native `[B + 1, next_n]`,
each row's context computed from the requests' lengths and drafts (row j of a request of L tokens
verifying d rows sees L - d + 1 + j tokens, a row j >= d none), or vLLM's route on SM90, flatten, packed
as vLLM packs it: the verified rows first, request-major, each a one-row pseudo-request re-reading its
request's blocks, the padding after them. Both are laid out on the device from int32 device tensors
(`RaggedGraph.prepare`: no host read), before each replay and outside the timed graph, as vLLM's metadata
builder writes a step's before its graph replays; the graph itself holds the backend's schedule (made on
the device), the logits and the point's top-k, bounded by the longest context a step can have. Before each
replay new decode lengths are drawn from the point's acceptance profile (a fresh seed per replay) and
copied in, the outputs are poisoned with NaN, the L2 is flushed and the replay is timed between CUDA
events. After it, every replay is checked: the logits of sampled requests' verified rows against the
reference, no NaN left there, and the top-k of every row, padding included, against `topk_per_row`,
tie-aware. The row records the replays, the wrong ones and the worst error; a point with any wrong replay
is failed.

(A flattened layout that leaves each request's unverified rows in place, as pseudo-requests of context 0
between the verified ones, made DeepGEMM's SM90 kernel wrong on an H100: 0.51 relative error on the last
request's rows. vLLM never lays a step out so; this one does not either.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dsa_lab.batch.acceptance import AcceptanceSpec
from dsa_lab.batch.cache import BLOCK_SIZE
from dsa_lab.batch.workload import DecodeInputs
from dsa_lab.bench.point import Point
from dsa_lab.bench.timing import GpuSpin, L2Flusher, TimingConfig, step_timing_method, summarize
from dsa_lab.kernels import LogitsBackend, LogitsCall, baseline_backend
from dsa_lab.topk import DEFAULT_TOPK, TopkCall, compare_selections, get_topk, topk_per_row

REPLAYS = 32  # decode steps one captured graph is replayed over, each drawn afresh and checked
REPLAY_STRATEGIES = ("native", "flatten")


@dataclass
class RaggedGraph:
    """The graph's static device tensors: what every step may bring (the sources), the requests' lengths and
    drafts (written before a replay), and the launch the graph reads, laid out by `prepare` on the device."""

    seq_lens: torch.Tensor  # int32 [R]: each request's tokens, its verified rows included; the pad's 0 (R = B + 1)
    decode_lens: torch.Tensor  # int32 [R]: rows each request verifies this step, written before a replay
    q_rows: torch.Tensor  # fp8 [R, n, H, D]: every row a step may bring (the source)
    w_rows: torch.Tensor  # float32 [R * n, H]
    tables: torch.Tensor  # int32 [R, W]: each request's block table (the pad's all block 0)
    q: torch.Tensor  # the launch's: fp8 [R, n, H, D] native, [R * n, 1, H, D] flatten
    weights: torch.Tensor  # float32 [R * n, H]
    block_table: torch.Tensor  # int32 [R, W] native, [R * n, W] flatten
    context: torch.Tensor  # int32 [R, n] native, [R * n, 1] flatten
    slots: torch.Tensor  # int64 [R, n]: the launch row of request b's row j this step
    next_n: int
    flatten: bool

    def prepare(self) -> None:
        """Lay the step out from the requests' lengths and drafts, on the device, with no host read: natively, row
        j of request b (of L tokens, verifying d rows) sees L - d + 1 + j tokens and a row j >= d none; flattened
        as vLLM packs it, the verified rows come first, request-major, each a pseudo-request of one row with its
        request's block table, and the padding after them (context 0, block 0)."""
        n, device = self.next_n, self.seq_lens.device
        j = torch.arange(n, device=device, dtype=torch.int32)[None, :]
        dec, seq = self.decode_lens[:, None], self.seq_lens[:, None]
        verified = j < dec
        rows = torch.where(verified, seq - dec + 1 + j, torch.zeros_like(j))
        if not self.flatten:
            self.context.copy_(rows)
            self.slots.copy_(torch.arange(rows.numel(), device=device).reshape(rows.shape))
            return
        ends = torch.cumsum(self.decode_lens, 0)
        slot = torch.arange(rows.numel(), device=device)
        owner = torch.searchsorted(ends, slot, right=True).clamp(max=len(self.seq_lens) - 1)
        row = slot - (ends - self.decode_lens)[owner]
        real = slot < ends[-1]
        source = torch.where(real, owner * n + row, torch.zeros_like(slot))
        self.context.copy_(torch.where(real, rows.reshape(-1)[source], 0)[:, None])
        self.q.copy_(self.q_rows.reshape(-1, *self.q_rows.shape[2:])[source][:, None])
        self.weights.copy_(self.w_rows[source])
        pad = torch.full_like(owner, len(self.seq_lens) - 1)
        self.block_table.copy_(self.tables[torch.where(real, owner, pad)])
        taken = torch.where(verified, (ends - self.decode_lens)[:, None] + j, -1).reshape(-1)
        self.slots.copy_(taken.reshape(self.slots.shape))


def ragged_graph(inputs: DecodeInputs, next_n: int, strategy: str, seed: int) -> RaggedGraph:
    """The graph's tensors for `inputs`' requests plus one padding request, in `strategy`'s layout (fresh
    random queries and weights for every row a step may bring; the cache and its block tables are the point's)."""
    batch, cache, device = inputs.batch, inputs.cache, inputs.q.device
    requests, heads, dim = batch.batch_size + 1, batch.num_heads, batch.head_dim
    gen = torch.Generator(device=device).manual_seed(seed + 7)
    q_rows = torch.randn(requests, next_n, heads, dim, generator=gen, device=device).to(torch.float8_e4m3fn)
    w_rows = torch.randn(requests * next_n, heads, generator=gen, device=device) * heads**-0.5
    pad_row = torch.zeros_like(cache.block_table[:1])  # block 0: a real block no row of the pad reads
    tables = torch.cat([cache.block_table, pad_row]).contiguous()
    seq = torch.tensor([*batch.seq_lens, 0], dtype=torch.int32, device=device)
    slots = torch.zeros(requests, next_n, dtype=torch.int64, device=device)
    if strategy == "flatten":
        q = torch.empty(requests * next_n, 1, heads, dim, dtype=q_rows.dtype, device=device)
        table = torch.empty(requests * next_n, tables.shape[1], dtype=tables.dtype, device=device)
        context = torch.zeros(requests * next_n, 1, dtype=torch.int32, device=device)
        weights = torch.empty_like(w_rows)
    else:
        q, table, weights = q_rows, tables, w_rows
        context = torch.zeros(requests, next_n, dtype=torch.int32, device=device)
    return RaggedGraph(
        seq, torch.zeros_like(seq), q_rows, w_rows, tables, q, weights, table, context, slots, next_n,
        strategy == "flatten",
    )  # fmt: skip


def draws(point: Point, seed: int, replays: int) -> list[tuple[int, ...]]:
    """The rows each request verifies in each replayed step, drawn from the point's acceptance (the pad 0)."""
    spec = AcceptanceSpec.parse(point.acceptance)
    return [(*spec.decode_lens(point.batch, point.next_n, seed + 1 + i), 0) for i in range(replays)]


def ragged_step(
    backend: LogitsBackend,
    graph: RaggedGraph,
    inputs: DecodeInputs,
    width: int,
    topk: TopkCall | None,
    longest: int,
) -> Callable[[], tuple[torch.Tensor, torch.Tensor | None]]:
    """The step the graph captures: the backend's schedule (made on the device from the rows' contexts), the
    logits and the top-k. The layout (`RaggedGraph.prepare`) is written before each replay, outside the timed
    graph, as vLLM's metadata builder writes a step's before its graph replays."""
    cache = inputs.cache

    def step() -> tuple[torch.Tensor, torch.Tensor | None]:
        schedule = backend.schedule(graph.context, BLOCK_SIZE, graph.block_table)
        out = backend.logits(
            LogitsCall(
                graph.q,
                cache.data,
                graph.weights,
                graph.context,
                graph.block_table,
                width,
                schedule,
                cache_dtype=cache.cache_dtype,
            )
        )
        picks = None if topk is None else topk(out, graph.context.reshape(-1), longest)
        return out, picks

    return step


@dataclass
class ReplayCheck:
    """What the checks of every replay found."""

    wrong: int = 0
    worst_rel_err: float = 0.0
    topk_rows: int = 0
    topk_rows_equal: int = 0
    first_problem: str = ""

    def add(self, replay: int, rel_err: float, nans: int, rows: int, rows_equal: int, tolerance: float) -> None:
        self.worst_rel_err = max(self.worst_rel_err, rel_err)
        self.topk_rows += rows
        self.topk_rows_equal += rows_equal
        problems = [
            f"{nans} NaN among the checked rows' valid logits" if nans else "",
            f"relative error {rel_err:.3e} > {tolerance:g}" if not rel_err <= tolerance else "",
            f"top-k: {rows - rows_equal} of {rows} rows pick other scores" if rows_equal < rows else "",
        ]
        problems = [p for p in problems if p]
        if problems:
            self.wrong += 1
            self.first_problem = self.first_problem or f"replay {replay}: " + "; ".join(problems)


def check_replay(
    graph: RaggedGraph,
    inputs: DecodeInputs,
    out: torch.Tensor,
    picks: torch.Tensor | None,
    width: int,
    sample: list[int],
) -> tuple[float, int, int, int]:
    """One replay against the reference: (rel. error and NaN count over the sampled requests' verified rows,
    top-k rows checked and rows equal, tie-aware, over every row)."""
    n, device = graph.next_n, out.device
    context = graph.context.reshape(-1)
    decode = graph.decode_lens.tolist()
    sources = torch.tensor([b * n + j for b in sample for j in range(decode[b])], dtype=torch.long, device=device)
    index = graph.slots.reshape(-1)[sources]  # where the launch put each of those rows this step
    ref = baseline_backend().logits(
        LogitsCall(
            graph.q_rows.reshape(-1, *graph.q_rows.shape[2:])[sources][:, None].contiguous(),
            inputs.cache.data,
            graph.w_rows[sources].contiguous(),
            context[index][:, None].contiguous(),
            graph.tables[sources // n].contiguous(),
            width,
            cache_dtype=inputs.cache.cache_dtype,
        )
    )
    valid = torch.arange(width, device=device)[None, :] < context[index][:, None]
    got = out[index]
    got_valid, ref_valid = got[valid].double(), ref[valid].double()
    nans = int(torch.isnan(got_valid).sum())
    rel_err = float((got_valid.nan_to_num() - ref_valid).norm() / ref_valid.norm().clamp(min=1e-30))
    if picks is None:
        return rel_err, nans, 0, 0
    inside = torch.arange(width, device=device)[None, :] < context[:, None]
    if int(picks.min()) < -1 or not bool(torch.isfinite(out[inside]).all()):  # unwritten picks or logits
        return rel_err, nans, picks.shape[0], 0
    scores = torch.where(inside, out, 0.0)
    expected = topk_per_row(scores, context, picks.shape[1])
    agreement = compare_selections(picks.clone(), expected, scores, atol=0.0, rtol=0.0)
    return rel_err, nans, agreement.rows, agreement.rows_equal


def replay_skip(point: Point) -> str | None:
    """Why a point cannot be timed by 'replay' (None: it can)."""
    if point.strategy not in REPLAY_STRATEGIES:
        return f"timer='replay' runs strategies {REPLAY_STRATEGIES} (one launch a step), not {point.strategy!r}"
    if not AcceptanceSpec.parse(point.acceptance).per_request:
        return "timer='replay' needs an acceptance profile that draws rows per request (not 'none')"
    return None


def replay_point(
    point: Point,
    backend: LogitsBackend,
    inputs: DecodeInputs,
    width: int,
    tolerance: float,
    sample_requests: int,
    seed: int,
    config: TimingConfig,
    replays: int = REPLAYS,
) -> dict[str, Any]:
    """Capture the point's ragged step once, replay it over `replays` steps drawn from its acceptance; the
    row's timing columns (one sample a replay) and what the checks of every replay found."""
    device = inputs.q.device
    graph = ragged_graph(inputs, point.next_n, point.strategy, seed)
    topk = None
    longest = max(inputs.batch.seq_lens)
    if point.timed == "logits+topk":
        topk = get_topk(point.topk_impl).prepare(graph.context.numel(), width, DEFAULT_TOPK, device)
    step = ragged_step(backend, graph, inputs, width, topk, longest)
    steps = draws(point, seed, replays)
    graph.decode_lens.copy_(torch.tensor(steps[0], dtype=torch.int32))
    graph.prepare()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up off the default stream (JIT compiles, the allocator), as capture wants
        for _ in range(max(1, config.warmup)):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        out, picks = step()
    flush, spin = L2Flusher(device), GpuSpin(device)
    lead_us = spin.lead_for(0.0)
    longest_first = max(range(inputs.batch.batch_size), key=lambda b: inputs.batch.seq_lens[b])
    found, samples, host = ReplayCheck(), [], []
    for i, lens in enumerate(steps):
        graph.decode_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.prepare()
        out.fill_(float("nan"))
        if picks is not None:
            picks.fill_(-2)  # no pick is -2: an unwritten selection fails its check
        flush()
        spin(lead_us)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        issued = time.perf_counter()
        begin.record()
        cuda_graph.replay()
        end.record()
        host.append((time.perf_counter() - issued) * 1e6)
        torch.cuda.synchronize(device)
        samples.append(begin.elapsed_time(end))
        sample = list(dict.fromkeys([i % inputs.batch.batch_size, longest_first]))[: max(1, sample_requests)]
        found.add(i, *check_replay(graph, inputs, out, picks, width, sample), tolerance)
    method = step_timing_method(device, "replay", config)
    measurement = summarize(samples, host, "cuda", method, "max_samples", config, lead_us)
    row = {
        **measurement.as_row(),
        "replays": replays,
        "replays_wrong": found.wrong,
        "rel_err": found.worst_rel_err,
        "topk_rows": found.topk_rows,
        "topk_rows_equal": found.topk_rows_equal,
        "topk_kernel": None if topk is None else topk.kernel,
    }
    del cuda_graph
    if found.wrong:
        return {
            **row,
            "status": "failed",
            "message": f"{found.wrong} of {replays} replays wrong; {found.first_problem}",
        }
    return {**row, "status": "ok", "message": ""}
