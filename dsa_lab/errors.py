"""Argument checks that name the field and the allowed values, so bad input fails loudly."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class BackendUnavailable(RuntimeError):
    """A kernel backend cannot run here; the message says why."""


class UnsupportedShape(ValueError):
    """A backend cannot run this shape or next_n; the message lists what it accepts."""


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: allowed values are {allowed}")


def check_range(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: must be an int in [{low}, {high}]")
    if not low <= value <= high:
        raise ValueError(f"{name}={value}: allowed range is [{low}, {high}]")


def check_tensor(
    name: str,
    t: Any,
    *,
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    device: torch.device | None = None,
    contiguous: bool = False,
) -> None:
    """Validate a tensor argument; `None` entries in `shape` match any size."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in dtypes:
            raise ValueError(f"{name}: dtype {t.dtype}, allowed {dtypes}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(
            want is not None and got != want for got, want in zip(t.shape, shape)
        ):
            want_s = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name}: expected shape {want_s}, got {tuple(t.shape)}")
    if device is not None and t.device.type != torch.device(device).type:
        raise ValueError(f"{name}: on {t.device}, expected {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")
