"""Hopper auto-WS (Triton 3.6): which of our kernel's features does the pass accept? Descriptor-based steps."""
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def step_a(kv_desc, q_desc, table_ptr, out_ptr, lo, hi, H: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr):
    # MODE 0: Q loop-invariant (descriptor, before the loop), loop-carried acc over pages blk
    # MODE 1: fresh S per block, epilogue row sum + store
    # MODE 2: MODE 1 + page id from the block table (pointer load) as the TMA coordinate
    # MODE 3: MODE 2 + f32 scales via pointer load in the loop, relu, weights, head-sum reshape
    tokens = tl.arange(0, 64)
    q = q_desc.load([0, 0])  # [H, D]
    acc = tl.zeros((64, H), tl.float32)
    w = tl.load(out_ptr + tl.arange(0, H))
    for blk in tl.range(lo, hi, warp_specialize=True):
        if MODE >= 2:
            page = tl.load(table_ptr + blk)
        else:
            page = blk
        k = kv_desc.load([page, 0, 0]).reshape(64, D)
        if MODE == 0:
            acc = tl.dot(k, q.T, acc)
        else:
            s = tl.dot(k, q.T)
            if MODE == 3:
                scale = tl.load(out_ptr + page * 64 + tokens)
                s = tl.maximum(s, 0.0) * w[None, :]
                logit = tl.sum(tl.reshape(s, (64, 1, H)), axis=2) * scale[:, None]
                tl.store(out_ptr + blk * 64 + tokens[:, None] + tl.arange(0, 1)[None, :], logit)
            else:
                tl.store(out_ptr + blk * 64 + tokens, tl.sum(s, axis=1))
    if MODE == 0:
        tl.store(out_ptr + tokens[:, None] * H + tl.arange(0, H)[None, :], acc)


for mode in range(4):
    for H in (64, 128, 256):
        sig = {"kv_desc": "tensordesc<fp8e4nv[1, 64, 128]>", "q_desc": f"tensordesc<fp8e4nv[{H}, 128]>", "table_ptr": "*i32",
               "out_ptr": "*fp32", "lo": "i32", "hi": "i32", "H": "constexpr", "D": "constexpr", "MODE": "constexpr"}
        src = ASTSource(fn=step_a, signature=sig, attrs={(2,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]},
                        constexprs={"H": H, "D": 128, "MODE": mode})
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
            g = k.asm["ttgir"]
            r = f"ok ttg.warp_specialize={g.count('ttg.warp_specialize')} num_warps={k.metadata.num_warps} shared={k.metadata.shared}"
        except Exception as e:
            r = "FAIL " + str(e).splitlines()[0][:100]
        print(f"PROBE4 mode={mode} H={H}: {r}", flush=True)
