"""The Triton paged MQA-logits kernel against the reference, on CPU through Triton's interpreter.

Triton chooses its interpreter when a function is decorated, and triton.language's own
helpers (tl.sum, tl.max) are decorated when triton is first imported. So TRITON_INTERPRET=1
must be set before that import. This module sets it (only where no CUDA device exists,
before importing dsa_lab); if another test module imported triton first in this pytest
process (vllm does), the kernel tests (`test_kernel_*`) run once in a fresh pytest
process instead and each test here reports its outcome there (`kernel_device`).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import xml.etree.ElementTree as ElementTree  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from dsa_lab.batch.metadata import build_native_metadata  # noqa: E402
from dsa_lab.batch.workload import (  # noqa: E402
    DecodeBatch,
    mixed_length_batch,
    ragged_decode_batch,
    random_inputs,
    uniform_batch,
    with_padding,
)
from dsa_lab.decode import pack_launch, run_decode  # noqa: E402
from dsa_lab.errors import BackendUnavailable, UnsupportedShape  # noqa: E402
from dsa_lab.kernels import backend_names, get_backend  # noqa: E402
from dsa_lab.kernels import triton_native as tn  # noqa: E402
from dsa_lab.kernels.reference import paged_mqa_logits  # noqa: E402
from dsa_lab.topk import compare_selections  # noqa: E402

CHILD_FLAG = "DSA_LAB_TRITON_TEST_CHILD"
REL_TOL = 1e-3


# --- where the kernel tests run -------------------------------------------------------------


def _runs_here() -> tuple[bool, str]:
    if torch.cuda.is_available():
        return True, ""
    state = tn.TritonNativeBackend().availability(torch.device("cpu"))
    return state.ok, state.reason


@pytest.fixture(scope="module")
def child_outcomes() -> dict[str, str] | None:
    """None if the kernel runs in this process; else {test name: failure text or ""} from one
    fresh pytest process that sets TRITON_INTERPRET=1 before triton's first import."""
    here, reason = _runs_here()
    if here:
        return None
    if os.environ.get(CHILD_FLAG):
        pytest.fail(f"the interpreter is unavailable even in a fresh process: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        env = {**os.environ, "TRITON_INTERPRET": "1", CHILD_FLAG: "1"}
        command = [
            sys.executable,
            "-m",
            "pytest",
            __file__,
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "test_kernel_",
            f"--junitxml={report}",
        ]
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[1]
        )
        if not report.exists():
            pytest.fail(
                f"child pytest wrote no report (rc={done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        outcomes = {}
        for case in ElementTree.parse(report).iter("testcase"):
            problems = [el.get("message", "") + "\n" + (el.text or "") for el in case if el.tag in ("failure", "error")]
            outcomes[case.get("name")] = "\n".join(problems)
        return outcomes


@pytest.fixture
def kernel_device(request, child_outcomes) -> torch.device | None:
    """The device a kernel test runs on, or None when it already ran in the child process."""
    if child_outcomes is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = request.node.name
    if name not in child_outcomes:
        pytest.fail(f"{name} did not run in the child pytest process")
    if child_outcomes[name]:
        pytest.fail(f"{name} failed in the child pytest process:\n{child_outcomes[name]}")
    return None


# --- helpers ---------------------------------------------------------------------------------


def launch_args(batch: DecodeBatch, seed: int, device: torch.device, extra_columns: int = 0) -> tuple:
    """DeepGEMM-convention arguments of the native launch of a random batch."""
    inputs = random_inputs(batch, seed=seed, device=device)
    launch = pack_launch(build_native_metadata(batch, inputs.cache.block_table).launches[0], inputs)
    return (
        launch.q,
        inputs.cache.data,
        launch.weights,
        launch.context_lens,
        launch.block_table,
        batch.max_seq_len + extra_columns,
    )


def assert_matches(out: torch.Tensor, ref: torch.Tensor, context_lens: torch.Tensor) -> None:
    """Every element written, -inf exactly past each row's context, relative error <= 1e-3."""
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) or NaN outputs"
    valid = torch.arange(out.shape[1], device=out.device)[None, :] < context_lens.reshape(-1, 1)
    assert torch.equal(torch.isfinite(ref), valid)  # the reference itself keeps the contract
    assert torch.equal(torch.isfinite(out), valid), "-inf pattern differs from the context lens"
    assert (out[~valid] == float("-inf")).all()
    if valid.any():
        err = ((out[valid] - ref[valid]).norm() / ref[valid].norm()).item()
        assert err <= REL_TOL, f"relative error {err:.2e}"


def run_poisoned(args: tuple, config: tn.KernelConfig | None = None) -> torch.Tensor:
    out = torch.full((args[0].shape[0] * args[0].shape[1], args[5]), float("nan"), device=args[0].device)
    return tn.paged_mqa_logits_triton(*args, config=config, out=out, cache_dtype="fp8")


# --- the kernel against the reference --------------------------------------------------------

CASES = {
    "n1_H64_D128": (uniform_batch(2, 200, 1, num_heads=64, head_dim=128), 0),
    "n3_H32_D64_ragged_tail": (ragged_decode_batch(3, 20, 300, 3, seed=1, num_heads=32, head_dim=64), 70),
    "n5_H64_D64_padded": (with_padding(mixed_length_batch(2, 65, 257, 5, seed=2, num_heads=64, head_dim=64), 1), 0),
    "n7_H32_D128": (uniform_batch(1, 300, 7, num_heads=32, head_dim=128), 0),
    "n16_H32_D64": (uniform_batch(2, 100, 16, num_heads=32, head_dim=64), 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_reference(name: str, kernel_device) -> None:
    if kernel_device is None:
        return  # ran in the child process
    batch, extra = CASES[name]
    args = launch_args(batch, seed=11, device=kernel_device, extra_columns=extra)
    assert_matches(run_poisoned(args), paged_mqa_logits(*args, cache_dtype="fp8"), args[3])


CONFIGS = {
    "rule": None,
    "rows64_reload_bpp1": tn.KernelConfig(dot_rows=64, resident_weights=False, blocks_per_program=1),
    "rows128_bpp3": tn.KernelConfig(dot_rows=128, blocks_per_program=3),
    "rows256_reload_bpp2": tn.KernelConfig(dot_rows=256, resident_weights=False, blocks_per_program=2),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_kernel_configs_agree(name: str, kernel_device) -> None:
    """Chunk plans (n=7, H=32: 4+2+1 or 2+2+2+1 query rows per dot), weights and KV splits."""
    if kernel_device is None:
        return
    batch = ragged_decode_batch(2, 100, 250, 7, seed=3, num_heads=32, head_dim=64)
    args = launch_args(batch, seed=12, device=kernel_device, extra_columns=5)
    config = CONFIGS[name]
    if config is None:
        config = tn.choose_config(7, 32, 64)
    assert_matches(run_poisoned(args, config), paged_mqa_logits(*args, cache_dtype="fp8"), args[3])


def test_kernel_strided_inputs(kernel_device) -> None:
    """Non-contiguous q / weights and a block table with a wider row stride are read right."""
    if kernel_device is None:
        return
    batch = uniform_batch(2, 150, 2, num_heads=64, head_dim=64)
    q, cache, weights, lens, table, max_len = launch_args(batch, seed=13, device=kernel_device)
    spread = torch.zeros(*q.shape[:-1], 2, q.shape[-1], dtype=torch.uint8, device=q.device)
    spread[..., 0, :] = q.view(torch.uint8)
    q_strided = spread[..., 0, :].view(torch.float8_e4m3fn)
    weights_strided = weights.t().contiguous().t()
    table_strided = torch.cat([table, table], dim=1)[:, : table.shape[1]]
    assert not (q_strided.is_contiguous() or weights_strided.is_contiguous() or table_strided.is_contiguous())
    want = run_poisoned((q, cache, weights, lens, table, max_len))
    got = run_poisoned((q_strided, cache, weights_strided, lens, table_strided, max_len))
    assert torch.equal(got, want)


@pytest.mark.parametrize("strategy", ["native", "flatten", "atom"])
def test_kernel_run_decode(strategy: str, kernel_device) -> None:
    """Ragged, padded decode through the package's decode path, against the reference backend."""
    if kernel_device is None:
        return
    batch = with_padding(ragged_decode_batch(3, 30, 260, 3, seed=5, num_heads=64, head_dim=64), 1, 2)
    inputs = random_inputs(batch, seed=14, device=kernel_device)
    ref = run_decode(inputs, "native", "reference", topk=32)
    got = run_decode(inputs, strategy, "triton", topk=32)
    assert_matches(got.logits, ref.logits, ref.context_lens)
    assert compare_selections(got.indices, ref.indices, ref.logits, atol=1e-3, rtol=1e-3).equal


# --- bad input, availability, the rules (no kernel launch) ----------------------------------


def small_args(
    batch: int = 2,
    next_n: int = 2,
    heads: int = 64,
    dim: int = 128,
    per_token: int | None = None,
    block_size: int = 64,
    cache_dtype: str = "fp8",
) -> dict:
    per_token = dim + 4 if per_token is None else per_token
    return dict(
        q=torch.zeros(batch, next_n, heads, dim).to(torch.float8_e4m3fn),
        kv_cache=torch.zeros(3, block_size, 1, per_token, dtype=torch.uint8),
        weights=torch.zeros(batch * next_n, heads),
        context_lens=torch.full((batch, next_n), 10, dtype=torch.int32),
        block_table=torch.zeros(batch, 2, dtype=torch.int32),
        max_context_len=128,
        cache_dtype=cache_dtype,
    )


BAD_INPUTS = {
    "heads": (dict(heads=48), UnsupportedShape, r"num_heads=48: .*\(32, 64\)"),
    "head_dim": (dict(dim=96), UnsupportedShape, r"head_dim=96: .*\(64, 128\)"),
    "next_n": (dict(next_n=17), ValueError, r"next_n=17: allowed range is \[1, 16\]"),
    "mxfp4": (dict(per_token=68, cache_dtype="mxfp4"), UnsupportedShape, r"cache_dtype='mxfp4': .*\('fp8',\)"),
    "block_size": (dict(block_size=32), UnsupportedShape, r"block_size=32: .*\(64,\)"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_shapes_raise_before_launch(name: str) -> None:
    shape, error, message = BAD_INPUTS[name]
    with pytest.raises(error, match=message):
        tn.paged_mqa_logits_triton(**small_args(**shape))


def test_bad_tensors_raise_before_launch() -> None:
    args = small_args()
    with pytest.raises(ValueError, match=r"q: dtype torch.bfloat16"):
        tn.paged_mqa_logits_triton(**(args | {"q": args["q"].to(torch.bfloat16)}))
    strided_cache = torch.zeros(3, 64, 2, 132, dtype=torch.uint8)[:, :, :1]
    with pytest.raises(ValueError, match=r"kv_cache: must be contiguous"):
        tn.paged_mqa_logits_triton(**(args | {"kv_cache": strided_cache}))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 128\)"):
        tn.paged_mqa_logits_triton(**args, out=torch.empty(4, 64))
    with pytest.raises(ValueError, match=r"context_lens: values must lie in \[0, 128\]"):
        tn.paged_mqa_logits_triton(**(args | {"context_lens": torch.full((2, 2), 129, dtype=torch.int32)}))


def test_backend_registration_and_availability(monkeypatch) -> None:
    backend = get_backend("triton")
    assert "triton" in backend_names() and isinstance(backend, tn.TritonNativeBackend)
    assert backend.native_next_n(torch.device("cpu")) is None and backend.cleans_tail
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    state = backend.availability(torch.device("cpu"))
    assert not state.ok and "TRITON_INTERPRET=1" in state.reason
    with pytest.raises(BackendUnavailable, match="TRITON_INTERPRET=1"):
        backend.logits(**small_args())
    monkeypatch.setattr(tn, "triton", None)
    monkeypatch.setattr(tn, "TRITON_IMPORT_ERROR", "triton is not importable (test)")
    assert backend.availability(torch.device("cpu")).reason == "triton is not importable (test)"


def test_package_imports_without_triton() -> None:
    """A missing triton leaves the package importable and the backend unavailable, with the reason."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from dsa_lab.kernels import get_backend\n"
        "state = get_backend('triton').availability(torch.device('cpu'))\n"
        "assert not state.ok and 'triton is not importable' in state.reason, state\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("dot_rows", [64, 128, 256])
def test_chunk_plan_tiles_rows_in_power_of_two_chunks(heads: int, dot_rows: int) -> None:
    for next_n in range(1, tn.MAX_NEXT_N + 1):
        plan = tn.chunk_plan(next_n, heads, dot_rows)
        assert [first for first, _ in plan] == [sum(size for _, size in plan[:i]) for i in range(len(plan))]
        assert sum(size for _, size in plan) == next_n
        assert all(size & (size - 1) == 0 and size * heads <= max(dot_rows, heads) for _, size in plan)
    assert tn.chunk_plan(3, 64, 256) == ((0, 2), (2, 1))
    assert tn.chunk_plan(7, 64, 256) == ((0, 4), (4, 2), (6, 1))


def test_chunk_plan_rejects_odd_chunks() -> None:
    with pytest.raises(ValueError, match="dot_rows=192"):
        tn.chunk_plan(3, 64, 192)


def test_rules_pick_measured_configs() -> None:
    """The fixed rule and the KV split keep to the H200 measurements (docs/triton_kernel.md)."""
    assert tn.choose_config(3, 64, 128) == tn.KernelConfig(dot_rows=64, num_stages=5, resident_weights=False)
    assert tn.choose_config(4, 64, 128) == tn.KernelConfig(dot_rows=256, num_stages=7)
    assert not tn.choose_config(8, 64, 128).resident_weights
    assert tn.blocks_per_program(16, 128, 132) == 8  # B=16, L=8K: ~2 programs an SM
    assert tn.blocks_per_program(128, 1024, 132) == 32  # B=128, L=64K
    assert tn.blocks_per_program(1, 1, 132) == 4
