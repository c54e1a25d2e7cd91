#!/usr/bin/env bash
# GPU tests, then the OpenAI server on one GPU with a trace replay against it (figures land in $OUT).
set -u
(tar xzf .whl/fi-cache.tgz -C ~ 2>/dev/null || true)
python -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
(python -m minisgl_cli serve --model dummy:Qwen3-0.6B --port 8200 > "$OUT/serve.log" 2>&1 &)
for i in $(seq 1 90); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
timeout 90 python -m minisgl_cli bench-trace traces/qwen_sample.jsonl --url http://127.0.0.1:8200 \
  --num-requests 64 --json "$OUT/trace_qwen3_tp1_url.json" 2>&1 | tail -24
pkill -INT -f "minisgl_cli serve"; sleep 3
tail -20 "$OUT/serve.log"
