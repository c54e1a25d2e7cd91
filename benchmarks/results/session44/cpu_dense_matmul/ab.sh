#!/usr/bin/env bash
# A/B: dense fp32 SmolLM2 shapes on a CPU: this tree (C matmuls up to 16 rows, recorded decode steps) against a clone
# at 06a81b5 (C small ops, torch's matmuls, no recorded steps; PREV, its own .venv) and against this tree with
# MINISGL_CPU_OPS=0 (torch's ops throughout, as before 06a81b5). Rounds interleaved; JSON per run in this folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
new=$(cd "$here/../../../.." && pwd)
prev=${PREV:-/tmp/ci44}
run() {  # label tree env n round
  (cd "$2" && env $3 ./run.sh minisgl bench-offline --model dummy:SmolLM2-135M --device cpu --dtype float32 \
    --num-seqs "$4" --input-len 100:100 --output-len 64:64 --temperature 0 --runs 3 --quiet \
    --json "$here/r$5_$1_n$4.json" > /dev/null)
}
for round in 1 2 3; do
  for n in 1 16; do
    run new "$new" "MINISGL_CPU_OPS=1" $n $round
    run prev "$prev" "MINISGL_CPU_OPS=1" $n $round
    run off "$new" "MINISGL_CPU_OPS=0" $n $round
  done
done
