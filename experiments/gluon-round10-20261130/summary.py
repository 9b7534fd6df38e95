"""Round 10: summary.csv from the three calls' JSONL files: one row per timing, with its ratio to the
shipped kernel at its rule config (the first timing of that point in the same process)."""
import json
from pathlib import Path

import pandas as pd

here = Path(__file__).resolve().parents[1]
rows = []
for line in (here / "call1/loader.jsonl").read_text().splitlines():
    r = json.loads(line)
    rows.append({"call": "call1", "batch": r["batch"], "context": r["context"], "next_n": r["next_n"],
                 "kernel": r["variant"], "config": r.get("config", ""), "rep": r["rep"],
                 "bitwise_equal_to_shipped": r.get("bitwise_equal_to_shipped"), "rel_err": r.get("rel_err"),
                 "median_us": round(r["median_us"], 2), "rel_iqr": r.get("rel_iqr")})
for call in ("call2", "call3"):
    seen = {}
    for line in (here / call / "variants.jsonl").read_text().splitlines():
        r = json.loads(line)
        key = (r["batch"], r["context"], r["next_n"], r["config"])
        seen[key] = seen.get(key, -1) + 1
        rows.append({"call": call, "batch": r["batch"], "context": r["context"], "next_n": r["next_n"],
                     "kernel": "shipped", "config": r["config"], "rep": seen[key], "bitwise_equal_to_shipped": None,
                     "rel_err": r.get("rel_err"), "median_us": round(r["median_ms"] * 1e3, 2), "rel_iqr": r.get("rel_iqr"),
                     "registers": r.get("registers"), "stack_bytes": r.get("stack_bytes")})
df = pd.DataFrame(rows)
point = ["call", "batch", "context", "next_n"]
df["vs_shipped_rule"] = (df["median_us"] / df.groupby(point)["median_us"].transform("first")).round(3)
df.to_csv(here / "summary.csv", index=False)
