"""A deadline around one point's measurement, so a time limit holds even against a hung kernel.

Two layers, because a hang can be of two kinds:
- Python code that never returns (a loop, a sleep, a wait in Python): a SIGALRM timer
  raises `PointTimeout` in the measuring (main) thread at the deadline, and the caller
  records the point and goes on;
- a call blocked inside C (a kernel that never finishes, a synchronize that never
  returns) cannot be interrupted: a watchdog thread waits `grace_s` past the deadline and
  then calls `on_hang`, which records what it can and ends the process (the device is
  unusable anyway after a hung kernel): a sweep's is `hang_guard`'s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dsa_lab.bench.budget import Deadline
from dsa_lab.bench.point import Point
from dsa_lab.bench.recorder import Recorder
from dsa_lab.store.format import LOCK_FILE

HANG_GRACE_S = 30.0
HUNG_EXIT_CODE = 3  # what a sweep's process exits with when a point hung inside C
MAX_DEADLINE_S = 1e8  # ~3 years: a longer deadline is held as this one (timers overflow far beyond)


class PointTimeout(Exception):
    """The measured point ran past its deadline."""


@contextmanager
def deadline(seconds: float | None, on_hang: Callable[[], None], grace_s: float | None = None) -> Iterator[None]:
    """Raise PointTimeout in this thread after `seconds`; call `on_hang` if the thread is still
    not back `grace_s` (default `HANG_GRACE_S`) later. `seconds=None`: no deadline."""
    if seconds is None:
        yield
        return
    grace_s = HANG_GRACE_S if grace_s is None else grace_s
    seconds = min(max(seconds, 1e-3), MAX_DEADLINE_S)
    use_alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    armed = [True]

    def alarm(signum: int, frame: object) -> None:
        if armed[0]:
            armed[0] = False
            raise PointTimeout(f"still running after {seconds:g} s")

    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds + grace_s):
            on_hang()

    previous = signal.signal(signal.SIGALRM, alarm) if use_alarm else None
    watchdog = threading.Thread(target=watch, name="dsa-lab-point-watchdog", daemon=True)
    try:  # the watchdog starts, then the timer: whatever fires (even before the block) ends in `finally`
        watchdog.start()
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, seconds)
        yield
    finally:
        try:
            armed[0] = False  # a SIGALRM landing here raises nothing more...
        finally:
            done.set()  # ...and the watchdog stands down whatever this block raised
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)


def hang_guard(recorder: Recorder, point: Point, limit: Deadline, resume: str) -> Callable[[], None]:
    """What a sweep's watchdog does when `point` is still inside C `HANG_GRACE_S` past its deadline (`limit`): the
    point recorded as an error when the deadline was its own (one the run's budget set re-runs it on resume), the
    run recorded as stopped 'point_hung', the resume command (`resume`) printed, the run's lock let go (its flock ends
    with the process) and the process ended with `HUNG_EXIT_CODE`."""

    def on_hang() -> None:
        if not limit.run_binds:
            message = f"hung: still running {limit.seconds:g} s + {HANG_GRACE_S:g} s after it started (point timeout)"
            recorder.append({**recorder.row(point), "status": "error", "message": message})
        recorder.finish("point_hung")
        print(
            f"dsa-lab bench: point {point.key} hung past its deadline (a kernel that never returns?); "
            f"the device may be unusable. Resume with: {resume}",
            file=sys.stderr,
            flush=True,
        )
        with contextlib.suppress(OSError):
            (recorder.run_dir / LOCK_FILE).unlink()
        os._exit(HUNG_EXIT_CODE)

    return on_hang
