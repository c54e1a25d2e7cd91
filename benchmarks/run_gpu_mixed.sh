#!/usr/bin/env bash
# Mixed batches on one GPU, one machine session: GPU tests, then the saturating trace replay (1000 requests of
# qwen_1000 at 5x pace, dummy Qwen3-0.6B, in-process) and bench-offline, each with mixed batches on and off.
# Usage there: source .whl/use-bundle.sh && COMMIT=<sha> bash benchmarks/run_gpu_mixed.sh   (figures land in $OUT)
set -u
bash benchmarks/fi_cache.sh restore
c=${COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)" | tee -a "$OUT/gpu.txt"

timeout 240 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "not tp2" 2>&1 | tail -n 15 | tee "$OUT/pytest_gpu_$c.txt"

replay() {  # name, extra flags
  timeout 170 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl --model dummy:Qwen3-0.6B --time-scale 0.2 \
    --quiet --json "$OUT/trace_$1_$c.json" "${@:2}" > "$OUT/trace_$1.log" 2>&1 || echo "replay $1 failed: $?"
}
replay mixed --mixed-batch
replay nomixed --no-mixed-batch
replay mixed2048 --mixed-batch --max-batch-tokens 2048
for m in mixed nomixed; do
  flag=$([ $m = nomixed ] && echo --no-mixed-batch || echo --mixed-batch)
  timeout 120 python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --runs 2 $flag \
    --json "$OUT/offline_${m}_$c.json" > "$OUT/offline_$m.log" 2>&1 || echo "offline $m failed: $?"
done
bash benchmarks/fi_cache.sh save "$OUT"
python - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
print(f"{'run':28} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'TBT p50':>8} {'TBT p99':>8} {'hit':>6} {'mixed':>6}")
for f in sorted(glob.glob(f"{out}/trace_*.json")):
    r = json.load(open(f))
    print(f"{os.path.basename(f):28} {r['output_throughput']:8.0f} {r['median_ttft_ms']:9.0f} {r['p99_ttft_ms']:9.0f} "
          f"{r['median_itl_ms']:8.1f} {r['p99_itl_ms']:8.1f} {r['cache_hit_rate'] or 0:6.1%} {r.get('mixed_step_share', 0):6.0%}")
for f in sorted(glob.glob(f"{out}/offline_*.json")):
    r = json.load(open(f))
    print(os.path.basename(f), {k: v for k, v in r.items() if "throughput" in k or k in ("runs", "output_tokens")})
EOF
