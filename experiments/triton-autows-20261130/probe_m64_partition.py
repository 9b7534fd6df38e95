"""Hopper auto-WS (Triton 3.6), M=64 tiles duplicate work across the two consumers. Can a loop body give them distinct work?"""
import re
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def two_chunks(kv_desc, q_desc, table_ptr, out_ptr, lo, hi, H: tl.constexpr, D: tl.constexpr):
    # one K tile, two query-row chunks (two dots sharing K)
    tokens = tl.arange(0, 64)
    q0 = q_desc.load([0, 0])
    q1 = q_desc.load([H, 0])
    for blk in tl.range(lo, hi, warp_specialize=True):
        page = tl.load(table_ptr + blk)
        k = kv_desc.load([page, 0, 0]).reshape(64, D)
        s0 = tl.dot(k, q0.T)
        tl.store(out_ptr + blk * 64 + tokens, tl.sum(s0, axis=1))
        s1 = tl.dot(k, q1.T)
        tl.store(out_ptr + 1000000 + blk * 64 + tokens, tl.sum(s1, axis=1))


@triton.jit
def two_pages(kv_desc, q_desc, table_ptr, out_ptr, lo, hi, H: tl.constexpr, D: tl.constexpr):
    # two pages per step joined into one M=128 tile
    tokens = tl.arange(0, 128)
    q = q_desc.load([0, 0])
    for step in tl.range(lo, hi, warp_specialize=True):
        p0 = tl.load(table_ptr + 2 * step)
        p1 = tl.load(table_ptr + 2 * step + 1)
        k0 = kv_desc.load([p0, 0, 0]).reshape(64, D)
        k1 = kv_desc.load([p1, 0, 0]).reshape(64, D)
        k = tl.join(k0, k1).permute(2, 0, 1).reshape(128, D)
        s = tl.dot(k, q.T)
        tl.store(out_ptr + step * 128 + tokens, tl.sum(s, axis=1))


@triton.jit
def two_pages_cat(kv_desc, q_desc, table_ptr, out_ptr, lo, hi, H: tl.constexpr, D: tl.constexpr):
    # two pages per step, two dots, two stores (no join)
    tokens = tl.arange(0, 64)
    q = q_desc.load([0, 0])
    for step in tl.range(lo, hi, warp_specialize=True):
        p0 = tl.load(table_ptr + 2 * step)
        p1 = tl.load(table_ptr + 2 * step + 1)
        k0 = kv_desc.load([p0, 0, 0]).reshape(64, D)
        k1 = kv_desc.load([p1, 0, 0]).reshape(64, D)
        tl.store(out_ptr + step * 128 + tokens, tl.sum(tl.dot(k0, q.T), axis=1))
        tl.store(out_ptr + step * 128 + 64 + tokens, tl.sum(tl.dot(k1, q.T), axis=1))


for fn in (two_chunks, two_pages, two_pages_cat):
    for H in (64, 128):
        sig = {"kv_desc": "tensordesc<fp8e4nv[1, 64, 128]>", "q_desc": f"tensordesc<fp8e4nv[{H}, 128]>", "table_ptr": "*i32",
               "out_ptr": "*fp32", "lo": "i32", "hi": "i32", "H": "constexpr", "D": "constexpr"}
        try:
            k = triton.compile(ASTSource(fn=fn, signature=sig, attrs={}, constexprs={"H": H, "D": 128}),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
            g = k.asm["ttgir"]
            dots = [(m.group(2), m.group(1)) for m in re.finditer(r"warp_group_dot [^\n]*?async_task_id = array<i32: ([0-9, ]+)>[^\n]*-> tensor<(\d+x\d+)xf32", g)]
            r = f"ok ws={g.count('ttg.warp_specialize')} warps={k.metadata.num_warps} shared={k.metadata.shared} dots(shape,task)={dots}"
        except Exception as e:
            r = "FAIL " + str(e).splitlines()[0][:100]
        print(f"PROBE5 {fn.__name__} H={H}: {r}", flush=True)
