"""The registry of paged-MQA-logits backends: each registered once, by name, and found by what it declares
(`descriptor.LogitsBackend`): the baseline, what vLLM runs, a family, a preset's members, the modeled ones."""

from __future__ import annotations

from collections.abc import Callable

from dsa_lab.batch.metadata import STRATEGIES
from dsa_lab.errors import check_choice
from dsa_lab.kernels.descriptor import KernelFit, LogitsBackend

_BACKENDS: dict[str, LogitsBackend] = {}
_LOOKUPS: list[Callable[[str], None]] = []  # ways to find a backend asked for by a name not registered yet


class BackendClash(ValueError):
    """A backend registered under a name another backend already has."""

    def __init__(self, name: str, holder: type[LogitsBackend]) -> None:
        super().__init__(f"backend {name!r} registered twice (first by {holder.__module__}.{holder.__qualname__})")
        self.name, self.holder = name, holder


def register_backend(cls: type[LogitsBackend]) -> type[LogitsBackend]:
    if cls.name in _BACKENDS:
        raise BackendClash(cls.name, type(_BACKENDS[cls.name]))
    for field in ("family", "label"):
        if not isinstance(getattr(cls, field, None), str):
            raise ValueError(f"backend {cls.name!r}: declares no {field} (a string)")
    for strategy, fit in cls.model_fits.items():
        check_choice(f"backend {cls.name!r}: model_fits strategy", strategy, STRATEGIES)
        if not isinstance(fit, KernelFit):
            raise ValueError(
                f"backend {cls.name!r}: model_fits[{strategy!r}] is a {type(fit).__name__}, not a KernelFit"
            )
    _BACKENDS[cls.name] = cls()
    return cls


def forget_backends(names: tuple[str, ...]) -> None:
    """Unregister what a backend module that failed to load left behind (`kernels.external`)."""
    for name in names:
        _BACKENDS.pop(name, None)


def add_lookup(find: Callable[[str], None]) -> None:
    """A way to register a backend asked for by a name not registered yet (`kernels.external`: an
    installed entry point of that name); it registers it, raises naming what is wrong, or does nothing."""
    _LOOKUPS.append(find)


def ask_backend(name: str) -> str:
    """`name`, once every lookup had its chance to register it (a backend of `--backend`, `get_backend`)."""
    if isinstance(name, str) and name not in _BACKENDS:
        for find in _LOOKUPS:
            find(name)
    return name


def get_backend(name: str) -> LogitsBackend:
    check_choice("backend", ask_backend(name), tuple(_BACKENDS))
    return _BACKENDS[name]


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def baseline_backend() -> LogitsBackend:
    """The correctness baseline (the reference): what every other backend is checked against."""
    return next(b for b in _BACKENDS.values() if b.baseline)


def vllm_backend() -> LogitsBackend:
    """The backend vLLM runs (DeepGEMM): its times stand for vLLM's choice in every comparison."""
    return next(b for b in _BACKENDS.values() if b.in_vllm)


def family_of(name: str) -> tuple[str, ...]:
    """Every registered backend of `name`'s family (e.g. the released DeepGEMM and a build of a PR of it)."""
    family = get_backend(name).family
    return tuple(n for n, b in _BACKENDS.items() if b.family == family)


def fused_backends() -> tuple[str, ...]:
    """The backends whose unit is the whole step (`fuses_topk`: logits and top-k in one call), in registration order."""
    return tuple(n for n, b in _BACKENDS.items() if b.fuses_topk)


def preset_backends(preset: str) -> tuple[str, ...]:
    """The backends that join a sweep preset, in registration order."""
    return tuple(n for n, b in _BACKENDS.items() if preset in b.presets)


def modeled_backends() -> tuple[str, ...]:
    """The backends the performance model can time: those that declare how their kernel spends its work
    (`model_traits`) and the efficiencies it reaches (`model_fits`); `model.indexer.unmodeled` says why
    each other one is not."""
    return tuple(n for n, b in _BACKENDS.items() if b.model_traits and b.model_fits)
