#!/bin/bash
# torch's TunableOp (cuBLAS/cuBLASLt algorithms timed per GEMM shape) against the default heuristics
rm -rf /tmp/site
source .whl/use-bundle.sh > /dev/null 2>&1
B="python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --quiet"
show() { python -c "import json; r=json.load(open('$OUT/$1.json')); print('$1', round(r['output_throughput']), [round(x['output_throughput']) for x in r['runs']], 'busy', round(r['gpu_busy'], 3), 'startup', round(r['startup_seconds'], 1))" || tail -5 $OUT/$1.log; }
timeout 100 $B --runs 3 --json $OUT/base-0.json > $OUT/base-0.log 2>&1; show base-0
export PYTORCH_TUNABLEOP_FILENAME=/tmp/tun%d.csv PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS=5 PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS=10
t0=$SECONDS
PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=1 timeout 280 $B --runs 1 --json $OUT/tune.json > $OUT/tune.log 2>&1; echo "tuning run rc $? in $((SECONDS - t0)) s"; show tune
wc -l /tmp/tun0.csv; head -8 /tmp/tun0.csv; grep -c Default /tmp/tun0.csv; cp /tmp/tun0.csv $OUT/ 2>/dev/null
start=$SECONDS
for i in 1 2; do for v in tuned base; do
  [ $((SECONDS - start)) -gt 150 ] && break 2
  if [ $v = tuned ]; then e="PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=0"; else e="X=1"; fi
  env $e timeout 100 $B --runs 3 --json $OUT/$v-$i.json > $OUT/$v-$i.log 2>&1; show $v-$i
done; done
