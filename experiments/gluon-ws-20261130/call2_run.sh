#!/usr/bin/env bash
# Second H200 call (issue 13, round 6): more consumer warpgroups and smaller MMA chunks, timed against the
# round-5 rule in one process (B=128, L=64K), each candidate also checked on uniform and ragged+padded batches.
set -uo pipefail
ROOT=$PWD
cd .scratch/gluon/tree
export PYTHONPATH="$ROOT/.dg:$PWD" PYTHONUNBUFFERED=1
W=/tmp/gw2; rm -rf $W; mkdir -p $W
T0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $W/env.txt 2>&1
cat $W/env.txt
C3='c=3;s=9;m=128;g=128;w=l'; L72='m=128;g=128;l=72'
timeout 150 python3 scripts/gluon_dev.py variants --out $W/variants.jsonl --seconds-per-point 0.2 \
  "2:rule|c=2;s=8|c=3;s=9;w=l" \
  "3:rule|p=pair;m=128;g=128|$C3|c=3;s=9;p=row;m=64;g=64;w=l" \
  "4:rule|c=2;m=128;g=256;w=r|$C3|c=4;s=8;m=128;g=128;w=l|s=4" \
  "5:rule|$C3|m=128;g=256" "6:rule|$C3|$L72" "7:rule|$C3|$L72" "8:rule|$C3|$L72" > $W/variants.log 2>&1
echo "variants rc=$? t=$(( $(date +%s) - T0 ))s"; cut -c1-260 $W/variants.log
timeout 60 python3 scripts/gluon_dev.py check --out $W/check.jsonl --case-timeout 30 --only-extra --extra \
  "3:$C3" "4:$C3" "4:c=2;m=128;g=256;w=r" "5:$C3" "6:$C3" "7:$C3" "8:$C3" "3:p=pair;m=128;g=128" "4:s=4" "6:$L72" > $W/check.log 2>&1
echo "check rc=$? t=$(( $(date +%s) - T0 ))s"; grep -c '"ok": true' $W/check.jsonl; grep -v '"ok": true' $W/check.jsonl | cut -c1-300
cd /tmp && tar czf $OUT/gluon_h200_r6.tgz gw2; echo "total $(( $(date +%s) - T0 ))s"
