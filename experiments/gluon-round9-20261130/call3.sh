#!/usr/bin/env bash
# Round 9, call 3: configs again with the per-request ctx read (n = 1..6), then checks of the faster ones.
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R
timeout 330 python3 scripts/gluon_dev.py variants --out $W/variants.jsonl \
  "1:rule|c=4;s=8;l=24|c=4;s=12;l=24|s=15" \
  "2:rule|c=4;s=8;w=l;l=24|m=64;g=128|c=4;s=8;m=64;g=128;w=l;l=24|c=2;s=8|c=3;s=12" \
  "3:rule|s=12|c=3;s=9;m=128;g=128|c=3;s=12;m=128;g=128|c=4;s=8;m=128;g=128;w=l;l=24|p=row;m=64;g=64" \
  "4:rule|s=12|c=4;s=8;m=128;g=128;w=l;l=24|c=3;s=9;m=128;g=128;w=l" \
  "6:rule|c=4;s=8;m=128;g=128;w=l;l=24" > $W/variants.log 2>&1; echo "variants rc=$?"
cut -c1-130 $W/variants.log
cd $OUT && tar czf call3.tar.gz work && rm -rf work
