"""Round 10 experiment: the shipped Gluon kernel against copies without the proxy fence(s) before the
consumers' mbarrier arrives, in one process (B=128, L=64K unless given), outputs compared bit for bit."""
import json, sys, importlib.util
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dsa_lab.kernels import gluon_native as gn
from dsa_lab.cache import random_paged_cache
from dsa_lab.bench.timing import TimingConfig, time_callable
from dsa_lab.kernels.reference import paged_mqa_logits as reference

def load(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m

mods = {"shipped": gn, "nofence_kv": load("gluon_nofence_kv"), "nofence": load("gluon_nofence")}
out = Path(sys.argv[1]); batch = int(sys.argv[2]); length = int(sys.argv[3]); ns = [int(x) for x in sys.argv[4].split(",")]
dev = torch.device("cuda"); H, D = 64, 128
timing = TimingConfig(warmup=3, min_samples=10, max_samples=60, max_seconds=0.25)
cache = random_paged_cache([length] * batch, D, seed=0, device=dev)
gen = torch.Generator(device=dev).manual_seed(7)
for n in ns:
    q = torch.randn(batch, n, H, D, generator=gen, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(batch * n, H, generator=gen, device=dev) * H**-0.5
    ctx = (length - n + 1 + torch.arange(n, device=dev, dtype=torch.int32)).repeat(batch, 1).contiguous()
    cfg = gn.choose_gluon_config(n, H, D)
    sample = [0, batch - 1]
    ref = reference(q[sample].contiguous(), cache.data, w.view(batch, n, H)[sample].reshape(-1, H), ctx[sample].contiguous(),
                    cache.block_table[sample].contiguous(), length, cache_dtype="fp8")
    valid = torch.isfinite(ref)
    base = None
    for rep in range(2):
        for name, m in mods.items():
            res = torch.full((batch * n, length), float("nan"), device=dev)
            m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res)
            torch.cuda.synchronize()
            if base is None:
                base = res.clone()
            same = bool(torch.equal(res, base))
            got = res.view(batch, n, length)[sample].reshape(-1, length)
            rel = float((got[valid].double() - ref[valid].double()).norm() / ref[valid].double().norm())
            call = lambda: m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res)
            t = time_callable(call, dev, timing).as_row()
            row = {"next_n": n, "batch": batch, "context": length, "variant": name, "rep": rep, "config": cfg.describe(),
                   "bitwise_equal_to_shipped": same, "rel_err": rel, "median_us": t["median_ms"] * 1e3, "rel_iqr": t.get("rel_iqr")}
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
