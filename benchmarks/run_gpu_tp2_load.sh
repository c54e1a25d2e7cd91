#!/usr/bin/env bash
# On two GPUs of one host (nvidia-h200-x2): the step-failure tests of the Python API on GPU 0 (tests/test_llm_api.py
# -m gpu), the TP=2 tests, then `serve --tp 2` under issue #15's saturating replay (qwen_1000 at 5x pace, dummy
# Qwen3-0.6B) and a check that Ctrl-C leaves no process behind. Figures land in $OUT.
# Usage there: source .whl/use-bundle.sh && COMMIT=<sha> bash benchmarks/run_gpu_tp2_load.sh
# (benchmarks/pack_bundle.sh's use-bundle.sh also restores FlashInfer's JIT cache when .whl/fi-cache.txz is carried)
set -u
c=${COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
CUDA_VISIBLE_DEVICES=0 timeout 200 python -m pytest -q -p no:cacheprovider tests/test_llm_api.py -m gpu \
  > "$OUT/pytest_llm_api_gpu_$c.txt" 2>&1
echo "llm_api gpu: rc=$?"; tail -n 3 "$OUT/pytest_llm_api_gpu_$c.txt"
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k tp2 > "$OUT/pytest_tp2_$c.txt" 2>&1
echo "tp2: rc=$?"; tail -n 3 "$OUT/pytest_tp2_$c.txt"
(timeout 300 torchrun --nproc-per-node 2 --standalone -m minisgl_cli serve --model dummy:Qwen3-0.6B --tp 2 \
  --port 8200 --log-level warning > "$OUT/serve_tp2.log" 2>&1 &)
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
echo "serve --tp 2 healthy after ${i} s"
timeout 200 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl --url http://127.0.0.1:8200 --time-scale 0.2 \
  --vocab-size 151936 --max-model-len 40960 --quiet --json "$OUT/serve_tp2_x5_$c.json" > "$OUT/serve_tp2_x5.log" 2>&1
echo "replay: rc=$?"; tail -n 24 "$OUT/serve_tp2_x5.log"
pkill -INT -f "torchrun.*minisgl_cli serve"  # as Ctrl-C would: torchrun forwards it to every rank
for i in $(seq 1 60); do pgrep -f "minisgl_cli serve" >/dev/null || break; sleep 1; done
pgrep -fa "minisgl_cli" && echo "LEFT BEHIND" || echo "serve --tp 2: no process left after ${i} s"
grep -v "POST /v1" "$OUT/serve_tp2.log" | tail -n 8
nvidia-smi --query-gpu=memory.used --format=csv,noheader
