#!/usr/bin/env bash
# Round 10, call 3: next_n=2 with its two rows as two N=64 MMAs in separate groups (the first row's
# epilogue under the second row's MMA), against the rule's one N=128 MMA.
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R
for bl in 128:65536 64:32768; do b=${bl%:*}; l=${bl#*:}
  timeout 120 python3 scripts/gluon_dev.py variants --out $W/variants.jsonl --batch $b --context $l \
    "2:rule|m=64;g=64|c=2;s=8;m=64;g=64|rule|m=64;g=64" > $W/variants-$b-$l.log 2>&1
  echo "B=$b L=$l rc=$?"
done
python3 - <<PY
import json
for l in open("$W/variants.jsonl"):
    r=json.loads(l); print(r["batch"], r["context"], r["next_n"], r["config"], r.get("ok"), round(r.get("median_ms",0)*1e3,1), r.get("stack_bytes"))
PY
cd $OUT && tar czf call3.tar.gz work && rm -rf work
