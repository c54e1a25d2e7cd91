#!/usr/bin/env bash
# Piecewise graphs under tensor parallelism on two GPUs (dummy Qwen3-0.6B): the 2-GPU tests, TP=2 logits against
# TP=1 (benchmarks/tp_check.py, both with the pieces), and issue #15's replay at TP=2 with the pieces on and off
# (--piecewise-graph-tokens 0: every prefill and mixed step launched eagerly, as before), $NUM requests (default 400).
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_tp2_pieces.sh   Results: $OUT/tp2_pieces.tgz
# (one archive: the device returns only a few files per call)
set -u
bash benchmarks/fi_cache.sh restore
d="$OUT/tp2_pieces"; mkdir -p "$d"
timeout 300 python -m pytest -q tests/test_gpu.py -k tp2 -p no:cacheprovider 2>&1 | tail -3 | tee "$d/pytest_tp2.txt"
python benchmarks/tp_check.py dump "$d/tp1.pt" > "$d/tp_check.log" 2>&1
torchrun --nproc-per-node 2 --standalone benchmarks/tp_check.py dump "$d/tp2.pt" >> "$d/tp_check.log" 2>&1
python benchmarks/tp_check.py compare "$d/tp1.pt" "$d/tp2.pt" | tee "$d/tp_check.json"
rm -f "$d"/tp*.pt
for i in 1 2; do  # each way twice: the machines are noisy
  for mode in pieces eager; do
    flags=""; [ "$mode" = eager ] && flags="--piecewise-graph-tokens 0"
    timeout 240 torchrun --nproc-per-node 2 --standalone -m minisgl_cli bench-trace traces/qwen_1000.jsonl \
      --model dummy:Qwen3-0.6B --tp 2 --num-requests "${NUM:-400}" --time-scale "${TIME_SCALE:-0.2}" --quiet $flags \
      --json "$d/trace_${mode}_$i.json" > "$d/log_${mode}_$i.txt" 2>&1
    python benchmarks/trace_line.py "$d/trace_${mode}_$i.json" "$mode"
  done
done
tar czf "$OUT/tp2_pieces.tgz" -C "$OUT" tp2_pieces && rm -rf "$d"
