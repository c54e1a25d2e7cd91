#!/usr/bin/env bash
# On the 2xH200 machine: TP=2 vs TP=1 logits, bench-offline --tp 2, and `serve --tp 2` (then --tp 1) answering a
# trace replay.
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_x2.sh [serve-only]   (figures land in $OUT)
set -u
bash benchmarks/fi_cache.sh restore
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 400 python -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/pytest_gpu_x2.txt"
if [ "${1:-}" != serve-only ]; then
  timeout 120 python benchmarks/tp_check.py dump /tmp/tp1.pt 2>&1 | tail -2
  timeout 150 torchrun --nproc-per-node 2 --standalone benchmarks/tp_check.py dump /tmp/tp2.pt 2>&1 | grep -v "^W1" | tail -3
  python benchmarks/tp_check.py compare /tmp/tp1.pt /tmp/tp2.pt | tee "$OUT/tp_logits.json"
  timeout 200 torchrun --nproc-per-node 2 --standalone -m minisgl_cli bench-offline --model dummy:Llama-3.1-8B --tp 2 \
    --quiet --json "$OUT/bench_llama8b_tp2.json" 2>&1 | grep -v "^W1" | tail -14
fi
for tp in 2 1; do  # the same short trace replay against `serve --tp 2`, then `serve` on one GPU
  (timeout 300 torchrun --nproc-per-node $tp --standalone -m minisgl_cli serve --model dummy:Qwen3-0.6B --tp $tp \
    --port 8200 > "$OUT/serve_tp$tp.log" 2>&1 &)
  for i in $(seq 1 120); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
  # With --url and no local model, bench-trace needs the served model's vocabulary and context.
  timeout 120 python -m minisgl_cli bench-trace traces/qwen_sample.jsonl --url http://127.0.0.1:8200 \
    --num-requests 64 --vocab-size 151936 --max-model-len 40960 --json "$OUT/trace_qwen3_tp${tp}_url.json" 2>&1 | tail -24
  pkill -INT -f "torchrun.*minisgl_cli serve"  # as Ctrl-C would: torchrun forwards it to every rank
  for i in $(seq 1 60); do pgrep -f "minisgl_cli serve" >/dev/null || break; sleep 1; done  # GPU memory freed
  grep -v "POST /v1" "$OUT/serve_tp$tp.log" | tail -8
done
bash benchmarks/fi_cache.sh save "$OUT"
