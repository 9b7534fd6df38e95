#!/usr/bin/env bash
# Round 10, call 5: per-CTA timelines (globaltimer / clock64) of the shipped kernel's steps.
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv > $W/clocks.txt
timeout 200 python3 .scratch/r11/timeline_exp.py $W 1:32768:1:0:timed,1:32768:4:0:timed,1:65536:1:0:timed,128:65536:3:300:timed+timed_scalarid > $W/timeline.log 2>&1; echo "rc=$?"
tail -5 $W/timeline.log; grep -c '"ok": true' $W/timeline.log
cd $OUT && tar czf call5.tar.gz work && rm -rf work
