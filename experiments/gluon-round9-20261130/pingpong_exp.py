"""Round 10 experiment: the shipped Gluon kernel against a copy whose two consumers take turns issuing
their MMAs (an mbarrier pair: each issues a block's first MMA group only after the other issued its
previous block's), in one process; outputs compared with the shipped kernel's and the reference."""
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

pp = load("gluon_pingpong")
def cfg(text, n):
    base = gn.choose_gluon_config(n, 64, 128)
    if text == "rule":
        return base
    kw = dict(item.split("=") for item in text.split(";"))
    return gn.GluonConfig(consumers=int(kw.get("c", base.consumers)), stages=int(kw.get("s", base.stages)),
                          plan=base.plan, mma_columns=int(kw.get("m", base.mma_columns)),
                          group_columns=int(kw.get("g", base.group_columns)), resident_weights=base.resident_weights,
                          loader_registers=base.loader_registers)
out = Path(sys.argv[1]); batch = int(sys.argv[2]); length = int(sys.argv[3])
specs = sys.argv[4:]  # N:text|text...
dev = torch.device("cuda"); H, D = 64, 128
timing = TimingConfig(warmup=3, min_samples=10, max_samples=60, max_seconds=0.25)
cache = random_paged_cache([length] * batch, D, seed=0, device=dev)
gen = torch.Generator(device=dev).manual_seed(7)
for spec in specs:
    n_text, texts = spec.split(":", 1); n = int(n_text)
    q = torch.randn(batch, n, H, D, generator=gen, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(batch * n, H, generator=gen, device=dev) * H**-0.5
    ctx = (length - n + 1 + torch.arange(n, device=dev, dtype=torch.int32)).repeat(batch, 1).contiguous()
    sample = [0, batch - 1]
    ref = reference(q[sample].contiguous(), cache.data, w.view(batch, n, H)[sample].reshape(-1, H), ctx[sample].contiguous(),
                    cache.block_table[sample].contiguous(), length, cache_dtype="fp8")
    valid = torch.isfinite(ref)
    base = None
    for rep in range(2):
        for text in texts.split("|"):
            for name, m in (("shipped", gn), ("pingpong", pp)):
                c = cfg(text, n)
                if name == "pingpong" and c.consumers != 2:
                    continue
                res = torch.full((batch * n, length), float("nan"), device=dev)
                m.launch(q, cache.data, w, ctx, cache.block_table, length, c, res)
                torch.cuda.synchronize()
                if base is None:
                    base = res.clone()
                got = res.view(batch, n, length)[sample].reshape(-1, length)
                rel = float((got[valid].double() - ref[valid].double()).norm() / ref[valid].double().norm())
                call = lambda: m.launch(q, cache.data, w, ctx, cache.block_table, length, c, res)
                t = time_callable(call, dev, timing).as_row()
                row = {"next_n": n, "batch": batch, "context": length, "variant": name, "rep": rep, "config": c.describe(),
                       "bitwise_equal_to_first": bool(torch.equal(res, base)), "nan": bool(torch.isnan(res).any()),
                       "rel_err": rel, "median_us": t["median_ms"] * 1e3, "rel_iqr": t.get("rel_iqr")}
                print(json.dumps({k: row[k] for k in ("next_n", "variant", "rep", "config", "bitwise_equal_to_first", "nan", "rel_err", "median_us")}), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
