"""The ceilings the performance model divides by: one row per GPU, each number with its source.

This is the one table of these GPUs' ceilings: `model.roofline`'s GPU table reads its
H200, B200 and GB200 rows (bandwidth and dense FP8 rate) from here.

Spec values are what the model uses on every GPU, so that efficiencies fitted on the H200
transfer to Blackwell as fractions of the same kind of number. Where this project measured
a ceiling (the H200's sustained read and FP8 GEMM rate, stored in the shipped run's
provenance; tests/test_model.py checks them against it) the measurement is kept beside the
spec, to show how much of it plain streaming and a large GEMM reach.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsa_lab.errors import check_choice

ARCH_MAJORS = {"sm90": 9, "sm100": 10}  # a row's architecture -> its compute capability major


@dataclass(frozen=True)
class Ceiling:
    """One number with its unit and where it comes from."""

    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class GpuCeilings:
    """What bounds a paged-MQA-logits kernel on one GPU.

    `hbm_tbps` bounds the KV stream and logits writes, `fp8_tflops` (dense) the q.k MMAs,
    `fp32_tflops` (FMA counted as two) the CUDA-core epilogue (relu, weight, sum over
    heads), `fp4_tflops` the MMAs on an MXFP4 cache, `l2_mb` decides whether flatten's re-reads of a request's KV come from L2, and
    `sms` how many pseudo-requests run at once.
    """

    name: str
    arch: str  # 'sm90' or 'sm100': which DeepGEMM kernel runs
    sms: Ceiling
    l2_mb: Ceiling
    hbm_tbps: Ceiling
    fp8_tflops: Ceiling
    fp32_tflops: Ceiling
    nvlink_gbs: Ceiling  # one direction; used by the end-to-end model's expert-parallel all-to-all
    fp4_tflops: Ceiling | None = None  # dense MXFP4 MMA: the MXFP4 indexer cache (SM100 only)
    measured: dict[str, Ceiling] = field(default_factory=dict)

    def table(self) -> list[dict[str, object]]:
        """One row per ceiling: spec value, this project's measurement if any, sources."""
        rows = []
        for key in ("sms", "l2_mb", "hbm_tbps", "fp8_tflops", "fp4_tflops", "fp32_tflops", "nvlink_gbs"):
            spec: Ceiling | None = getattr(self, key)
            if spec is None:
                continue
            seen = self.measured.get(key)
            rows.append(
                {
                    "gpu": self.name,
                    "ceiling": key,
                    "value": spec.value,
                    "unit": spec.unit,
                    "source": spec.source,
                    "measured": seen.value if seen else None,
                    "measured_source": seen.source if seen else None,
                }
            )
        return rows


_H200_SHEET = "NVIDIA H200 Tensor Core GPU datasheet (SXM)"
_B200_SHEET = "NVIDIA HGX B200 datasheet (8 GPUs)"
_GB200_SHEET = "NVIDIA GB200 NVL72 datasheet (72 GPUs)"
_B200_QUERY = "driver query of a B200 in pytorch/ao PR #4002"
_B200_HBM = Ceiling(
    7.67, "TB/s", f"{_B200_QUERY}: 7680-bit bus x 3996 MHz x 2 = 7.672 TB/s (the datasheet rounds to 8 TB/s)"
)
_B200_L2 = Ceiling(126.5, "MB", f"{_B200_QUERY}: L2 Cache Size 126.50 MB")
_B200_SMS = Ceiling(148, "SMs", f"{_B200_QUERY}: Number of SMs 148")

GPUS: dict[str, GpuCeilings] = {
    gpu.name: gpu
    for gpu in (
        GpuCeilings(
            "H200",
            "sm90",
            Ceiling(132, "SMs", "H200 SXM multiprocessor count (this project's provenance: gpu_sm_count 132)"),
            Ceiling(50.0, "MB", "NVIDIA H100 Tensor Core GPU Architecture whitepaper: 50 MB L2 on GH100, as in H200"),
            Ceiling(4.8, "TB/s", f"{_H200_SHEET}: 4.8 TB/s HBM3e"),
            Ceiling(1979.0, "TFLOP/s", f"{_H200_SHEET}: 3,958 TFLOPS FP8 with sparsity, half of it dense"),
            Ceiling(67.0, "TFLOP/s", f"{_H200_SHEET}: 67 TFLOPS FP32"),
            Ceiling(450.0, "GB/s", f"{_H200_SHEET}: NVLink 900 GB/s, i.e. 450 each way"),
            measured={
                "hbm_tbps": Ceiling(
                    4.35,
                    "TB/s",
                    "this project's H200 sweep (`dsa-lab bench --measure-ceilings`, the shipped run's provenance): 4 GiB float32 sum",
                ),
                "fp8_tflops": Ceiling(
                    1254.0,
                    "TFLOP/s",
                    "this project's H200 sweep (`dsa-lab bench --measure-ceilings`): 8192^3 _scaled_mm",
                ),
            },
        ),
        GpuCeilings(
            "B200",
            "sm100",
            _B200_SMS,
            _B200_L2,
            _B200_HBM,
            Ceiling(4500.0, "TFLOP/s", f"{_B200_SHEET}: 72 PFLOPS FP8 with sparsity, i.e. 4.5 PF dense a GPU"),
            Ceiling(75.0, "TFLOP/s", f"{_B200_SHEET}: 600 TFLOPS FP32, i.e. 75 a GPU"),
            Ceiling(900.0, "GB/s", f"{_B200_SHEET}: NVLink 1.8 TB/s a GPU, i.e. 900 GB/s each way"),
            Ceiling(9000.0, "TFLOP/s", f"{_B200_SHEET}: 144 PFLOPS FP4 with sparsity, i.e. 9 PF dense a GPU"),
        ),
        GpuCeilings(
            "GB200",
            "sm100",
            Ceiling(_B200_SMS.value, "SMs", "assumed as B200 (the same Blackwell GPU)"),
            Ceiling(_B200_L2.value, "MB", "assumed as B200 (the same Blackwell GPU)"),
            Ceiling(
                _B200_HBM.value,
                "TB/s",
                f"assumed as B200's driver-reported {_B200_HBM.value} TB/s (the datasheet says 8 TB/s for both)",
            ),
            Ceiling(5000.0, "TFLOP/s", f"{_GB200_SHEET}: 720 PFLOPS FP8 with sparsity, i.e. 5 PF dense a GPU"),
            Ceiling(80.0, "TFLOP/s", f"{_GB200_SHEET}: 5,760 TFLOPS FP32, i.e. 80 a GPU"),
            Ceiling(900.0, "GB/s", f"{_GB200_SHEET}: NVLink 1.8 TB/s a GPU (130 TB/s for 72), i.e. 900 GB/s each way"),
            Ceiling(10000.0, "TFLOP/s", f"{_GB200_SHEET}: 1,440 PFLOPS FP4 with sparsity, i.e. 10 PF dense a GPU"),
        ),
    )
}


def get_gpu(name: str) -> GpuCeilings:
    check_choice("gpu", name, tuple(GPUS))
    return GPUS[name]
