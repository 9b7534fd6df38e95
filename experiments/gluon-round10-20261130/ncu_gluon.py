"""ncu driver: one launch of a Gluon module's kernel at B=128, L=64K, next_n=N inside cudaProfilerStart/Stop."""
import importlib.util, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dsa_lab.cache import random_paged_cache
from dsa_lab.kernels import gluon_native as gn

name, n = sys.argv[1], int(sys.argv[2])
if name == "shipped":
    m = gn
else:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m)
dev = torch.device("cuda")
B, L, H, D = 128, 65536, 64, 128
cache = random_paged_cache([L] * B, D, seed=0, device=dev)
g = torch.Generator(device=dev).manual_seed(7)
q = torch.randn(B, n, H, D, generator=g, device=dev).to(torch.float8_e4m3fn)
w = torch.randn(B * n, H, generator=g, device=dev) * H**-0.5
ctx = (L - n + 1 + torch.arange(n, device=dev, dtype=torch.int32)).repeat(B, 1).contiguous()
cfg = m.choose_gluon_config(n, H, D)
for _ in range(3):
    m.launch(q, cache.data, w, ctx, cache.block_table, L, cfg)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
m.launch(q, cache.data, w, ctx, cache.block_table, L, cfg)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done", name, n)
