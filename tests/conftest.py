"""Fixtures several test modules share."""

from __future__ import annotations

import pytest
from bench_support import (
    _BrokenBackend,
    _HoleBackend,
    _InterruptedBackend,
    _NarrowBackend,
    _SleepyBackend,
    _WrongBackend,
)

from dsa_lab.kernels import registry
from dsa_lab.paths import resolve_data_path
from dsa_lab.store import folders as store

SHIPPED_FULL = "h200/h200-full-20261129"  # the shipped H200 sweep


@pytest.fixture(scope="session")
def shipped_full_run() -> store.Run:
    """The shipped H200 sweep; the test is skipped in a checkout without it."""
    path = resolve_data_path(SHIPPED_FULL)
    if not path.is_dir():
        pytest.skip(f"the shipped run {SHIPPED_FULL} is not in this checkout's data folder")
    return store.load_run(path)


@pytest.fixture
def injected(monkeypatch):
    """Register the test backends for one test only, so no other test module ever sees them."""
    for cls in (_WrongBackend, _HoleBackend, _BrokenBackend, _NarrowBackend, _SleepyBackend, _InterruptedBackend):
        monkeypatch.setitem(registry._BACKENDS, cls.name, cls())
