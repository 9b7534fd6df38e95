"""The sweep presets, each a named grid of the axes (`preset(name)`): 'ci' (CPU, tiny), 'smoke' (GPU, small),
'h200-full' (the study's grid on an H200), 'sm100' (the same grid for a B200/GB200), 'h200-serving' (issue 19's
serving study: a union of named grids, `serving_grids`) and 'step' (the decode step a user pays for, issue 26:
`step_grids`). A grid is data, one key per axis (attention-gym's YAML grids are the model); each preset's backends
are those that declare it (`LogitsBackend.presets`), so no backend is named here.
"""

from __future__ import annotations

from typing import Any

from dsa_lab.batch.metadata import STRATEGIES
from dsa_lab.batch.plan import DEEPSEEK_V32_MAX_MODEL_LEN
from dsa_lab.bench.point import Grid, SweepSpec
from dsa_lab.bench.timing import TimingConfig
from dsa_lab.errors import check_choice
from dsa_lab.kernels import family_of, preset_backends, vllm_backend

PRESETS = ("ci", "smoke", "h200-full", "sm100", "h200-serving", "step")

STUDY_GRID = {
    "batch": (1, 16, 64, 128),
    "context": ("8192", "32768", "65536", "131072", "mixed:1024-65536"),
    "next_n": (1, 2, 3, 4, 5, 6, 8),
}
STUDY_TIMING = TimingConfig(warmup=3, min_samples=10, max_samples=100, max_seconds=0.25)
# The CPU preset: one intra-op thread and at least 0.15 s of samples per point (a few ms a call), so that three
# back-to-back runs agree instead of jumping by 100x with the thread pool on a busy machine.
CPU_TIMING = TimingConfig(warmup=2, min_samples=10, max_samples=2000, max_seconds=0.6, min_seconds=0.15, window=8)


SERVING = "h200-serving"
SERVING_SPOT_CHECK = f"{SERVING}:spot-check"  # a backend of h200-full that joins only the serving study's spot check
RAGGED = "mixed:2048-131072"  # the serving study's ragged batch (issue 19's mixed:2K-128K)
HEAVY_TAIL = "lognormal:16384:1.2"  # most requests near 16K, a 99th percentile of ~270K clipped to 160K
MODEL_WIDTH = f"model:{DEEPSEEK_V32_MAX_MODEL_LEN}"  # vLLM's logits width for DeepSeek-V3.2
ALL_NEXT_N = tuple(range(1, 9))
WIDTH_NEXT_N = (1, 3, 4, 6, 8)
SMALL_NEXT_N = (1, 2, 3, 4, 6, 8)
# One published acceptance curve per next_n it has positions for (`acceptance.PUBLISHED`); next_n = 6 takes the
# 7-position curve's first 5, labelled so.
SERVING_ACCEPTANCE = (
    (2, "v3-sglang3582"),
    (3, "v4flash-vllm41044"),
    (4, "v4flash-ascend131"),
    (6, "v4flash-dspark-ascend13640:5"),
    (8, "v4flash-dspark-ascend13640"),
)


def serving_grids() -> tuple[Grid, ...]:
    """The grids of `h200-serving`, in the order they run (issue 19's serving study; issue 18's goals first).

    Backends are those of `h200-full`, but for those that declare they join only the spot check
    (`SERVING_SPOT_CHECK`), which run a few native points of their own. Another build of vLLM's own library
    (of the family of vLLM's backend) launches vLLM's one-row kernel for flatten, so it runs native and
    atom only (its flatten would time that kernel twice).
    """
    spot, vllm = preset_backends(SERVING_SPOT_CHECK), vllm_backend().name
    main = tuple(b for b in preset_backends("h200-full") if b not in spot)
    builds = tuple(b for b in main if b != vllm and b in family_of(vllm))

    def grid(name: str, build_strategies: tuple[str, ...] = ("native", "atom"), **values: Any) -> Grid:
        left = [(b, s) for b in builds for s in STRATEGIES if s not in build_strategies]
        return Grid.of(name, left, backend=main, strategy=STRATEGIES, **values)

    ragged = {"batch": 128, "context": RAGGED}
    grids = [
        grid("goals", batch=128, context=("32768", "65536", "131072", RAGGED, "mixed:16384-65536"), next_n=ALL_NEXT_N),
        grid("goals", batch=(64, 256), context=("65536", RAGGED), next_n=ALL_NEXT_N),
        grid("width", ("native",), batch=128, context=("65536", RAGGED), next_n=WIDTH_NEXT_N, logits_width=MODEL_WIDTH),
        grid("top-k", **ragged, next_n=(1, 3, 4, 6), timed="logits+topk"),
        grid("graphs", **ragged, next_n=(1, 3, 4), timed="logits+topk", timer="graph"),
        grid("small batches", batch=1, context=("65536", RAGGED), next_n=SMALL_NEXT_N),
        grid("small batches", batch=16, context=("65536", RAGGED, HEAVY_TAIL), next_n=SMALL_NEXT_N),
        *(grid("acceptance", **ragged, next_n=n, acceptance=curve) for n, curve in SERVING_ACCEPTANCE),
        grid("heavy tail", batch=128, context=HEAVY_TAIL, next_n=ALL_NEXT_N),
    ]
    if spot:
        native = {"strategy": "native", "batch": 128, "context": ("65536", RAGGED)}
        grids.append(Grid.of("spot check", backend=spot, **native, next_n=(1, 3, 4, 8)))
    return tuple(grids)


STEP = "step"
STEP_BATCHES = (1, 16, 64, 128, 256)
STEP_NEXT_N = (1, 3, 4, 6)


def step_grids() -> tuple[Grid, ...]:
    """The grids of `step`: the decode step a user pays for (issue 26), logits then vLLM's top-k, at vLLM's
    logits width, B 1-256, on the serving study's ragged batch (and a uniform 64K one under graphs), beside
    the logits alone under the same timer, so each option's step splits into logits and top-k; then ragged
    verification (`bench.replay`): per published acceptance curve, one graph replayed over steps whose requests
    verify different numbers of drafts, natively against vLLM's route (flatten on SM90).

    Backends are those that declare `step`. vLLM's own library runs every strategy (its route among them);
    another build of it native and atom (its flatten launches vLLM's one-row kernel: the same time twice);
    every other backend its native launch, the one option a kernel native for any next_n offers.
    """
    backends, vllm = preset_backends(STEP), vllm_backend().name
    builds = [b for b in backends if b != vllm and b in family_of(vllm)]
    leave = [(b, s) for b in backends if b != vllm for s in STRATEGIES if s != "native"]
    leave = [(b, s) for b, s in leave if not (b in builds and s == "atom")]
    step = {"backend": backends, "strategy": STRATEGIES, "batch": STEP_BATCHES, "next_n": STEP_NEXT_N}
    step |= {"logits_width": MODEL_WIDTH, "timed": ("logits", "logits+topk"), "topk_impl": "vllm"}
    verify = {**step, "batch": 128, "context": RAGGED, "timer": "replay"}
    ragged = [(b, s) for b in backends if b != vllm for s in STRATEGIES if s != "native"]
    return (
        Grid.of("whole step, graphs", leave, context=(RAGGED, "65536"), timer="graph", **step),
        Grid.of("whole step, events", leave, context=RAGGED, timer="events", **step),
        *(
            Grid.of("ragged verification", ragged, **{**verify, "next_n": n, "acceptance": curve})
            for n, curve in SERVING_ACCEPTANCE
        ),
    )


def preset(name: str) -> SweepSpec:
    """'ci' (CPU, tiny), 'smoke' (GPU, small), 'h200-full' (the study's grid on an H200), 'sm100' (the same
    grid for a B200/GB200, where DeepGEMM and Triton are native for any next_n, so atom plans are one native
    piece and recorded as skipped), 'h200-serving' (the serving study: a union of grids, `serving_grids`) or
    'step' (the whole decode step with vLLM's top-k on any SM90 GPU: `step_grids`).
    Each preset's backends are those that declare it (`LogitsBackend.presets`)."""
    check_choice("preset", name, PRESETS)
    if name == SERVING:
        return SweepSpec(grids=serving_grids(), timing=STUDY_TIMING)
    if name == STEP:
        return SweepSpec(grids=step_grids(), timing=STUDY_TIMING)
    backend = preset_backends(name)
    if name == "ci":
        grid = {
            "batch": (2,),
            "context": ("192", "mixed:64-256"),
            "next_n": (1, 2, 3),
            "heads": (32,),
            "head_dim": (64,),
        }
        return SweepSpec(backend=backend, timing=CPU_TIMING, **grid)
    if name == "smoke":
        timing = TimingConfig(warmup=3, min_samples=10, max_samples=50, max_seconds=0.2)
        return SweepSpec(
            backend=backend, batch=(1, 8), context=("4096", "mixed:1024-8192"), next_n=(1, 2, 3, 4), timing=timing
        )
    return SweepSpec(backend=backend, timing=STUDY_TIMING, **STUDY_GRID)
