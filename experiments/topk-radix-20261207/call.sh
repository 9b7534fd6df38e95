#!/usr/bin/env bash
# The one device call of lab-notes round 14 (an H100 80GB HBM3; an H200 was asked for), at commit 4b6ba95 with
# carry [".dg", "build/vllm_topk"]: the step study (shipped as data/h100/h100-step-20261207/), then our Triton radix
# select against vLLM's top-k after gluon's logits (data/h100/experiments/topk-radix-20261207/; its results.parquet
# was rebuilt here from points.jsonl, the call's files being capped at eight). Heads and head dim were left at the
# harness default (32 x 64): the top-k reads only the logits.
export DSA_LAB_GIT_SHA=4b6ba955c94e4d521ebf1dac286c57fdb8c3fef7 DSA_LAB_GIT_DIRTY=0
TEST_SECONDS=150 MAX_MINUTES=5 bash scripts/step_study.sh
tail -n 25 "$OUT/gpu-tests.log"
timeout 110 python3 -m dsa_lab.cli bench --backend gluon --strategy native --batch 1,16,128 \
    --context 65536,mixed:2048-131072 --next-n 1,3,4 --timed logits,logits+topk --topk-impl vllm,triton-radix \
    --timer graph --logits-width model:163840 --device cuda --out "$OUT/topk-radix" --max-minutes 1.5 --no-progress
