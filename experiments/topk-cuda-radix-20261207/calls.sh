#!/usr/bin/env bash
# The device calls of lab-notes round 14's CUDA selection (an H100 80GB HBM3), carry [".dg", "build/vllm_topk"],
# one a variant of dsa_lab/topk/csrc/row_select.cu, each at the commit that holds it (DSA_LAB_GIT_SHA):
#   one-histogram    450889f (warp-aggregated atomics into one shared histogram)
#   four-histograms  225a9df (the same, into four copies that warps share round-robin)
#   plain-atomics    a4f56f3 (four copies, a plain shared atomic a score; the source 1257ef8 made)
# (The first call also wrote nvidia-smi's name and driver line to $OUT/device.txt.) Each results.parquet was rebuilt here from points.jsonl (the call left it behind to stay within its files).
variant="${1:?the variant: one-histogram, four-histograms, plain-atomics}"
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_topk_cuda_radix.py 2>&1 | tail -3 | tee "$OUT/gpu-tests.log"
timeout 300 python3 -m dsa_lab.cli bench --backend gluon --strategy native --batch 1,16,64,128 \
    --context 65536,mixed:2048-131072 --next-n 1,3,4 --heads 64 --head-dim 128 --timed logits,logits+topk \
    --topk-impl vllm,cuda-radix --timer graph --logits-width model:163840 --device cuda \
    --out "$OUT/$variant" --max-minutes 4 --no-progress
