#!/usr/bin/env bash
# bench-serve rate sweep of `minisgl serve` (dummy Qwen3-0.6B) on one GPU, from light load to past the knee, with the
# client's absorption check first. Figures land in $OUT; matplotlib is not needed there: plot them here with
#   minisgl bench-compare $OUT/serve_sweep_qwen3_0.6b.json --plot docs/img/bench_serve_sweep_gpu.png
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_bench_serve.sh
set -u
bash benchmarks/fi_cache.sh restore
python -m minisgl_cli bench-serve --client-check --json "$OUT/client_check.json" 2>&1 | tail -12
(timeout 900 python -m minisgl_cli serve --model dummy:Qwen3-0.6B --port 8200 > "$OUT/serve_sweep.log" 2>&1 &)
for i in $(seq 1 180); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
# 512-token prompts, 256 output tokens; each load sends for at most 20 s (at most 600 requests); inf = all at once
timeout 560 python -m minisgl_cli bench-serve --url http://127.0.0.1:8200 --model dummy:Qwen3-0.6B \
  --input-len 512:512 --output-len 256:256 --rate 2,8,16,32,48,64,96,inf --duration 20 --num-requests 600 \
  --warmup 32 --slo ttft=500ms,tpot=25ms --quiet \
  --json "$OUT/serve_sweep_qwen3_0.6b.json" --csv "$OUT/serve_sweep_qwen3_0.6b.csv" 2>&1 | tail -40
pkill -INT -f "minisgl_cli serve"
for i in $(seq 1 60); do pgrep -f "minisgl_cli serve" >/dev/null || break; sleep 1; done
grep -v "POST /v1" "$OUT/serve_sweep.log" | tail -8
