#!/usr/bin/env bash
# Round 10, call 6: TMA descriptor prefetch (timed against the shipped kernel), and B = 1 timelines cold, warm, with prefetch.
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R
timeout 200 python3 .scratch/r11/timeline2_exp.py $W 1:32768:1,1:32768:4,1:65536:1,16:65536:1,128:65536:1,128:65536:3,128:65536:4 > $W/log.txt 2>&1; echo "rc=$?"
python3 - <<PY
import json, collections
t=collections.defaultdict(list); bad=0
for l in open("$W/runs.jsonl"):
    r=json.loads(l); bad += not r["ok"]
    if "median_us" in r: t[(r["batch"],r["context"],r["next_n"],r["variant"])].append(round(r["median_us"],2))
print("not ok:", bad)
for k,v in sorted(t.items()): print(k, v)
PY
cd $OUT && tar czf call6.tar.gz work && rm -rf work
