#!/usr/bin/env bash
# Lab-notes round 15's second device call, carry [".dg", "build/vllm_topk"]: the sampled-floor split select
# (dsa_lab/kernels/csrc/split_select.cu at this commit) and `gluon-fused` (Gluon's logits, then that select): the
# GPU tests of both, then the same grid as call.sh with gluon-fused beside gluon + vLLM's top-k, in one process.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=line tests/test_topk_cuda.py \
    tests/test_serving_step_gpu.py -k "cuda-split or fused" 2>&1 | tail -12 | tee "$OUT/gpu-tests.log"
timeout 330 python3 -m dsa_lab.cli bench --backend gluon,gluon-fused --strategy native --batch 1,16,64,128 \
    --context 65536,mixed:2048-131072 --next-n 1,3,4 --heads 64 --head-dim 128 --timed logits,logits+topk \
    --topk-impl vllm,cuda-split --timer graph --logits-width model:163840 --device cuda \
    --out "$OUT/sampled-floor" --max-minutes 4.5 --no-progress
rm -f "$OUT/sampled-floor/results.parquet"
