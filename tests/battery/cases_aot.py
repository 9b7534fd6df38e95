"""The ahead-of-time helpers of our Triton and Gluon kernels: an arch outside the allowed list, shapes and
configs they do not take, all refused before Triton sees them (the Gluon checks are `kernels.gluon.config`'s
and `kernels.gluon.launch.compile_for`'s)."""

from __future__ import annotations

from pathlib import Path

from tests.battery import Result, case, refused

AREA = "aot"


def _compile(arch=90, next_n=1, heads=64, head_dim=128, config=None):
    from dsa_lab.kernels import triton_native as tn

    config = tn.KernelConfig() if config is None else config
    return tn.compile_for(arch, next_n, heads, head_dim, config)


for _arch in (0, "90", 75, 90.0, True, -1, 1000, None, 80, 86):
    case(AREA, f"triton compile_for(arch={_arch!r})")(lambda tmp, a=_arch: refused(lambda: _compile(arch=a), "arch"))

for _kwargs, _name in (
    ({"next_n": 0}, "next_n"),
    ({"next_n": 17}, "next_n"),
    ({"next_n": 2.0}, "next_n"),
    ({"heads": 48}, "heads"),
    ({"heads": 0}, "heads"),
    ({"head_dim": 100}, "head_dim"),
    ({"config": "fast"}, "config"),
):
    case(AREA, f"triton compile_for({_kwargs})")(lambda tmp, k=_kwargs, n=_name: refused(lambda: _compile(**k), n))


def _config(**fields):
    from dsa_lab.kernels import triton_native as tn

    return tn.KernelConfig(**fields)


for _fields, _name in (
    ({"dot_rows": 0}, "dot_rows"),
    ({"dot_rows": 96}, "dot_rows"),
    ({"num_warps": 3}, "num_warps"),
    ({"num_warps": 0}, "num_warps"),
    ({"num_stages": 0}, "num_stages"),
    ({"blocks_per_program": -1}, "blocks_per_program"),
    ({"resident_weights": "yes"}, "resident_weights"),
    ({"num_stages": 2.5}, "num_stages"),
):
    case(AREA, f"triton KernelConfig({_fields})")(
        lambda tmp, f=_fields, n=_name: refused(lambda: _compile(config=_config(**f)), n)
    )

for _args, _name in (
    ((0, 64, 256), "next_n"),
    ((3, 64, 0), "dot_rows"),
    ((3, 0, 256), "heads"),
    ((17, 64, 256), "next_n"),
    ((3, 64, -1), "dot_rows"),
):

    def _plan(tmp: Path, args=_args, name=_name) -> Result:
        from dsa_lab.kernels import triton_native as tn

        return refused(lambda: tn.chunk_plan(*args), name)

    case(AREA, f"triton chunk_plan{_args}")(_plan)


for _args, _name in (
    ((0, 8, 132), "batch"),
    ((8, 8, 0), "num_sms"),
    ((8, -5, 132), "col_blocks"),
    ((8.5, 8, 132), "batch"),
):

    def _bpp(tmp: Path, args=_args, name=_name) -> Result:
        from dsa_lab.kernels import triton_native as tn

        return refused(lambda: tn.blocks_per_program(*args), name)

    case(AREA, f"triton blocks_per_program{_args}")(_bpp)


# ---------------------------------------------------------------- Gluon


def _gluon_config(**fields):
    from dsa_lab.kernels.gluon import config as gc

    return gc.GluonConfig(**fields)


def _gluon_compile(arch=90, next_n=1, heads=64, head_dim=128, config=None):
    from dsa_lab.kernels.gluon import launch as gn

    return gn.compile_for(arch, next_n, heads, head_dim, _gluon_config() if config is None else config)


for _arch in (0, "90", 75, 90.0, True, None, 100, 89):  # never a real compile: 90 is the only arch it takes
    case(AREA, f"gluon compile_for(arch={_arch!r})")(
        lambda tmp, a=_arch: refused(lambda: _gluon_compile(arch=a), "arch")
    )

for _kwargs, _name in (
    ({"config": "fast"}, "config"),
    ({"next_n": 0}, "next_n"),
    ({"next_n": 17}, "next_n"),
    ({"heads": 48}, "heads"),
    ({"head_dim": 96}, "head_dim"),
):
    case(AREA, f"gluon compile_for({_kwargs})")(lambda tmp, k=_kwargs, n=_name: refused(lambda: _gluon_compile(**k), n))


@case(AREA, "gluon compile_for with a config too big for shared memory at the shape")
def _(tmp: Path) -> Result:
    return refused(lambda: _gluon_compile(next_n=16, config=_gluon_config(stages=32, query_slots=2)), "config=")


for _args, _name in (
    ((16, 3, "pair"), "heads"),  # once chunks of 10 and 5 rows
    ((0, 64, "pair"), "next_n"),
    ((17, 64, "pair"), "next_n"),
    ((4, 64, "diagonal"), "plan"),
    ((4, 64, "pair", 100), "mma_columns"),
    ((4.0, 64, "pair"), "next_n"),
):

    def _gluon_plan(tmp: Path, args=_args, name=_name) -> Result:
        from dsa_lab.kernels.gluon import config as gc

        return refused(lambda: gc.gluon_chunk_plan(*args), name)

    case(AREA, f"gluon gluon_chunk_plan{_args}")(_gluon_plan)


for _fields, _name in (
    ({"stages": -4}, "stages"),  # shared_bytes(..., stages=-4) once returned -48
    ({"stages": 6, "consumers": 4}, "stages"),
    ({"consumers": 5}, "consumers"),
    ({"plan": "diagonal"}, "plan"),
    ({"query_slots": 3}, "query_slots"),
    ({"loader_registers": 33}, "loader_registers"),
    ({"resident_weights": 1}, "resident_weights"),
):
    case(AREA, f"gluon GluonConfig({_fields})")(lambda tmp, f=_fields, n=_name: refused(lambda: _gluon_config(**f), n))


for _args, _name in (
    ((4, 64, 128, "fast"), "config"),
    ((4, 64, 128, None), "config"),
    ((17, 64, 128, "default"), "next_n"),
    ((4, 48, 128, "default"), "heads"),
    ((4, 64, 96, "default"), "head_dim"),
):

    def _shared(tmp: Path, args=_args, name=_name) -> Result:
        from dsa_lab.kernels.gluon import config as gc

        *shape, config = args
        config = _gluon_config() if config == "default" else config
        return refused(lambda: gc.shared_bytes(*shape, config), name)

    case(AREA, f"gluon shared_bytes{_args}")(_shared)
