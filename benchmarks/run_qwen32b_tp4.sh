#!/usr/bin/env bash
# The Mini-SGLang online setting: Qwen3-32B shapes (dummy weights) at TP=4 on 4xH200, bench-trace in-process over
# the first 1000 requests of the project's Qwen-format trace (traces/qwen_1000.jsonl, python -m
# minisgl_cli.trace_gen), at two time scales. Usage there:
#   source .whl/use-bundle.sh && bash benchmarks/run_qwen32b_tp4.sh     (JSON lands in $OUT)
set -u
bash benchmarks/fi_cache.sh restore
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for scale in ${SCALES:-1.0 0.5}; do  # SCALES="1.0" for one
  timeout 210 torchrun --nproc-per-node 4 --standalone -m minisgl_cli bench-trace traces/qwen_1000.jsonl \
    --model dummy:Qwen3-32B --tp 4 --num-requests 1000 --time-scale "$scale" --quiet \
    --json "$OUT/trace_qwen3-32b_tp4_scale${scale}.json" 2>&1 | grep -v "^W1" | tail -30
done
bash benchmarks/fi_cache.sh save "$OUT"
