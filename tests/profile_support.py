"""What the profiling tests (tests/test_profile_*.py) share: a small CPU grid at the study's shape, backends
native only for next_n 1 and 2, wrong by 1 % or leaving a hole, and ncu's CSV as ncu prints it for a target's
steps."""

from __future__ import annotations

from typing import ClassVar

import torch

from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.presets import preset
from dsa_lab.kernels.reference import ReferenceBackend

TOPK = 16
CPU = torch.device("cpu")


class OneTwoBackend(ReferenceBackend):
    """The reference, declaring only next_n 1 and 2 native: atom splits 3 into 2 + 1."""

    name = "test-native-1-2"
    baseline = False
    presets = ()

    def native_next_n(self, device: torch.device) -> frozenset[int]:
        return frozenset({1, 2})


class SkewedBackend(ReferenceBackend):
    """Wrong by 1 %: must be refused, never profiled."""

    name = "test-skewed"
    baseline = False
    presets = ()

    def logits(self, call):  # type: ignore[no-untyped-def]
        return super().logits(call) * 1.01


class HoleBackend(ReferenceBackend):
    """Leaves one valid logit unwritten (NaN), as a kernel that skips a tile would."""

    name = "test-hole"
    baseline = False
    presets = ()
    cleans_tail: ClassVar[bool] = False

    def logits(self, call):  # type: ignore[no-untyped-def]
        out = super().logits(call)
        out[0, 0] = float("nan")
        return out


def grid(**axes) -> SweepSpec:
    """A small CPU grid at the study's shape (H = 64, D = 128)."""
    base = preset("ci").with_axes(batch=(2,), context=("160",), next_n=(3,), heads=(64,), head_dim=(128,))
    return base.with_axes(**axes)


HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
    '"Rule Description","Estimated Speedup Type","Estimated Speedup"'
)


def _rows(kernel_id: int, name: str, grid: str, values: dict[str, tuple[str, str]]) -> list[str]:
    return [
        f'"{kernel_id}","4242","python3.12","127.0.0.1","{name}","1","7","(128, 1, 1)","{grid}","0","9.0",'
        f'"Command line profiler metrics","{metric}","{unit}","{value}","","","","",""'
        for metric, (unit, value) in values.items()
    ]


def _metrics(read_mb: str, usec: str, gmma: str) -> dict[str, tuple[str, str]]:
    return {
        "dram__bytes_read.sum": ("Mbyte", read_mb),
        "dram__bytes_write.sum": ("byte", "4,096"),
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "61.5"),
        "gpu__time_duration.sum": ("usecond", usec),
        "lts__t_sector_hit_rate.pct": ("%", "40.25"),
        "lts__t_sectors_srcunit_tex_op_read.sum": ("sector", "10,000"),
        "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "12.5"),
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", gmma),
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "n/a"),
    }


def _csv_for_steps(manifest: dict) -> str:
    """What ncu would print for the target's steps: a marker, then one logits kernel per call."""
    lines, kernel_id = [HEADER], 0
    calls = {c["index"]: c["launches"] for c in manifest["configs"]}
    for step in manifest["steps"]:
        lines += _rows(
            kernel_id,
            "dsa_lab_ncu_marker",
            f"({step['marker'] + 1}, 1, 1)",
            {"gpu__time_duration.sum": ("nsecond", "1,500")},
        )
        kernel_id += 1
        for _ in range(calls[step["config"]]):
            lines += _rows(kernel_id, "paged_logits", "(132, 1, 1)", _metrics("0.1", "5", "10"))
            kernel_id += 1
    return "\n".join(lines)
