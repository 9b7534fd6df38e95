"""Backends from outside the package: one Python file of your own, or an installed package's entry point.

A backend module is any Python file that registers one or more backends with `@register_backend`
(docs/add_a_kernel.md walks through `examples/my_kernel.py`). Once loaded, its backends are in the
same registry as the built-in ones, so they get the same checks, presets, charts and provenance.
Three ways to load one, each naming what it loads:

- `--backend-module PATH` on `dsa-lab bench` and `dsa-lab profile` (`load_backend_file`);
- `DSA_LAB_BACKEND_MODULES=PATH[:PATH...]` (`ENV_VAR`, os.pathsep-separated): every dsa_lab process
  loads those files when it imports `dsa_lab.kernels`, so notebooks and `dsa-lab report` see them too;
  a relative path is taken from the current directory (notebooks run in notebooks/: give absolute paths);
- an entry point of the group `dsa_lab.backends` (`ENTRY_POINT_GROUP`) in an installed package, named
  after the backend it registers (`my-kernel = my_package.kernel`).

Foreign code runs only when asked. A file is imported because its path was given (the flag, or the
variable, which is an explicit list of files to load in every process). An entry point's module is
imported only when its name is asked for (`registry.ask_backend`: `--backend NAME`, `get_backend(NAME)`,
a notebook's `candidate_backend`) or when `dsa-lab env` lists every backend (`load_entry_points`, saying
so), never by loading a run that names it: `store.load_run` takes a backend name it does not know as a
plain name. A module that fails (missing file, a folder or a loop of links given for it, an error while
importing, `sys.exit` or `KeyboardInterrupt` raised by its code, an import still running after
`IMPORT_TIMEOUT_S` (`DSA_LAB_IMPORT_TIMEOUT_S`), no backend registered, a backend name that is not a plain
name (`errors.PLAIN_NAME`: a run holding it could not be read back, so it is refused here, before any
point is measured), a name a built-in or another module already has, a descriptor the registry refuses)
raises `ExternalBackendError` naming the file and what is wrong, and leaves no backend of it registered;
the CLI prints that as one line.

The time limit is a SIGALRM timer in the main thread (where the CLI and notebooks import): it stops an
import stuck in Python code (a loop, a sleep, a wait), not one blocked inside a C call, which no signal
interrupts; off the main thread no limit is set. An outer timer already running (a caller's deadline) is
left to fire first when it is the shorter, and re-armed afterwards. A failure of a `DSA_LAB_BACKEND_MODULES` file at import is kept (and
warned about), and raised when a backend is asked for by a name not registered (`check_environment`).

Every run records which module provided each external backend it names (`origins`: the file's path
and sha256, and how it was loaded) in its environment, `environment.external_backends`, and a run is
resumed only with the same files (`env_info.RESUME_FIELDS`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dsa_lab.errors import PLAIN_NAME_RULE, check_plain_name, check_positive
from dsa_lab.kernels.registry import BackendClash, add_lookup, backend_names, forget_backends, get_backend
from dsa_lab.paths import repository_root

ENV_VAR = "DSA_LAB_BACKEND_MODULES"
TIMEOUT_VAR = "DSA_LAB_IMPORT_TIMEOUT_S"
IMPORT_TIMEOUT_S = 120.0  # a backend module's import still running after this is refused (TIMEOUT_VAR overrides)
ENTRY_POINT_GROUP = "dsa_lab.backends"
MODULE_PREFIX = "dsa_lab_backend_module_"  # the private module name a file is imported under


class ExternalBackendError(ValueError):
    """A backend module could not be loaded; the message names the file (or entry point) and what is wrong."""


class _ImportTimedOut(BaseException):
    """A module's import ran past its time limit (a BaseException, so the module's `except Exception` cannot
    swallow it)."""


def import_timeout_s() -> float:
    """The time limit of one backend module's import: `TIMEOUT_VAR` when set (a number > 0), else the default."""
    given = os.environ.get(TIMEOUT_VAR)
    if given is None or not given.strip():
        return IMPORT_TIMEOUT_S
    try:
        return check_positive(TIMEOUT_VAR, float(given))
    except ValueError:
        raise ValueError(f"{TIMEOUT_VAR}={given!r}: must be a finite number of seconds > 0") from None


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise `_ImportTimedOut` in the main thread after `seconds` (module docstring: what it can stop)."""
    outer_left, _ = signal.getitimer(signal.ITIMER_REAL) if hasattr(signal, "getitimer") else (0.0, 0.0)
    usable = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if not usable or 0 < outer_left <= seconds:  # no timer here, or the caller's fires first anyway
        yield
        return

    def alarm(signum: int, frame: object) -> None:
        raise _ImportTimedOut(f"still importing after {seconds:g} s")

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left > 0:  # the caller's timer, less the time spent here (fired at once when it is due)
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - started), 1e-6))


@dataclass(frozen=True)
class Origin:
    """Where an external backend came from: its module's file, that file's sha256 and how it was loaded."""

    path: str  # relative to the checkout when inside it, else absolute
    sha256: str
    via: str  # '--backend-module', 'DSA_LAB_BACKEND_MODULES' or 'entry point NAME = VALUE (DIST VERSION)'


_ORIGINS: dict[str, Origin] = {}  # backend name -> its module
_FILES: dict[Path, tuple[str, ...]] = {}  # resolved file -> the backends it registered (loaded once a process)
_ENVIRONMENT_FAILURES: list[str] = []  # DSA_LAB_BACKEND_MODULES files that failed at import


def _shown(path: Path) -> str:
    root = repository_root()
    try:
        return str(path.relative_to(root)) if root is not None else str(path)
    except ValueError:
        return str(path)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_registered(what: str, new: tuple[str, ...]) -> None:
    """What a module registered must be external backends: at least one, no baseline, not vLLM's."""
    if not new:
        raise ExternalBackendError(
            f"{what}: registers no backend (decorate a LogitsBackend subclass with "
            "@register_backend, from dsa_lab.kernels)"
        )
    for name in new:
        try:
            check_plain_name("backend", name)
        except ValueError:
            raise ExternalBackendError(
                f"{what}: backend name {name!r} is not a plain name (allowed are {PLAIN_NAME_RULE}): a run naming "
                "it could not be read back"
            ) from None
        backend = get_backend(name)
        for flag, holder in (("baseline", "the reference"), ("in_vllm", "DeepGEMM")):
            if getattr(backend, flag):
                raise ExternalBackendError(f"{what}: backend {name!r} declares {flag}=True; only {holder} is")


def _clash(what: str, err: BackendClash, builtin: frozenset[str]) -> ExternalBackendError:
    if err.name in builtin:
        return ExternalBackendError(f"{what}: backend {err.name!r} is a built-in backend's name; give yours another")
    origin = _ORIGINS.get(err.name)
    holder = f"{origin.path} ({origin.via})" if origin else f"{err.holder.__module__}"
    return ExternalBackendError(f"{what}: backend {err.name!r} is already registered by {holder}")


def _run_module(what: str, run: Any) -> tuple[str, ...]:
    """Run `run()` (an import that registers backends) and return the names it registered; on any
    failure none of them stays registered and ExternalBackendError names `what` and the reason."""
    before = frozenset(backend_names())
    builtin = frozenset(name for name in before if name not in _ORIGINS)
    seconds = import_timeout_s()
    try:
        with _time_limit(seconds):
            run()
    except BackendClash as err:
        forget_backends(tuple(n for n in backend_names() if n not in before))
        raise _clash(what, err, builtin) from None
    except _ImportTimedOut:
        forget_backends(tuple(n for n in backend_names() if n not in before))
        raise ExternalBackendError(
            f"{what}: its import was still running after {seconds:g} s (a module that never returns?); "
            f"refused (raise the limit with {TIMEOUT_VAR})"
        ) from None
    except KeyboardInterrupt:  # raised by its code, or Ctrl-C while it imported: either way this module failed
        forget_backends(tuple(n for n in backend_names() if n not in before))
        raise ExternalBackendError(f"{what}: importing it was interrupted (KeyboardInterrupt); not loaded") from None
    except BaseException as err:  # anything else its import raises, sys.exit and GeneratorExit included
        forget_backends(tuple(n for n in backend_names() if n not in before))
        raise ExternalBackendError(f"{what}: importing it failed: {type(err).__name__}: {err}") from None
    new = tuple(n for n in backend_names() if n not in before)
    try:
        _check_registered(what, new)
    except ExternalBackendError:
        forget_backends(new)
        raise
    return new


def load_backend_file(path: str | os.PathLike[str], via: str = "--backend-module") -> tuple[str, ...]:
    """Import the Python file at `path` (once a process) and return the backends it registered."""
    what = f"{via} {path}"
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ExternalBackendError(f"{what}: give the path of a Python file")
    given = Path(path).expanduser()
    try:
        resolved = given.resolve()
    except (OSError, RuntimeError) as err:  # a loop of symbolic links
        raise ExternalBackendError(f"{what}: cannot be resolved ({err}): a loop of symbolic links?") from None
    if resolved in _FILES:
        return _FILES[resolved]
    if resolved.is_dir():
        raise ExternalBackendError(f"{what}: {resolved} is a folder; give the Python file that registers the backends")
    if not resolved.is_file():
        where = "" if given.is_absolute() else f" (relative to the current directory {Path.cwd()})"
        raise ExternalBackendError(f"{what}: no such file {resolved}{where}")
    if resolved.suffix != ".py":
        raise ExternalBackendError(f"{what}: not a Python file (a backend module is a .py file)")
    sha256 = _sha256(resolved)
    name = MODULE_PREFIX + sha256[:16]
    spec = importlib.util.spec_from_file_location(name, resolved)
    assert spec is not None and spec.loader is not None  # a .py file location always has a loader
    module = importlib.util.module_from_spec(spec)

    def run() -> None:
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise

    new = _run_module(what, run)
    origin = Origin(_shown(resolved), sha256, via)
    _ORIGINS.update(dict.fromkeys(new, origin))
    _FILES[resolved] = new
    return new


def load_backend_files(paths: list[str] | tuple[str, ...], via: str = "--backend-module") -> tuple[str, ...]:
    """Every file's backends, in order (`--backend-module A --backend-module B`)."""
    return tuple(name for path in paths for name in load_backend_file(path, via))


def environment_files() -> tuple[str, ...]:
    """The files `DSA_LAB_BACKEND_MODULES` names, in order."""
    return tuple(part for part in os.environ.get(ENV_VAR, "").split(os.pathsep) if part.strip())


def load_environment() -> None:
    """Load the files of `DSA_LAB_BACKEND_MODULES` (at `dsa_lab.kernels`'s import); a failure is kept
    and warned about, raised by `check_environment`."""
    for path in environment_files():
        try:
            load_backend_file(path, ENV_VAR)
        except ExternalBackendError as err:
            _ENVIRONMENT_FAILURES.append(str(err))
            warnings.warn(str(err), stacklevel=2)


def environment_failures() -> tuple[str, ...]:
    """Why each `DSA_LAB_BACKEND_MODULES` file that failed to load at import did (`dsa-lab env` lists them)."""
    return tuple(_ENVIRONMENT_FAILURES)


def check_environment() -> None:
    """Raise ExternalBackendError naming every `DSA_LAB_BACKEND_MODULES` file that failed to load."""
    if _ENVIRONMENT_FAILURES:
        raise ExternalBackendError("; ".join(_ENVIRONMENT_FAILURES))


def _entry_points(name: str | None = None) -> list[importlib.metadata.EntryPoint]:
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return sorted((ep for ep in found if name is None or ep.name == name), key=lambda ep: ep.name)


def _entry_point_what(ep: importlib.metadata.EntryPoint) -> str:
    dist = f" ({ep.dist.name} {ep.dist.version})" if ep.dist is not None else ""
    return f"entry point {ENTRY_POINT_GROUP}: {ep.name} = {ep.value}{dist}"


def load_entry_point(ep: importlib.metadata.EntryPoint) -> tuple[str, ...]:
    """Import an entry point's module; it must register the backend the entry point is named after."""
    what = _entry_point_what(ep)
    if ep.name in _ORIGINS:  # loaded before
        return (ep.name,)
    if ep.name in backend_names():
        raise ExternalBackendError(f"{what}: backend {ep.name!r} is a built-in backend's name; give yours another")
    new = _run_module(what, ep.load)
    if ep.name not in new:
        forget_backends(new)
        raise ExternalBackendError(f"{what}: registers {list(new)}, not the backend {ep.name!r} it is named after")
    spec = importlib.util.find_spec(ep.module)
    file = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    origin = Origin(_shown(file) if file else ep.module, _sha256(file) if file and file.is_file() else "", what)
    _ORIGINS.update(dict.fromkeys(new, origin))
    return new


def _find(name: str) -> None:
    """The registry's lookup for a name not registered: the kept failures first, then an entry point of it."""
    if _ENVIRONMENT_FAILURES:
        raise ExternalBackendError(f"backend {name!r} is not registered, and {'; '.join(_ENVIRONMENT_FAILURES)}")
    for ep in _entry_points(name):
        load_entry_point(ep)


def load_entry_points() -> tuple[list[str], list[str]]:
    """Import every installed entry point's module (`dsa-lab env` lists every backend): a note per
    entry point loaded, and the errors of those that failed."""
    notes, errors = [], []
    for ep in _entry_points():
        try:
            load_entry_point(ep)
            notes.append(f"{_entry_point_what(ep)}: foreign code, imported by env to list it")
        except ExternalBackendError as err:
            errors.append(str(err))
    return notes, errors


def origins(names: Any = None) -> dict[str, dict[str, str]]:
    """{backend: {path, sha256, via}} of the external backends among `names` (all when None): what a
    run's environment records (`environment.external_backends`)."""
    return {name: asdict(o) for name, o in _ORIGINS.items() if names is None or name in set(names)}


add_lookup(_find)
