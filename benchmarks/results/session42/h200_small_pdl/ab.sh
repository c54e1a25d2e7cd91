#!/bin/bash
# A/B in one machine: base / the small Triton kernels PDL-launched (MINISGL_SMALL_PDL=1) / cuBLASLt preferred
rm -rf /tmp/site
source .whl/use-bundle.sh > /dev/null 2>&1
python -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
MINISGL_SMALL_PDL=1 python -m pytest -q tests/test_gpu.py -x -k "graph or overlap or fused" 2>&1 | tail -3
start=$SECONDS
for i in 1 2 3; do for v in base pdl lt; do
  [ $((SECONDS - start)) -gt 420 ] && break 2
  env=""; [ $v = pdl ] && env="MINISGL_SMALL_PDL=1"; [ $v = lt ] && env="TORCH_BLAS_PREFER_CUBLASLT=1"
  env $env timeout 100 python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --runs 3 --quiet --json $OUT/$v-$i.json > $OUT/$v-$i.log 2>&1
  python -c "import json; r=json.load(open('$OUT/$v-$i.json')); print('$v round $i', round(r['output_throughput']), [round(x['output_throughput']) for x in r['runs']], 'busy', round(r['gpu_busy'], 3))" || tail -5 $OUT/$v-$i.log
done; done
