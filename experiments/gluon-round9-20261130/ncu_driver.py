"""ncu driver: one Gluon (rule) and one DeepGEMM launch at B=128, L=64K, next_n=N inside cudaProfilerStart/Stop."""
import sys
import torch
from dsa_lab.cache import random_paged_cache
from dsa_lab.kernels import get_backend
from dsa_lab.kernels import gluon_native as gn

n = int(sys.argv[1])
dg_name = sys.argv[2] if len(sys.argv) > 2 else "deepgemm"
dev = torch.device("cuda")
B, L, H, D = 128, 65536, 64, 128
cache = random_paged_cache([L] * B, D, seed=0, device=dev)
g = torch.Generator(device=dev).manual_seed(7)
q = torch.randn(B, n, H, D, generator=g, device=dev).to(torch.float8_e4m3fn)
w = torch.randn(B * n, H, generator=g, device=dev) * H**-0.5
ctx = (L - n + 1 + torch.arange(n, device=dev, dtype=torch.int32)).repeat(B, 1).contiguous()
dg = get_backend(dg_name)
gl = get_backend("gluon")
sched = dg.schedule(ctx, 64)
for _ in range(3):
    gl.logits(q, cache.data, w, ctx, cache.block_table, L, cache_dtype="fp8")
    dg.logits(q, cache.data, w, ctx, cache.block_table, L, sched, cache_dtype="fp8")
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
gl.logits(q, cache.data, w, ctx, cache.block_table, L, cache_dtype="fp8")
dg.logits(q, cache.data, w, ctx, cache.block_table, L, sched, cache_dtype="fp8")
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done", n, dg_name)
