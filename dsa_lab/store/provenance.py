"""What a run's provenance records of where it came from: the checkout (its git state and a hash of the
package's sources) and the machine (`env_info.environment_facts`), beside the spec and the command."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsa_lab.env_info import environment_facts
from dsa_lab.store.format import SCHEMA_VERSION, SOURCES

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # dsa_lab/: the package whose sources are hashed
GIT_STATUS_S = 60  # a fresh clone's first `git status` filters every notebook through nbstripout (15-18 s on 2 cores)


def git_state() -> dict[str, Any]:
    """Commit and dirty flag of the checkout (env DSA_LAB_GIT_SHA / DSA_LAB_GIT_DIRTY win, for copies
    without .git such as the device machine's), plus a hash of the package sources that needs no git."""
    state: dict[str, Any] = {"sha": os.environ.get("DSA_LAB_GIT_SHA"), "dirty": None, "tree_sha256": _package_hash()}
    if os.environ.get("DSA_LAB_GIT_DIRTY") is not None:
        state["dirty"] = os.environ["DSA_LAB_GIT_DIRTY"].lower() in ("1", "true", "yes")
    if state["sha"] is None:
        root = PACKAGE_ROOT.parent
        try:
            sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as err:
            state["error"] = f"git not usable: {err}"
            return state
        if sha.returncode != 0:
            state["error"] = sha.stderr.strip() or "git rev-parse failed"
            return state
        state["sha"] = sha.stdout.strip()
        try:  # a fresh clone's first status runs the notebooks' clean filter on each one: slow, and the sha stands
            porcelain = subprocess.run(
                ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=GIT_STATUS_S
            )
            state["dirty"] = bool(porcelain.stdout.strip()) if porcelain.returncode == 0 else None
        except (OSError, subprocess.SubprocessError) as err:
            state["error"] = f"git status did not answer ({type(err).__name__}): dirty unknown"
    return state


def _package_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build_provenance(
    run_id: str,
    device: str,
    device_name: str,
    source: str,
    seed: int,
    timing_method: str,
    spec: dict[str, Any],
    extra: dict[str, Any] | None = None,
    backends: Sequence[str] = (),
) -> dict[str, Any]:
    """A new run's provenance: what `store.read_provenance` requires (`store.PROVENANCE_KEYS`), the machine's
    environment (`env_info.environment_facts`: the libraries of `backends`, the ones the run names, foreign
    code among them imported only then), the checkout's git state, and `extra`."""
    if source not in SOURCES:
        raise ValueError(f"source={source!r}: allowed values are {SOURCES}")
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "source": source,
        "device": device,
        "device_name": device_name,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": list(sys.argv),
        "timing_method": timing_method,
        "seed": seed,
        "spec": spec,
        "environment": environment_facts(backends),
        "git": git_state(),
        **(extra or {}),
    }
