#!/usr/bin/env bash
# Round 10, call 4: B = 1, the loader's context wait removed (diagnostic upper bound), three repetitions.
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R
timeout 240 python3 .scratch/r11/upper_exp.py $W/upper.jsonl 1:32768:1,1:32768:2,1:32768:4,1:65536:1,1:65536:4,16:65536:1 > $W/upper.log 2>&1; echo "rc=$?"
python3 - <<PY
import json, collections
t=collections.defaultdict(list)
for l in open("$W/upper.jsonl"):
    r=json.loads(l); t[(r["batch"],r["context"],r["next_n"],r["variant"])].append(round(r["median_us"],2))
    if "masks_match" in r and (not r["masks_match"] or r["rel_err"]>1e-3): print("BAD", r)
for k,v in sorted(t.items()): print(k, v)
PY
cd $OUT && tar czf call4.tar.gz work && rm -rf work
