#!/bin/bash
# A/B in one machine: the fused q/k/rope/KV kernel letting the attention launch early (MINISGL_QKV_PDL=1) or not
rm -rf /tmp/site
source .whl/use-bundle.sh > /dev/null 2>&1
python -m pytest -q tests/test_gpu.py -x -k "graph or overlap or fused" 2>&1 | tail -2
for i in 1 2 3; do for v in 0 1; do
  MINISGL_QKV_PDL=$v timeout 200 python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --runs 3 --quiet --json $OUT/pdl$v-$i.json > $OUT/pdl$v-$i.log 2>&1
  python -c "import json; r=json.load(open('$OUT/pdl$v-$i.json')); print('PDL=$v round $i', round(r['output_throughput']), [round(x['output_throughput']) for x in r['runs']], 'busy', round(r['gpu_busy'], 3))"
done; done
