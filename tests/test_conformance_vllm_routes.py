"""Conformance with the real vLLM 0.33.0 (d): MTP acceptance -> ragged decode lengths -> the step's path.

`policy.step_route` against vLLM 0.33's own split and `build()` on every builder case, and the routes the
shipped H200 serving run recorded.

vLLM is imported at module top on purpose (here and in tests/vllm_support.py): without it this module must
fail, not skip.
"""

from __future__ import annotations

import itertools

import vllm.v1.attention.backends.mla.rocm_paged_mxfp4_indexer as vllm_rocm_mxfp4
import vllm_support
from vllm_support import (
    ADAPTIVE,
    STEP_CASES,
    STEP_NEXT_NS,
    VllmStartup,
    our_platform,
    vllm_build,
    vllm_startup,
    vllm_step_is_native,
    vllm_step_metadata,
)

from dsa_lab.batch.acceptance import AcceptanceSpec
from dsa_lab.policy.query import PolicyQuery
from dsa_lab.policy.steps import step_route
from dsa_lab.policy.vllm import supports_varlen, vllm_0_33_0

# --- (d) MTP acceptance -> ragged decode lengths -> the step's path -------------------------------

ROUTE_PROFILES = ("accept:0.9,0.7,0.5,0.3,0.1", "accept:0.6,0.3,0.1,0.05,0.02")
ROUTE_GRID_BUILDS = 276


def vllm_route(startup: VllmStartup, name: str, deep_gemm: bool, decode_lens: tuple[int, ...]):
    """vLLM's own answer for one step: the builder's split (`split_decodes_and_prefills` with the
    arguments its `build()` passes), then its `build()` on the requests that stay decodes, read as
    native / padded (native with `requires_padding`) / flatten. (`build()` on the whole step would also
    build the prefill part, which launches a Triton kernel this CPU process cannot run.)"""
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    builder = startup.builder
    require_uniform = not (builder.use_flattening or builder.supports_varlen)
    decodes, prefills, _, _ = split_decodes_and_prefills(
        vllm_step_metadata(decode_lens), builder.decode_threshold, require_uniform, not builder.use_pcp
    )
    kept = decode_lens[:decodes]
    meta = vllm_build(startup, name, deep_gemm, kept)
    assert meta.num_decodes == decodes and meta.num_prefills == 0
    if not vllm_step_is_native(meta, max(kept)):
        return "flatten", decodes, prefills
    rocm = isinstance(meta, vllm_rocm_mxfp4.RocmMxfp4IndexerMetadata)
    return ("padded" if meta.decode.requires_padding and not rocm else "native"), decodes, prefills


def test_acceptance_decode_lengths_take_vllms_path() -> None:
    """Acceptance profile -> seeded decode lengths (`AcceptanceSpec.decode_lens`) -> `policy.step_route`,
    against vLLM 0.33's own split and `build()` on every builder case, with and without adaptive
    verification: the requests it keeps as decodes, those it sends to prefill, and the path. A dense
    builder's step ends in a CUDA-graph padding request (0 rows). SM100 + DeepGEMM takes the varlen
    kernel, which cannot run here: there only our answer is checked ('varlen')."""
    builds, outcomes = 0, set()
    for (name, deep_gemm, arch, fp4), adaptive, next_n in itertools.product(STEP_CASES, ADAPTIVE, STEP_NEXT_NS):
        query = PolicyQuery(our_platform(name, deep_gemm), next_n, fp4, adaptive, arch)
        if vllm_0_33_0(query).path == "rejected":
            continue
        startup = vllm_startup(name, deep_gemm, next_n, adaptive, arch, fp4)
        for profile in ROUTE_PROFILES:
            lens = AcceptanceSpec.parse(profile).decode_lens(5, next_n, seed=next_n)
            if vllm_0_33_0(query).builder == "dense":
                lens += (0,)
            ours = step_route(query, lens)
            where = f"{name} dg={deep_gemm} {arch} fp4={fp4} next_n={next_n} adaptive={adaptive} lens={lens}"
            if supports_varlen(query.platform):
                assert ours.path == "varlen" and ours.prefills == 0, where
                continue
            assert (ours.path, ours.decodes, ours.prefills) == vllm_route(startup, name, deep_gemm, lens), where
            assert ours.max_decode_len == max(lens[: ours.decodes]), where
            builds += 1
            outcomes.add((ours.path, ours.prefills > 0))
    assert builds == ROUTE_GRID_BUILDS
    assert outcomes == {("native", True), ("native", False), ("padded", False), ("flatten", False)}


def test_the_shipped_serving_runs_routes_are_what_vllm_builds(monkeypatch) -> None:
    """Every acceptance point the H200 serving run stored: the point's own seeded decode lengths
    (`bench.point.Point.decode_lens`, B = 128) through vLLM 0.33's split and `build()` on SM90 + DeepGEMM
    with adaptive verification (drafts admitted per request) give the route the run recorded (`vllm_route`)."""
    from dsa_lab import axes
    from dsa_lab.bench.point import Point
    from dsa_lab.paths import resolve_data_path
    from dsa_lab.store import folders as store

    run = store.load_run(resolve_data_path("h200/h200-serving-20261201"))
    rows = run.results[run.results["acceptance"] != "none"].drop_duplicates("next_n")
    assert len(rows) == 5
    monkeypatch.setattr(vllm_support, "CAPACITY", 128 * 8)  # a B = 128 step's tokens (its builders read it)
    for row in rows.to_dict("records"):
        point = Point(**{name: row[name] for name in axes.NAMES})
        lens = point.decode_lens(run.provenance["seed"])
        startup = vllm_startup("h200_sm90", True, point.next_n, True, "DeepseekV32ForCausalLM", False)
        assert startup.error is None, startup.error
        where = f"next_n={point.next_n} acceptance={point.acceptance}"
        route = vllm_route(startup, "h200_sm90", True, lens)
        assert (row["vllm_route"], row["vllm_decodes"], row["vllm_prefills"]) == route, where
