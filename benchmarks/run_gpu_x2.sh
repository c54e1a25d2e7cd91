#!/usr/bin/env bash
# One call on the 2xH200 machine: GPU tests, single-GPU throughput, then TP=2 checks and benchmarks.
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_x2.sh   (figures land in $OUT)
set -u
(tar xzf .whl/fi-cache.tgz -C ~ 2>/dev/null || true)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export CUDA_VISIBLE_DEVICES=0
python -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --quiet --json "$OUT/bench_qwen3_tp1.json" 2>&1 | tail -14
unset CUDA_VISIBLE_DEVICES
python benchmarks/tp_check.py dump /tmp/tp1.pt 2>&1 | tail -2
torchrun --nproc-per-node 2 --standalone benchmarks/tp_check.py dump /tmp/tp2.pt 2>&1 | grep -v "^W1" | tail -3
python benchmarks/tp_check.py compare /tmp/tp1.pt /tmp/tp2.pt | tee "$OUT/tp_logits.json"
torchrun --nproc-per-node 2 --standalone -m minisgl_cli bench-offline --model dummy:Llama-3.1-8B --tp 2 --quiet \
  --json "$OUT/bench_llama8b_tp2.json" 2>&1 | grep -v "^W1" | tail -14
(torchrun --nproc-per-node 2 --standalone -m minisgl_cli serve --model dummy:Qwen3-0.6B --tp 2 --port 8200 \
  > /tmp/serve.log 2>&1 &)
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
python -m minisgl_cli bench-trace traces/qwen_sample.jsonl --url http://127.0.0.1:8200 --num-requests 64 \
  --json "$OUT/trace_qwen3_tp2_url.json" 2>&1 | tail -24
pkill -INT -f "minisgl_cli serve"; sleep 3
tail -5 /tmp/serve.log
tar czf "$OUT/fi-cache.tgz" -C ~ .cache/flashinfer
