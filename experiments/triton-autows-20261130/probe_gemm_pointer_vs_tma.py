"""Does Triton's Hopper auto-WS (3.6) accept a plain tutorial GEMM loop? By tile M and operand path."""
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def gemm(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr):
    m = tl.arange(0, BM)
    n = tl.arange(0, BN)
    kk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WS):
        a = tl.load(a_ptr + m[:, None] * K + (k + kk)[None, :])
        b = tl.load(b_ptr + (k + kk)[:, None] * BN + n[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + m[:, None] * BN + n[None, :], acc)


@triton.jit
def gemm_desc(a_desc, b_desc, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr):
    m = tl.arange(0, BM)
    n = tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=WS):
        a = a_desc.load([0, k])
        b = b_desc.load([0, k])
        acc = tl.dot(a, b.T, acc)
    tl.store(c_ptr + m[:, None] * BN + n[None, :], acc)


for fn in (gemm, gemm_desc):
    for bm in (64, 128, 256):
        for dt in ("fp16", "fp8e4nv"):
            if fn is gemm:
                sig = {"a_ptr": f"*{dt}", "b_ptr": f"*{dt}", "c_ptr": "*fp32", "K": "i32"}
            else:
                sig = {"a_desc": f"tensordesc<{dt}[{bm}, 64]>", "b_desc": f"tensordesc<{dt}[128, 64]>", "c_ptr": "*fp32", "K": "i32"}
            sig |= {"BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "WS": "constexpr"}
            src = ASTSource(fn=fn, signature=sig, attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]},
                            constexprs={"BM": bm, "BN": 128, "BK": 64, "WS": True})
            try:
                k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
                g = k.asm["ttgir"]
                r = f"ok ttg.warp_specialize={g.count('ttg.warp_specialize')} num_warps={k.metadata.num_warps} shared={k.metadata.shared}"
            except Exception as e:
                r = "FAIL " + str(e).splitlines()[0][:100]
            print(f"PROBE3 {fn.__name__} BM={bm} {dt}: {r}", flush=True)
