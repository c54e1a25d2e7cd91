#!/usr/bin/env bash
# A prefill or mixed batch's attention in parts (kernels/attention/flashinfer_backend.py, batch_parts) on a machine
# with 4 GPUs, in one call:
#   GPU 0: benchmarks/mixed_attention.py (per-layer kernel choices), then tests/test_gpu.py (not tp2, not fa_);
#   GPUs 1-3, side by side once the kernels are built: issue #15's saturating replay (run_gpu_trace_steps.sh), one
#   mode each: mixed (the parts), mixed-onepass (one paged fa2 pass, as before), nomixed (prefill first).
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_mixed_parts.sh   -> $OUT/mixed_parts.tgz
set -u
bash benchmarks/fi_cache.sh restore
d="$OUT/mixed_parts"; mkdir -p "$d"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$d/gpus.txt"
CUDA_VISIBLE_DEVICES=0 timeout 300 python benchmarks/mixed_attention.py "$d/mixed_attention.json" > "$d/mixed_attention.txt" 2>&1
pids=()
for i in 1 2 3; do
  mode=$(echo "mixed mixed-onepass nomixed" | cut -d' ' -f$i)
  CUDA_VISIBLE_DEVICES=$i OUT="$d" MODES=$mode TAG="_$mode" bash benchmarks/run_gpu_trace_steps.sh > "$d/replay_$mode.txt" 2>&1 &
  pids+=($!)
done
CUDA_VISIBLE_DEVICES=0 timeout 330 python -m pytest -q tests/test_gpu.py -k "not tp2 and not fa_" > "$d/pytest_gpu.txt" 2>&1
wait "${pids[@]}"
tar czf "$OUT/mixed_parts.tgz" -C "$OUT" mixed_parts
grep -h "tok/s" "$d"/replay_*.txt; tail -1 "$d/pytest_gpu.txt"; grep -A9 "prefix 10000\|16 x 16 after\|16 x 128 after" "$d/mixed_attention.txt" | head -60
