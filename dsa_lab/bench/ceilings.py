"""The measured ceilings of a GPU: its memory-read bandwidth and FP8 tensor throughput (medians, triton's
`do_bench`), recorded in a run's provenance (`bench --ceilings`) so its roofline is drawn at what this GPU reached."""

from __future__ import annotations

import torch


def _median_ms_of_read(device: torch.device, gib: int) -> float:
    from triton.testing import do_bench

    buf = torch.rand(gib * (1 << 30) // 4, device=device)
    return do_bench(lambda: buf.sum(), warmup=50, rep=300, return_mode="median")


def _median_ms_of_fp8_gemm(device: torch.device, n: int) -> float:
    from triton.testing import do_bench

    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # _scaled_mm wants b column-major
    one = torch.ones((), device=device)
    return do_bench(
        lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        warmup=50,
        rep=300,
        return_mode="median",
    )


def measure_ceilings(
    device: torch.device | str = "cuda", read_gib: int = 4, gemm_size: int = 8192
) -> dict[str, object]:
    """Measured memory-read bandwidth and FP8 tensor throughput of `device` (medians, triton do_bench).

    Read: a float32 sum over `read_gib` GiB (bytes read / time). FP8: `torch._scaled_mm`
    of two random e4m3 `gemm_size`^2 matrices to bf16 (2 n^3 / time).
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device={device}: ceilings are measured on CUDA devices only")
    with torch.cuda.device(device):
        read_ms = _median_ms_of_read(device, read_gib)
        torch.cuda.empty_cache()
        gemm_ms = _median_ms_of_fp8_gemm(device, gemm_size)
        torch.cuda.empty_cache()
    return {
        "read_bytes": read_gib * (1 << 30),
        "read_ms": read_ms,
        "read_tbps": read_gib * (1 << 30) / (read_ms * 1e9),
        "fp8_gemm_size": gemm_size,
        "fp8_gemm_ms": gemm_ms,
        "fp8_tflops": 2 * gemm_size**3 / (gemm_ms * 1e9),
        "method": "triton.testing.do_bench median (clears L2 between runs); read = float32 sum, fp8 = torch._scaled_mm to bf16",
    }
