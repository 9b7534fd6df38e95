#!/usr/bin/env bash
# Round 9, call 6: n=3 pipelining / register variants at the shipped kernel (1927c59 = 0fd4539).
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R
timeout 300 python3 scripts/gluon_dev.py variants --out $W/variants.jsonl \
  "3:rule|s=12;g=192|c=2;s=12;l=24|c=2;s=12;g=192;l=24|c=3;s=12;m=128;g=128;w=l|c=3;s=9;m=128;g=128;w=l|rule" \
  "2:rule|c=3;s=9;w=l|rule" "4:rule|c=2;s=12;l=24|s=12;g=128|rule" "1:rule|l=24|rule" > $W/variants.log 2>&1; echo "variants rc=$?"
python3 -c "
import json
for l in open('$W/variants.jsonl'):
    r=json.loads(l); print(r['next_n'], r['config'], round(r.get('median_ms',0)*1000,1), r.get('rel_iqr'), r.get('stack_bytes'), r.get('ok'))"
cd $OUT && tar czf call6.tar.gz work && rm -rf work
