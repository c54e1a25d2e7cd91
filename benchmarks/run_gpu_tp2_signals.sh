#!/usr/bin/env bash
# Two GPUs (nvidia-h200-x2): the TP=2 tests, then `serve --tp 2` stopped by SIGTERM to torchrun with a stream open
# (the forty-sixth session: followers leave the signal to rank 0). Usage there: bash benchmarks/run_gpu_tp2_signals.sh
set -u
source .whl/use-bundle.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 240 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k tp2 > "$OUT/pytest_tp2.txt" 2>&1
  echo "tp2: rc=$?"; tail -n 2 "$OUT/pytest_tp2.txt"
fi
(timeout 200 torchrun --nproc-per-node 2 --standalone -m minisgl_cli serve --model dummy:Qwen3-0.6B --tp 2 \
  --port 8200 --log-level warning > "$OUT/serve_tp2.log" 2>&1 &)
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
echo "healthy after ${i} s"
(curl -sN http://127.0.0.1:8200/v1/completions -H 'content-type: application/json' \
  -d '{"model":"dummy:Qwen3-0.6B","prompt":"hi","max_tokens":30000,"stream":true,"ignore_eos":true}' > "$OUT/stream.txt" 2>&1 &)
sleep 2
ipc=$(ls -d /tmp/minisgl-* 2>/dev/null | head -1); echo "ipc dir: $ipc"
pkill -TERM -f "torchrun.*minisgl_cli serve"; t0=$(date +%s)
for i in $(seq 1 60); do pgrep -f "minisgl_cli" >/dev/null || break; sleep 1; done
pgrep -fa "minisgl_cli" && echo "LEFT BEHIND" || echo "SIGTERM: no process left after ${i} s"
echo "stream events: $(grep -c '^data:' $OUT/stream.txt)"; grep '^data:' "$OUT/stream.txt" | tail -2 | cut -c1-300
[ -n "$ipc" ] && { [ -e "$ipc" ] && echo "IPC DIR LEFT" || echo "ipc dir removed"; }
grep -c "tensor-parallel group failed" "$OUT/serve_tp2.log"; grep -v "POST /v1" "$OUT/serve_tp2.log" | tail -n 5
nvidia-smi --query-gpu=memory.used --format=csv,noheader
