#!/usr/bin/env bash
# A/B in one machine session, issue #15's in-process replay (bench-trace traces/qwen_1000.jsonl --time-scale 0.2,
# dummy Qwen3-0.6B): the replay client receiving every token (--token-stream: one wake-up of its event loop per token
# and request, on the engine's interpreter lock) or each request's finished output (--no-token-stream). Token times
# are the engine's either way. Order: ORDER (default "stream final final stream"). Usage there:
#   source .whl/use-bundle.sh && bash benchmarks/run_gpu_token_stream_ab.sh
# Results: $OUT/token_stream_ab.txt (+ step-log summary) and $OUT/token_stream_ab.tgz.
set -u
bash benchmarks/fi_cache.sh restore
d="$OUT/token_stream_ab"
mkdir -p "$d"
i=0
for mode in ${ORDER:-stream final final stream}; do
  i=$((i + 1))
  flag=--token-stream
  [ "$mode" = final ] && flag=--no-token-stream
  timeout 250 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl --model dummy:Qwen3-0.6B --time-scale 0.2 --quiet \
    $flag ${FLAGS:-} --json "$d/trace_${i}_$mode.json" --step-log "$d/steps_${i}_$mode.jsonl" > "$d/log_${i}_$mode.txt" 2>&1
  python benchmarks/trace_line.py "$d/trace_${i}_$mode.json" "$i $mode" | tee -a "$OUT/token_stream_ab.txt"
done
python benchmarks/step_log_summary.py "$d"/steps_*.jsonl >> "$OUT/token_stream_ab.txt"
gzip -f "$d"/steps_*.jsonl
tar czf "$OUT/token_stream_ab.tgz" -C "$OUT" token_stream_ab && rm -rf "$d"
