"""Argument checks that name the field, the value and what is allowed, so bad input fails loudly.

Host checks (types, shapes, dtypes, devices) cost nothing and run at every public entry
point. Checks that read tensor values (`check_finite`, block ids, context lengths) copy
from the device and therefore run once where data is built or prepared, never inside a
timed loop; each caller says where.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a name that ends up in files and pages
PLAIN_NAME_RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"


class BackendUnavailable(RuntimeError):
    """A kernel backend cannot run here; the message says why."""


class UnsupportedShape(ValueError):
    """A backend cannot run this shape or next_n; the message lists what it accepts."""


class NonFiniteLogits(ValueError):
    """Logits inside a row's context hold NaN or inf: a kernel wrote garbage (or read it)."""


class BackendProbeError(RuntimeError):
    """A backend's own probe (its availability, numerics, config space, native next_n...) raised: the message
    names the backend, the probe and what it raised, so a plug-in's bug reads as that, not as the harness's."""


T = TypeVar("T")


def probe(backend: str, what: str, call: Callable[[], T]) -> T:
    """`call()`, a question asked of `backend` (`what`: 'availability()'...); what it raises, other than the
    answers a probe may give (`UnsupportedShape`, `BackendUnavailable`), becomes `BackendProbeError`."""
    try:
        return call()
    except (UnsupportedShape, BackendUnavailable, BackendProbeError):
        raise
    except Exception as err:
        raise BackendProbeError(f"backend {backend!r}: {what} raised {type(err).__name__}: {err}") from err


def _is_int(value: Any) -> bool:
    """Python or NumPy integers (anything with `__index__`), never a bool or a float."""
    if isinstance(value, (bool, float, str)) or type(value).__name__ == "bool_":
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def as_int(name: str, value: Any, allowed: str = "an int") -> int:
    """`value` as a Python int; a float (10.7 or 10.0), bool or string is refused, never truncated."""
    if not _is_int(value):
        raise ValueError(f"{name}={value!r}: must be {allowed}, got {type(value).__name__}")
    return operator.index(value)


def check_range(name: str, value: Any, low: int, high: int) -> int:
    """An int in [low, high]; returns it as a Python int."""
    number = as_int(name, value, f"an int in [{low}, {high}]")
    if not low <= number <= high:
        raise ValueError(f"{name}={number}: allowed range is [{low}, {high}]")
    return number


MAX_SEED = (1 << 63) - 1


def check_seed(name: str, value: Any) -> int:
    """A seed: an int in [0, 2**63 - 1].

    Judgement: the range every tool that keeps a seed holds exactly (torch's generators,
    NumPy, an int64 parquet or JSON column); a negative seed is refused rather than
    wrapped (torch would map -1 to 2**64 - 1), so one run's seed means one thing.
    """
    return check_range(name, value, 0, MAX_SEED)


def check_plain_name(name: str, value: Any) -> str:
    """A name that ends up in run files, folders and pages (a run id, a backend, a config): `PLAIN_NAME`, so it
    carries no markup, separator or path, and a run that holds it loads back (`store.format` holds the same)."""
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value):
        raise ValueError(f"{name}={value!r}: not a plain name; allowed are {PLAIN_NAME_RULE}")
    return value


def check_int_sequence(name: str, values: Any, low: int, high: int) -> tuple[int, ...]:
    """A non-string sequence of ints in [low, high], each refused by its index (`seq_lens[2]=10.7`)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name}={values!r}: must be a sequence of ints, got {type(values).__name__}")
    return tuple(check_range(f"{name}[{i}]", value, low, high) for i, value in enumerate(values))


def _same_kind(value: Any, option: Any) -> bool:
    if isinstance(option, bool) or isinstance(value, bool):
        return type(value) is type(option)
    if isinstance(option, int):
        return _is_int(value)
    return isinstance(value, type(option))


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> None:
    """`value` is one of `allowed` and of the same kind (128.0 is not the head_dim 128, True is not 1)."""
    allowed = tuple(allowed)
    if not any(_same_kind(value, option) and value == option for option in allowed):
        raise ValueError(f"{name}={value!r}: allowed values are {allowed}")


def check_positive(name: str, value: Any, allow_zero: bool = False) -> float:
    """A finite real number > 0 (>= 0 with `allow_zero`): a time budget, a tolerance. Returns a float."""
    bound = "finite number >= 0" if allow_zero else "finite number > 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value < float("inf"):
        raise ValueError(f"{name}={value!r}: must be a {bound}")
    if not (value >= 0 if allow_zero else value > 0):
        raise ValueError(f"{name}={value!r}: must be a {bound}")
    return float(value)


def as_device(name: str, value: Any) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N' (or a torch.device) that exists here."""
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):  # torch lists every device type it knows; we run on two
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}={value!r}: allowed values are 'cpu', 'cuda' or 'cuda:N'")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{name}={value!r}: no CUDA device is visible here (use 'cpu')")
        if device.index is not None and device.index >= count:
            raise ValueError(f"{name}={value!r}: allowed indices are 0..{count - 1}")
    return device


def check_tensor(
    name: str,
    t: Any,
    *,
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    device: torch.device | str | None = None,
    contiguous: bool = False,
) -> None:
    """Validate a tensor argument on the host (no device sync); `None` entries in `shape` match any size."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in dtypes:
            raise ValueError(f"{name}: dtype {t.dtype}, allowed {dtypes}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
            want_s = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name}: expected shape {want_s}, got {tuple(t.shape)}")
    if device is not None and t.device != _same_index(torch.device(device), t.device):
        raise ValueError(f"{name}: on {t.device}, expected {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")


def _same_index(want: torch.device, got: torch.device) -> torch.device:
    """'cuda' names whichever CUDA device a tensor is on; 'cuda:1' only that one."""
    return got if want.type == got.type and want.index is None else want


def check_finite(name: str, t: torch.Tensor) -> None:
    """Refuse NaN and +-inf (float8 included, read through its bits). Copies one flag to the host."""
    if t.dtype == torch.float8_e4m3fn:  # no isfinite kernel for fp8: 0x7F / 0xFF are its NaNs
        bad = (t.view(torch.uint8) & 0x7F) == 0x7F
    elif t.is_floating_point():
        bad = ~torch.isfinite(t)
    else:
        return
    count = int(bad.sum())
    if count:
        raise ValueError(f"{name}: {count} non-finite value(s) (NaN or inf) among {t.numel()}; all must be finite")
