"""Papermill parameters, checked in the cell after each notebook's parameters: their declared type, then a value
allowed for what they name.

A notebook declares each parameter with its type (`batch: int = 128`), which papermill lists
(`papermill --help-notebook`) and which stays in the notebook's `__annotations__` after papermill injects
what it was given (`-p batch 0`, `dsa-lab report -p batch=0`). `check_parameters(globals())` holds each
value to its type and, by its name, to what it may be (`RULES`, a parameter's name meaning one thing in
every notebook: the axis table's ranges and vocabularies, the registry's backends, the modeled GPUs, the
bench presets, the published acceptance curves, a run folder under data/), so a bad value is one error
naming the parameter and what is allowed before any cell reads it, not a traceback from the cell that
first happens to use it, or an explorer blaming another control.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any

from dsa_lab import axes
from dsa_lab.bench.presets import PRESETS
from dsa_lab.errors import as_device, check_choice, check_plain_name, check_range, check_seed
from dsa_lab.kernels import get_backend
from dsa_lab.model.decode_step import ACCEPTANCE_PRESETS
from dsa_lab.model.gpus import GPUS
from dsa_lab.paths import resolve_data_path

MAX_TEXT = 4096  # characters of a text parameter (a path, a label): anything longer is not one


def _axis(name: str) -> Callable[[str, Any], None]:
    def check(parameter: str, value: Any) -> None:
        axes.axis(name).check(value)

    return check


def _each(rule: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    def check(parameter: str, values: Any) -> None:
        for i, value in enumerate(values):
            rule(f"{parameter}[{i}]", value)

    return check


def _backend(parameter: str, value: Any) -> None:
    get_backend(check_plain_name(parameter, value))


def _run_folder(parameter: str, value: Any) -> None:
    """'' (the notebook's own choice), or a path under data/ (or absolute) that is a folder when it exists."""
    if value == "":
        return
    try:
        path = resolve_data_path(value)
        exists, folder = path.exists(), path.is_dir()
        path.resolve(strict=exists)
    except (OSError, RuntimeError) as err:  # a loop of symbolic links, a name the OS refuses
        raise ValueError(f"{parameter}={value!r}: cannot be resolved ({err}); give a run folder under data/") from None
    if exists and not folder:
        raise ValueError(f"{parameter}={value!r}: {path} is not a folder; give a run folder under data/ (or '')")


def _zero_or(rule: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    def check(parameter: str, value: Any) -> None:
        if value != 0:
            rule(parameter, value)

    return check


RULES: dict[str, Callable[[str, Any], None]] = {
    "device": lambda p, v: as_device(p, v),
    "seed": lambda p, v: check_seed(p, v),
    "batch": _axis("batch"),
    "headline_batch": _axis("batch"),
    "cpu_batch": _axis("batch"),
    "focus_batch": _zero_or(_axis("batch")),  # 0: the largest profiled
    "context": _axis("context"),
    "headline_context": _axis("context"),
    "cpu_context": lambda p, v: axes.axis("context").check(str(v)),
    "diagram_next_n": _axis("next_n"),
    "focus_next_n": _axis("next_n"),
    "cpu_next_n": _each(_axis("next_n")),
    "diagram_tiles": lambda p, v: check_range(p, v, 1, 64),
    "run_device": lambda p, v: check_plain_name(p, v),
    "timeline_call": lambda p, v: check_plain_name(p, v),
    "candidate_backend": _backend,
    "baseline_backend": _backend,
    "decision_backend": _backend,
    "fresh_preset": lambda p, v: check_choice(p, v, PRESETS),
    "preset": lambda p, v: check_choice(p, v, tuple(ACCEPTANCE_PRESETS)),
    "modeled_gpus": _each(lambda p, v: check_choice(p, v, tuple(GPUS))),
}
PATH_SUFFIX = "_path"  # every parameter named *_path is a run folder under data/ (`_run_folder`)


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) if typing.get_origin(annotation) is None else str(annotation)


def _has_type(value: Any, annotation: Any) -> bool:
    """`value` is of the declared type: a bool is no int, an int no float, a list's items of its item type."""
    origin = typing.get_origin(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return type(value) is list and all(_has_type(v, item) for v in value)
    return type(value) is annotation


def check_parameter(name: str, value: Any, annotation: Any) -> None:
    """One parameter: of its declared type, then (by name) an allowed value; a ValueError naming it if not."""
    if not _has_type(value, annotation):
        raise ValueError(f"{name}={value!r:.200}: must be {_type_name(annotation)}, got {type(value).__name__}")
    if isinstance(value, str) and len(value) > MAX_TEXT:
        raise ValueError(f"{name}: a text of {len(value)} characters; at most {MAX_TEXT}")
    rule = RULES.get(name) or (_run_folder if name.endswith(PATH_SUFFIX) else None)
    if rule is None:
        return
    try:
        rule(name, value)
    except ValueError as err:
        text = str(err)
        raise ValueError(text if text.startswith(name) else f"{name}: {text}") from None


def check_parameters(namespace: Mapping[str, Any]) -> None:
    """Every parameter the notebook declared (its `__annotations__`) at the value it holds now, papermill's
    injected values included (`check_parameter`)."""
    for name, annotation in dict(namespace.get("__annotations__", {})).items():
        if name in namespace:
            check_parameter(name, namespace[name], annotation)
