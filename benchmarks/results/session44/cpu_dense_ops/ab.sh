#!/usr/bin/env bash
# A/B: a dense fp32 model on a CPU with the C small ops (default) against without (MINISGL_CPU_OPS=0, the behaviour
# before this change for any model that is not a GGUF). Rounds interleaved; results in this folder's JSON files.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
out=benchmarks/results/session44/cpu_dense_ops
for round in 1 2 3; do
  for ops in 1 0; do
    for n in 1 16; do
      MINISGL_CPU_OPS=$ops ./run.sh minisgl bench-offline --model dummy:SmolLM2-135M --device cpu --dtype float32 \
        --num-seqs $n --input-len 100:100 --output-len 64:64 --temperature 0 --runs 3 --quiet \
        --json $out/r${round}_ops${ops}_n${n}.json > /dev/null
      python3 -c "import json,sys; d=json.load(open('$out/r${round}_ops${ops}_n${n}.json')); m=d.get('minisgl',d); print('round $round ops=$ops n=$n', {k:v for k,v in m.items() if 'tok' in k and not isinstance(v,(list,dict))})"
    done
  done
done
