"""What a sweep writes as it goes: each point's row, appended to the run's log as the point finishes
(`store.append_point`), results.parquet refreshed every `RESULTS_EVERY_S`, the statuses counted on a progress bar,
and at the end how the sweep ended (`finish`: the provenance's progress, its stop reason and what stopped it).

Every row starts from the same columns (`Recorder.row`): the point's key and axes, measured, the device, and what
vLLM 0.33 runs for the point's step on the run's platform (`route_columns`: stored per row for the run's GPU family
with DeepGEMM, SM90 off CUDA).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from dsa_lab.bench.point import Point
from dsa_lab.env_info import device_name
from dsa_lab.policy.query import CAPABILITY_FAMILIES, Platform
from dsa_lab.store import folders as store

RESULTS_EVERY_S = 30.0  # results.parquet is refreshed this often during a sweep
STUDY_PLATFORM = Platform("sm90", True)  # vLLM with DeepGEMM on Hopper: whose route a run off CUDA records


def route_platform(device: torch.device) -> Platform:
    """The platform whose vLLM 0.33 route every row records: vLLM with DeepGEMM (how it serves DeepSeek) on this
    GPU's family; off CUDA the study's GPU, SM90 (`STUDY_PLATFORM`; each row names it in `vllm_platform`)."""
    if device.type != "cuda":
        return STUDY_PLATFORM
    return Platform(CAPABILITY_FAMILIES.get(torch.cuda.get_device_capability(device)[0], "other"), True)


def route_columns(point: Point, seed: int, platform: Platform) -> dict[str, Any]:
    """What vLLM 0.33 runs for the point's step on `platform` (`Point.vllm_route`): its path ('native',
    'padded', 'flatten', 'varlen', or 'rejected' where vLLM refuses the configuration at startup), how many
    requests stay decodes and how many go to the prefill path."""
    try:
        route = point.vllm_route(seed, platform)
    except ValueError:  # rejected at startup (e.g. an MXFP4 cache vLLM 0.33 does not read here)
        return {"vllm_route": "rejected", "vllm_decodes": 0, "vllm_prefills": 0, "vllm_platform": platform.label}
    return {
        "vllm_route": route.path,
        "vllm_decodes": route.decodes,
        "vllm_prefills": route.prefills,
        "vllm_platform": platform.label,
    }


class Recorder:
    """A sweep's rows into `run_dir`, for `total` points of which `done` were recorded before this sweep."""

    def __init__(self, run_dir: Path, device: torch.device, seed: int, total: int, done: int, progress: bool) -> None:
        from tqdm.auto import tqdm

        self.run_dir, self.device, self.seed, self.total = run_dir, device, seed, total
        self.platform = route_platform(device)
        self.counts: Counter[str] = Counter()
        self.last_write = time.perf_counter()
        self.bar = tqdm(
            total=total,
            initial=done,
            disable=not progress,
            desc="bench",
            unit="pt",
            mininterval=0.1 if _watched() else 15.0,  # a log file gets a line every 15 s, not every point
        )

    @property
    def recorded(self) -> int:
        """Points this sweep recorded."""
        return sum(self.counts.values())

    def row(self, point: Point) -> dict[str, Any]:
        """The columns every row of `point` starts from (no times yet)."""
        return {
            "point_key": point.key,
            **point.axes(),
            "source": "measured",
            "device": self.device.type,
            "device_name": device_name(self.device),
            **route_columns(point, self.seed, self.platform),
            "median_ms": None,
            "p25_ms": None,
            "p75_ms": None,
            "iqr_ms": None,
            "message": "",
        }

    def append(self, row: dict[str, Any]) -> None:
        """`row` appended to the run's log, uncounted (a point that ended the sweep)."""
        store.append_point(self.run_dir, row)

    def record(self, row: dict[str, Any]) -> None:
        """A finished point's row: appended, counted, shown; results.parquet refreshed when it is due."""
        store.append_point(self.run_dir, row)
        self.counts[row["status"]] += 1
        self.bar.update(1)
        self.bar.set_postfix(self.counts)
        if time.perf_counter() - self.last_write > RESULTS_EVERY_S:
            store.write_results(self.run_dir)
            self.last_write = time.perf_counter()

    def finish(self, reason: str, error: str = "") -> None:
        """results.parquet written whole, and the provenance's progress: points in all and recorded, why the sweep
        stopped (`reason`) and, where an exception stopped it, which (`error`)."""
        store.write_results(self.run_dir)
        progress = {
            "points_total": self.total,
            "points_recorded": len(store.done_keys(self.run_dir)),
            "stop_reason": reason,
        }
        store.update_provenance(self.run_dir, progress={**progress, **({"stop_error": error} if error else {})})

    def close(self) -> None:
        self.bar.close()


def _watched() -> bool:
    """Someone watches the bar: a terminal, or a notebook kernel (where tqdm.auto draws a widget)."""
    return sys.stderr.isatty() or "ipykernel" in sys.modules
