"""What the run store's battery cases (tests/battery/cases_store_*.py) share: their area, a fast CPU bench, a
resumable run made once per process, a file outside the run folder to guard, and edits of a stored run's files."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from tests.battery import FAST_BENCH, run_cli

AREA = "store"
FAST = FAST_BENCH
VICTIM = b"precious bytes outside the run folder\n"


def bench(out: Path, *extra: str, next_n: str = "1,2"):
    return run_cli([*FAST, "--next-n", next_n, "--out", str(out), *extra])


_TEMPLATE: list[Path] = []


def partial_run(tmp: Path, name: str = "run") -> Path:
    """A run folder with one of its two points recorded (resumable): a copy of one made once per process."""
    if not _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="dsa_lab_battery_template_")) / "run"
        atexit.register(shutil.rmtree, folder.parent, True)
        done = bench(folder, "--max-points", "1")
        assert done.code == 0, done.err
        _TEMPLATE.append(folder)
    out = tmp / "root" / "cpu" / name
    shutil.copytree(_TEMPLATE[0], out)
    return out


def victim(tmp: Path, content: bytes = VICTIM) -> Path:
    path = tmp / "outside" / "victim.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def relink(path: Path, target: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def _set_results(run: Path, change) -> None:
    frame = pd.read_parquet(run / "results.parquet")
    change(frame).to_parquet(run / "results.parquet", index=False)


def _set_provenance(run: Path, change) -> None:
    provenance = json.loads((run / "provenance.json").read_text())
    change(provenance)
    (run / "provenance.json").write_text(json.dumps(provenance))
