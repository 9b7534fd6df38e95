"""How a request's query rows become tensor-core MMA chunks: the one plan our Triton and Gluon kernels share.

An MMA takes a power-of-two number of query rows (each H columns wide). So next_n rows are cut into full
chunks of the most rows one MMA may take, then the remainder's binary parts, largest first (n = 7 at four
rows a chunk: 4 + 2 + 1; n = 3, H = 64 at N <= 256: 2 + 1, i.e. N = 128 + 64), and an odd next_n wastes no
tensor-core work on padding. Plain Python: the host computes it for the Triton kernel's constexpr plan, and
the Gluon kernel calls it at compile time (a `triton.constexpr_function` wherever Triton is installed).
"""

from __future__ import annotations

try:
    from triton import constexpr_function  # what a kernel may call at compile time
except ImportError:  # no Triton: plain functions, the host arithmetic still works

    def constexpr_function(fn):
        return fn


@constexpr_function
def binary_chunks(next_n: int, per_chunk: int) -> tuple[tuple[int, int], ...]:
    """(first query row, query rows) of each chunk: `next_n // per_chunk` chunks of `per_chunk` rows, then
    the remainder's binary parts, largest first; the chunks tile 0..next_n-1 exactly.

    Unchecked, since a kernel calls it at compile time: `per_chunk` must be a power of two (each kernel's
    public plan checks its arguments first).
    """
    plan = []
    first = 0
    for _ in range(next_n // per_chunk):
        plan.append((first, per_chunk))
        first += per_chunk
    size = per_chunk
    while first < next_n:
        size //= 2
        if next_n - first >= size:
            plan.append((first, size))
            first += size
    return tuple(plan)
