"""How our Triton and Gluon kernels are compiled, written once for both families.

A kernel is jitted on first use, not at import, so the TRITON_INTERPRET in force then decides compiled
vs interpreted (`jitted`); the interpreter also needs the variable set before triton's first import
(`interpreter_state`). Ahead of time, Triton compiles a kernel for `sm_<arch>` through its own ptxas on
any machine, no GPU and no driver (`compile_ahead`); `cubin.resource_counts` reads what came out. Gluon
kernels have no interpreter: they only run compiled, on their GPU.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Collection, Mapping
from typing import Any

from dsa_lab.kernels.descriptor import Availability

ALIGNMENT = 16  # bytes an aligned pointer or integer argument is assumed divisible by (`tt.divisibility`)


def interpreter_enabled() -> bool:
    """Whether TRITON_INTERPRET asks for the interpreter ('1', 'true', 'yes' or 'on')."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def interpreter_state() -> Availability:
    """Can the interpreter run our Triton kernels in this process?

    triton.jit picks the interpreter when a function is decorated, and triton.language's
    own jitted helpers (tl.sum, tl.max) are decorated when triton is first imported, so
    TRITON_INTERPRET=1 set after that import (say, after vllm imported triton) cannot work.
    """
    if not interpreter_enabled():
        return Availability(False, "on CPU the Triton kernel needs the interpreter: set TRITON_INTERPRET=1")
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.sum, InterpretedFunction):
        return Availability(
            False,
            "TRITON_INTERPRET=1 was set after triton was first imported in this process; "
            "set it before that import (in the shell or tests/conftest.py)",
        )
    return Availability(True, "Triton interpreter (TRITON_INTERPRET=1)")


def jitted(fn: Callable[..., Any]) -> Any:
    """`fn` decorated by triton.jit on first use under the TRITON_INTERPRET in force now (one of each)."""
    return _jitted(fn, interpreter_enabled())


@functools.cache
def _jitted(fn: Callable[..., Any], interpret: bool) -> Any:
    del interpret  # only keys the cache: triton.jit reads the variable itself
    import triton

    return triton.jit(fn)


def compile_ahead(
    fn: Any,
    arch: int,
    types: Mapping[str, str],
    constexprs: Mapping[str, Any],
    options: Mapping[str, int],
    aligned: Collection[str] = (),
    gluon: bool = False,
) -> Any:
    """Triton's CompiledKernel of `fn` for `sm_<arch>`, no GPU needed: every runtime argument typed by
    `types` ('*fp32', 'i32', a tensor descriptor), every compile-time one given in `constexprs`, those in
    `aligned` assumed 16-byte divisible. `fn` is a plain kernel function (jitted here) or a jitted Gluon
    kernel (`gluon=True`). Call it where TRITON_INTERPRET is unset: triton.jit picks the interpreter
    otherwise. KeyError names an argument the caller gave no type or value."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource  # sets num-warps first

    kernel = fn if gluon else triton.jit(fn)
    signature, attrs = {}, {}
    for index, param in enumerate(kernel.params):
        if param.is_constexpr:
            if param.name not in constexprs:
                raise KeyError(f"kernel constexpr {param.name!r}: the compile gives it no value")
            signature[param.name] = "constexpr"
        elif param.name in types:
            signature[param.name] = types[param.name]
        else:
            raise KeyError(f"kernel argument {param.name!r}: the compile gives it no type")
        if param.name in aligned:
            attrs[(index,)] = [["tt.divisibility", ALIGNMENT]]
    source = ASTSource(fn=kernel, signature=signature, constexprs=dict(constexprs), attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=dict(options))
