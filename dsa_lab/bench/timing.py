"""Timing one callable: CUDA events (cold or warm L2) or graph replays, wall clock on CPU.

Each sample times one call. With `cold_l2` a buffer of at least twice the L2 is
zeroed before every timed call (outside the events), so KV blocks left in L2 by the
previous call cannot make the next look faster. Sampling stops by `bench.measurement`'s
noise rule (`StoppingRule`), whose `TimingConfig` and `Measurement` these timers take and return
(imported here, where callers find them). Before each timed call the GPU is kept busy by a spin
kernel longer than the host takes to issue the call (nvbench's blocking-kernel idea), so
the events time the GPU work and not Python's launch overhead, which for small shapes
exceeds the kernel itself; that overhead is reported apart as `host_us`. Graph mode
captures `graph_launches` calls and divides a replay by that count; it cannot flush L2
between the captured calls, and says so in `timing_method`. `time_step` times a whole decode step
('events' or 'graph': one step per graph, so L2 can be flushed before each replay, outside it).

On the CPU, torch's intra-op thread pool makes wall-clock samples of a small call jump by
orders of magnitude on a busy machine (a 1 ms call measured at 50 ms when a second thread
is preempted), so CPU timing runs with `cpu_threads` intra-op threads (one by default;
the count before is restored after) and each row records the count (`torch_threads`).
Every point samples for at least `min_seconds` (the role of `triton.testing.do_bench`'s
`rep`), so a fast call is not summarized by a handful of samples; and a point whose
relative IQR exceeds `noisy_rel_iqr` is flagged `noisy`, in its row and in tables.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import torch

from dsa_lab.axes import TIMERS
from dsa_lab.bench.measurement import Measurement, StoppingRule, TimingConfig, summarize
from dsa_lab.errors import check_choice

DEFAULT_TIMING = TimingConfig()
FLUSH_L2_MULTIPLE = 2
DEFAULT_L2_BYTES = 60 * 1024 * 1024  # H200; used when the device does not report its L2


class L2Flusher:
    """Zeroes a buffer of FLUSH_L2_MULTIPLE x the L2 size, evicting whatever the last call left there."""

    def __init__(self, device: torch.device) -> None:
        self.nbytes = flush_bytes(device)
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class GpuSpin:
    """Queues a busy-wait of a given length on the GPU (torch.cuda._sleep counts SM cycles).

    Cycles per microsecond: the larger of a calibration and the rated clock, so that a GPU
    running below its rated clock spins longer than asked, never shorter.
    """

    MIN_US = 50.0
    MAX_US = 20_000.0

    def __init__(self, device: torch.device) -> None:
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # raise the clocks before calibrating
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize(device)
        calibrated = cycles / max(begin.elapsed_time(end) * 1e3, 1e-3)
        rated = getattr(torch.cuda.get_device_properties(device), "clock_rate", 0) / 1e3  # kHz
        self.cycles_per_us = max(calibrated, rated)

    def lead_for(self, host_us: float) -> float:
        """A spin comfortably longer than the host's issue time."""
        return min(self.MAX_US, max(self.MIN_US, 2.0 * host_us + 20.0))

    def __call__(self, us: float) -> None:
        torch.cuda._sleep(int(us * self.cycles_per_us))


def flush_bytes(device: torch.device) -> int:
    """Bytes the cold-L2 flush buffer takes on `device` (0 off CUDA)."""
    if device.type != "cuda":
        return 0
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or DEFAULT_L2_BYTES
    return FLUSH_L2_MULTIPLE * l2


def timing_method(device: torch.device, config: TimingConfig) -> str:
    """What `time_callable` measures on `device` under `config`, as its rows and provenance name it."""
    if device.type != "cuda":
        return "wall_clock"
    if config.use_graph:
        return "cuda_graph_warm_l2"
    return "cuda_events_cold_l2" if config.cold_l2 else "cuda_events_warm_l2"


def time_callable(
    fn: Callable[[], object], device: torch.device | str, config: TimingConfig = DEFAULT_TIMING
) -> Measurement:
    """Time `fn` on `device`: CUDA events (per call) or graph replays on CUDA, wall clock elsewhere."""
    device = torch.device(device)
    if device.type != "cuda":
        return _time_wall_clock(fn, config)
    if config.use_graph:
        return _time_graph(fn, device, config)
    return _time_events(fn, device, config)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to `count` for the block, and restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _time_wall_clock(fn: Callable[[], object], config: TimingConfig) -> Measurement:
    with torch_threads(config.cpu_threads):
        for _ in range(config.warmup):
            fn()
        rule, host = StoppingRule(config), []
        while (stop := rule.reason()) is None:
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            host.append(elapsed * 1e6)
            rule.add(elapsed * 1e3)
        return summarize(rule.samples, host, "cpu", timing_method(torch.device("cpu"), config), stop, config)


def _time_events(fn: Callable[[], object], device: torch.device, config: TimingConfig) -> Measurement:
    flush = L2Flusher(device) if config.cold_l2 else None
    with torch.cuda.device(device):
        warm_host = []
        for _ in range(max(1, config.warmup)):
            issued = time.perf_counter()
            fn()
            warm_host.append((time.perf_counter() - issued) * 1e6)
            torch.cuda.synchronize(device)
        spin = GpuSpin(device)
        lead_us = spin.lead_for(float(np.median(warm_host)))
        rule, host, stop = _event_samples(fn, device, config, flush, spin, lead_us)
        del flush
    return summarize(rule.samples, host, "cuda", timing_method(device, config), stop, config, lead_us)


def _time_graph(fn: Callable[[], object], device: torch.device, config: TimingConfig) -> Measurement:
    n = config.graph_launches
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the default stream, as graph capture requires
            for _ in range(max(1, config.warmup)):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(n):
                fn()
        graph.replay()
        torch.cuda.synchronize(device)
        spin = GpuSpin(device)
        lead_us = spin.lead_for(0.0)
        rule, host = StoppingRule(config), []
        while (stop := rule.reason()) is None:
            pairs = []
            for _ in range(config.sync_every):
                spin(lead_us)
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                issued = time.perf_counter()
                begin.record()
                graph.replay()
                end.record()
                host.append((time.perf_counter() - issued) * 1e6 / n)
                pairs.append((begin, end))
            torch.cuda.synchronize(device)
            for begin, end in pairs:
                rule.add(begin.elapsed_time(end) / n)
        del graph
    return summarize(rule.samples, host, "cuda", timing_method(device, config), stop, config, lead_us)


def step_timing_method(device: torch.device, method: str, config: TimingConfig) -> str:
    """What `time_step` measures on `device` with timer `method` (`axes.TIMERS`), as rows and provenance
    name it ('graph' off CUDA is an error)."""
    check_choice("timer", method, TIMERS)
    if method == "events":
        return timing_method(device, replace(config, use_graph=False))
    if device.type != "cuda":
        raise ValueError(
            f"timer={method!r}: CUDA-graph replay needs a CUDA device, this step runs on {device}; "
            "allowed here: 'events' (wall clock off CUDA)"
        )
    if method == "replay":
        return "cuda_graph_replay_ragged_cold_l2"  # `bench.replay`: one graph over many ragged steps
    return "cuda_graph_step_cold_l2" if config.cold_l2 else "cuda_graph_step_warm_l2"


def time_step(
    step: Callable[[], object], device: torch.device | str, method: str, config: TimingConfig = DEFAULT_TIMING
) -> Measurement:
    """Time one whole decode step (every logits launch, and the top-k for 'logits+topk': see
    `bench.timed_unit`) by `method`:

    - 'events': CUDA events around each eager call (`time_callable`; wall clock off CUDA);
    - 'graph': the step captured once in a CUDA graph, as vLLM replays its decode steps, and each
      sample one replay between CUDA events. What it can flush: with `config.cold_l2` the flush
      buffer is zeroed before every replay, outside the graph, so each replay starts from a cold
      L2 as an event sample does. What it cannot: anything between the launches inside the step
      (neither can vLLM's replay), and the graph's buffers, outputs included, sit at the same
      addresses every replay, as in vLLM. The spin kernel before each replay hides the host's issue
      time (one replay launch). The step must not synchronise the host (capture refuses it); the
      Gluon and DeepGEMM backends' `logits` do not.

    `graph` off CUDA is refused by name: there is no fallback.
    """
    device = torch.device(device)
    name = step_timing_method(device, method, config)
    if method == "replay":
        raise ValueError("timer='replay' times a ragged step over many replays: `bench.replay.replay_point`")
    if method == "events":
        return time_callable(step, device, replace(config, use_graph=False))
    return _time_step_graph(step, device, config, name)


def _time_step_graph(step: Callable[[], object], device: torch.device, config: TimingConfig, name: str) -> Measurement:
    flush = L2Flusher(device) if config.cold_l2 else None
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the default stream (JIT compiles, allocator), as capture requires
            for _ in range(max(1, config.warmup)):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()  # the first replay uploads the graph: not a sample
        torch.cuda.synchronize(device)
        spin = GpuSpin(device)
        lead_us = spin.lead_for(0.0)
        rule, host, stop = _event_samples(graph.replay, device, config, flush, spin, lead_us)
        del graph, flush
    return summarize(rule.samples, host, "cuda", name, stop, config, lead_us)


def _event_samples(
    fn: Callable[[], object],
    device: torch.device,
    config: TimingConfig,
    flush: Callable[[], None] | None,
    spin: GpuSpin,
    lead_us: float,
) -> tuple[StoppingRule, list[float], str]:
    """Samples of `fn` between CUDA events until `config`'s stopping rule says enough: each behind an L2
    flush (when `flush`) and a spin of `lead_us`, synchronised every `sync_every`; (rule, host µs, why)."""
    rule, host = StoppingRule(config), []
    while (stop := rule.reason()) is None:
        pairs = []
        for _ in range(config.sync_every):
            if flush is not None:
                flush()
            spin(lead_us)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            issued = time.perf_counter()
            begin.record()
            fn()
            end.record()
            host.append((time.perf_counter() - issued) * 1e6)
            pairs.append((begin, end))
        torch.cuda.synchronize(device)
        for begin, end in pairs:
            rule.add(begin.elapsed_time(end))
    return rule, host, stop
