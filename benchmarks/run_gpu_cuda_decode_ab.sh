#!/usr/bin/env bash
# Issue #17: the engine's bf16 decode through its CUDA kernel (kernels/attention/cuda_decode.py) against FlashInfer's
# tensor-core decode, end to end on the offline workload: `bench-offline --model dummy:Qwen3-0.6B --runs 3` in its own
# process per arm, MINISGL_CUDA_DECODE=1 / 0, ${ROUNDS:-2} rounds in alternating order (the machine is shared and
# noisy: compare within a round). Then, with PROFILE=1, benchmarks/step_profile.py --kernels on both (kernel time by
# category: where the milliseconds went).
# Usage there: source .whl/use-bundle.sh && MINISGL_COMMIT=<commit> bash benchmarks/run_gpu_cuda_decode_ab.sh
# The CUDA decode's library may be built here and carried xz-compressed in .whl/cudaxz (run_gpu_cuda_decode.sh says
# how); without it the first engine start builds it (nvcc, ~5-10 s).
set -u
c=${MINISGL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p ~/.cache/minisgl/cuda
for f in .whl/cudaxz/*.xz; do [ -f "$f" ] && xz -dc "$f" > ~/.cache/minisgl/cuda/"$(basename "$f" .xz)"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
arms=(cuda fi)
for r in $(seq "${ROUNDS:-2}"); do
  order=("${arms[@]}"); [ $((r % 2)) -eq 0 ] && order=(fi cuda)
  for arm in "${order[@]}"; do
    flag=1; [ "$arm" = fi ] && flag=0
    MINISGL_CUDA_DECODE=$flag timeout 300 python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --runs 3 \
      --json "$OUT/offline_${arm}_r${r}_$c.json" > "$OUT/offline_${arm}_r${r}_$c.log" 2>&1
    echo "round $r $arm: rc=$? $(python -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['output_throughput']), [round(x['output_throughput']) for x in d['runs']], 'startup', round(d['startup_seconds'], 1))" "$OUT/offline_${arm}_r${r}_$c.json" 2>&1 | tail -1)"
  done
done
if [ "${PROFILE:-0}" = 1 ]; then
  timeout 400 python benchmarks/step_profile.py --kernels --variant base --variant fi-decode \
    --out "$OUT/step_profile_cuda_decode_$c.json" > "$OUT/step_profile_cuda_decode_$c.log" 2>&1
  echo "step_profile: rc=$?"; tail -n 60 "$OUT/step_profile_cuda_decode_$c.log"
fi
