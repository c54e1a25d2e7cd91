#!/usr/bin/env bash
# On the 2xH200 machine, one call: the GPU tests of tensor parallelism and of the fp8 decode, then `chat --tp 2` (two
# piped turns) and `serve --tp 2` (a completion, a taken port refused before the load, Ctrl-C), each ending with no
# process left. run() with carry [".whl/device-bundle.tgz", ".whl/use-bundle.sh"]:
#   bash benchmarks/run_gpu_x2_chat_serve.sh
set -u; source .whl/use-bundle.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="--model dummy:Qwen3-0.6B"
left() { sleep 2; pgrep -af "python.*minisgl_cli" || echo "no minisgl process left"; }

echo "== tests/test_gpu.py -k 'tp2 or fp8'"
timeout 420 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "tp2 or fp8" > "$OUT/pytest_tp2_fp8.txt" 2>&1
echo "rc=$?"; tail -n 3 "$OUT/pytest_tp2_fp8.txt"

echo "== chat --tp 2, two turns"
printf 'Write a long story about a dragon.\nAnd another one.\n' | timeout 200 torchrun --nproc-per-node 2 --standalone \
  -m minisgl_cli chat --no-tui --no-save $M --tp 2 --max-tokens 128 > "$OUT/chat_tp2.txt" 2>&1
echo "rc=$?"; grep -E "^\[|minisgl chat ·" "$OUT/chat_tp2.txt"; left

echo "== serve --tp 2"
(timeout 300 torchrun --nproc-per-node 2 --standalone -m minisgl_cli serve $M --tp 2 --port 8200 \
  > "$OUT/serve_tp2.log" 2>&1; echo "serve rc=$?" >> "$OUT/serve_tp2.log") &
for _ in $(seq 1 150); do curl -sf http://127.0.0.1:8200/health > /dev/null && break; sleep 1; done
curl -s http://127.0.0.1:8200/v1/completions -H 'content-type: application/json' \
  -d '{"model":"dummy:Qwen3-0.6B","prompt":"hello","max_tokens":16}' | head -c 300; echo
curl -s http://127.0.0.1:8200/metrics | grep -E "^minisgl:(num_requests_running|generation_tokens_total|engine_metrics_age)"
t0=$(date +%s.%N)
timeout 120 python -m minisgl_cli serve $M --port 8200 > "$OUT/serve_taken_port.log" 2>&1
echo "a second serve on the taken port: rc=$? in $(python -c "print(round($(date +%s.%N) - $t0, 1))") s"
tail -n 2 "$OUT/serve_taken_port.log"
pkill -INT -f "torchrun.*minisgl_cli serve"
for _ in $(seq 1 60); do pgrep -f "minisgl_cli serve" > /dev/null || break; sleep 1; done
grep -v "POST /v1\|GET /" "$OUT/serve_tp2.log" | tail -n 4; left
