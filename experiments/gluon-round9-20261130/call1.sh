#!/usr/bin/env bash
# Round 9, call 1 (after the PR #340 build in the command line): env, PR #340 + DeepGEMM through the
# harness (every point checked poisoned), Gluon four-consumer variants, checks of the candidates.
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R DSA_LAB_DEEPGEMM_PR340=$R/.pr340/src
export DSA_LAB_GIT_SHA=${SHA:-unknown} DSA_LAB_GIT_DIRTY=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $W/nvidia-smi.txt 2>&1
timeout 120 python3 -m dsa_lab.cli env > $W/env.txt 2>&1; echo "env rc=$?"
tail -12 $W/env.txt
timeout 150 python3 -m dsa_lab.cli bench --preset h200-full --device cuda --out $W/pr340-b128 \
  --backend deepgemm,deepgemm-pr340 --batch 128 --context 64K,mixed:16K-64K --next-n 1,2,3,4,5 --strategy all \
  --max-minutes 2.2 > $W/pr340-b128.log 2>&1; echo "bench rc=$?"
tail -30 $W/pr340-b128.log
C4N="c=4;s=8;m=128;g=128;w=l;l=24"
timeout 200 python3 scripts/gluon_dev.py variants --out $W/variants.jsonl \
  "2:rule|c=4;s=8;w=l;l=24|$C4N" "4:rule|$C4N|c=4;s=12;m=128;g=128;w=l;l=24" "1:rule|c=4;s=8;l=24" \
  "3:rule|$C4N" "6:rule|$C4N" "8:rule|$C4N" > $W/variants.log 2>&1; echo "variants rc=$?"
cat $W/variants.log | cut -c1-250
timeout 100 python3 scripts/gluon_dev.py check --out $W/check.jsonl --only-extra \
  --extra "2:c=4;s=8;w=l;l=24" "2:$C4N" "4:$C4N" "1:c=4;s=8;l=24" "8:$C4N" > $W/check.log 2>&1; echo "check rc=$?"
tail -12 $W/check.log | cut -c1-250
cd $OUT && tar czf call1.tar.gz work && rm -rf work && ls -la $OUT
