"""Issue 19's context distributions on the CPU: old labels draw the lengths shipped runs were measured
with; the heavy-tailed 'lognormal:MEDIAN:SIGMA' and the ':sorted' request order."""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dsa_lab.batch.workload import LOGNORMAL_CLIP, ContextSpec, order_lengths
from dsa_lab.paths import resolve_data_path
from dsa_lab.store import folders as store

# sha256 (first 16 hex digits) of ','.join(seq_lens) and the first lengths, drawn before issue 19 changed
# ContextSpec: runs are stored by context label and seed, and every reader draws the lengths again.
PINNED_MIXED = {
    ("mixed:1024-65536", 1): ("f7abacc7cbca7568", (8065,)),
    ("mixed:1024-65536", 16): ("8eb440f3825e1592", (8065, 24995, 1479)),
    ("mixed:1024-65536", 64): ("47d55598e0ca3087", (8065, 24995, 1479)),
    ("mixed:1024-65536", 128): ("9f495c6c3928adde", (8065, 24995, 1479)),
    ("mixed:16384-65536", 128): ("e3aa8d93c02fb6ed", (32598, 47526, 18522)),
    ("mixed:2048-131072", 64): ("83a29cf3339a9113", (16131, 49989, 2959)),
    ("mixed:2048-131072", 128): ("e07f8c96733174fa", (16131, 49989, 2959)),
    ("mixed:64-256", 16): ("bdc0b34442aee0ff", (127, 186, 72)),
    ("mixed:1024-8192", 16): ("c9eb9faea79375bd", (2874, 5059, 1231)),
}
SHIPPED_RUNS = ("h200/h200-full-20261129", "h200/h200-issue13-20261130", "h200/h200-harness-20261130")


def _digest(lens: tuple[int, ...]) -> str:
    return hashlib.sha256(",".join(map(str, lens)).encode()).hexdigest()[:16]


@pytest.mark.parametrize(("key", "pinned"), PINNED_MIXED.items())
def test_old_context_labels_draw_the_lengths_they_always_drew(key, pinned) -> None:
    label, batch = key
    spec = ContextSpec.parse(label)
    assert spec.label == label and spec.order == "shuffled" and spec.distribution == "mixed"
    lens = spec.seq_lens(batch, 0)
    assert (_digest(lens), lens[:3]) == pinned


@pytest.mark.parametrize("run", SHIPPED_RUNS)
def test_shipped_runs_load_with_their_lengths(run) -> None:
    """Every (context, batch) a shipped run stored parses to its own label and draws the pinned lengths."""
    path = resolve_data_path(run)
    if not path.is_dir():
        pytest.skip(f"data/{run} is not in this checkout")
    results = store.load_run(path).results
    pairs = results[["context", "batch"]].drop_duplicates().itertuples(index=False)
    for context, batch in pairs:
        spec = ContextSpec.parse(context)
        assert spec.label == context
        lens = spec.seq_lens(int(batch), 0)
        if spec.mixed:
            assert (_digest(lens), lens[:3]) == PINNED_MIXED[(context, int(batch))]
        else:
            assert lens == (int(context),) * int(batch)


@pytest.mark.parametrize(
    ("typed", "label", "short"),
    [
        ("64K", "65536", "64K"),
        ("mixed:1K-64K", "mixed:1024-65536", "mixed 1K-64K"),
        ("mixed:1K-64K:sorted", "mixed:1024-65536:sorted", "mixed 1K-64K, sorted"),
        ("mixed:64-256:shuffled", "mixed:64-256", "mixed 64-256"),
        ("lognormal:8K:1.50", "lognormal:8192:1.5", "lognormal 8K σ1.5"),
        ("LOGNORMAL:16384:2:sorted", "lognormal:16384:2.0:sorted", "lognormal 16K σ2, sorted"),
    ],
)
def test_context_labels_are_canonical_and_round_trip(typed, label, short) -> None:
    spec = ContextSpec.parse(typed)
    assert (spec.label, spec.short) == (label, short)
    assert ContextSpec.parse(spec.label) == spec


def test_lognormal_is_seeded_clipped_and_heavy_tailed() -> None:
    spec = ContextSpec.parse("lognormal:8K:1.5")
    lens = torch.tensor(spec.seq_lens(4096, 0), dtype=torch.float64)
    assert spec.seq_lens(64, 0) == spec.seq_lens(4096, 0)[:64] and spec.seq_lens(64, 1) != spec.seq_lens(64, 0)
    assert (spec.low, spec.high) == LOGNORMAL_CLIP and spec.mixed
    assert LOGNORMAL_CLIP[0] <= lens.min() and lens.max() <= LOGNORMAL_CLIP[1]
    # independent check of the draw: log(len / median) is N(0, sigma^2) inside the clip
    logs = (lens / 8192).log()
    inside = (lens > LOGNORMAL_CLIP[0]) & (lens < LOGNORMAL_CLIP[1])
    assert abs(float(logs.median())) < 0.05
    assert abs(float(logs[inside].std()) - 1.5) < 0.1
    # heavy tail: the longest 5% of requests hold over a quarter of the tokens
    top = lens.sort(descending=True).values[: len(lens) // 20]
    assert float(top.sum() / lens.sum()) > 0.25
    clipped = ContextSpec.parse("lognormal:128K:3").seq_lens(256, 0)
    assert max(clipped) == LOGNORMAL_CLIP[1] and min(clipped) == LOGNORMAL_CLIP[0]


def test_sorted_order_keeps_the_lengths_and_puts_the_shortest_first() -> None:
    for label in ("mixed:1K-64K", "lognormal:8K:1.5"):
        drawn = ContextSpec.parse(label).seq_lens(33, 4)
        ordered = ContextSpec.parse(f"{label}:sorted").seq_lens(33, 4)
        assert ordered == tuple(sorted(drawn)) and ordered != drawn
    assert order_lengths((3, 1, 2), "shuffled") == (3, 1, 2)


@pytest.mark.parametrize(
    "bad",
    [
        "65536:sorted",
        "lognormal:8K",
        "lognormal:8K:0",
        "lognormal:8K:nan",
        "lognormal:8K:5",
        "lognormal:32:1",
        "lognormal:256K:1",
        "mixed:64K-1K",
        "mixed:1K-64K:backwards",
        "lognormal:8K:1:2",
    ],
)
def test_bad_context_specs_are_refused_by_name(bad) -> None:
    with pytest.raises(ValueError, match="context=.*lognormal:MEDIAN:SIGMA"):
        ContextSpec.parse(bad)
    with pytest.raises(ValueError, match="order="):
        order_lengths((1, 2), "reversed")


@given(
    median=st.integers(*LOGNORMAL_CLIP),
    sigma=st.floats(min_value=1e-3, max_value=4.0, allow_nan=False),
    order=st.sampled_from(("", ":sorted", ":shuffled")),
)
def test_lognormal_labels_round_trip(median, sigma, order) -> None:
    spec = ContextSpec.parse(f"lognormal:{median}:{sigma}{order}")
    assert ContextSpec.parse(spec.label) == spec and spec.sigma == sigma and spec.median == median
