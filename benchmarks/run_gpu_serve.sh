#!/usr/bin/env bash
# The OpenAI server on one GPU with the x2 script's trace replay against it (figures land in $OUT).
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_serve.sh
set -u
bash benchmarks/fi_cache.sh restore
(timeout 300 python -m minisgl_cli serve --model dummy:Qwen3-0.6B --port 8200 > "$OUT/serve_tp1.log" 2>&1 &)
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
timeout 120 python -m minisgl_cli bench-trace traces/qwen_sample.jsonl --url http://127.0.0.1:8200 \
  --num-requests 64 --vocab-size 151936 --max-model-len 40960 --json "$OUT/trace_qwen3_tp1_url.json" 2>&1 | tail -24
pkill -INT -f "minisgl_cli serve"
for i in $(seq 1 60); do pgrep -f "minisgl_cli serve" >/dev/null || break; sleep 1; done
grep -v "POST /v1" "$OUT/serve_tp1.log" | tail -8
