#!/usr/bin/env bash
# Issue #15's saturating replay in-process (bench-trace traces/qwen_1000.jsonl --time-scale 0.2, dummy Qwen3-0.6B,
# one GPU) per mode, with the engine's step log, then benchmarks/step_log_summary.py over all of them.
# Usage there: source .whl/use-bundle.sh && MODES="nomixed mixed b2048=--max-batch-tokens,2048" bash <this>
# Modes: nomixed, mixed (the default), or NAME=FLAG,FLAG,...; a mode ending in "-nogc" runs with Python's GC off,
# one ending in "-swi" with a 0.5 ms thread switch interval (Python's default: 5 ms).
# TIME_SCALE (default 0.2) sets the pace; TAG names the results: $OUT/trace_steps$TAG.tgz (+ step_summary$TAG.txt).
set -u
(tar xzf .whl/fi-cache.tgz -C ~ 2>/dev/null || true)
d="$OUT/trace_steps${TAG:-}"
mkdir -p "$d"
for mode in ${MODES:-nomixed mixed}; do
  case $mode in
    nomixed*) flags="--no-mixed-batch" ;;
    mixed*) flags="" ;;
    *=*) flags="${mode#*=}"; flags="${flags//,/ }"; mode="${mode%%=*}" ;;
  esac
  py="python -m minisgl_cli"
  case $mode in
    *-nogc) py="python -c 'import gc; gc.disable(); from minisgl_cli.app import main; main()'" ;;
    # the interpreter hands its lock to a waiting thread every 0.5 ms instead of 5: if the engine thread's launches
    # wait on the replay client for the lock, their tail shrinks
    *-swi) py="python -c 'import sys; sys.setswitchinterval(5e-4); from minisgl_cli.app import main; main()'" ;;
  esac
  eval timeout 200 $py bench-trace traces/qwen_1000.jsonl --model dummy:Qwen3-0.6B --time-scale "${TIME_SCALE:-0.2}" \
    --quiet $flags --json "$d/trace_$mode.json" --step-log "$d/steps_$mode.jsonl" > "$d/log_$mode.txt" 2>&1
  python benchmarks/trace_line.py "$d/trace_$mode.json" "$mode"
done
python benchmarks/step_log_summary.py "$d"/steps_*.jsonl --json "$d/step_summary.json" | tee "$d/step_summary.txt"
gzip -f "$d"/steps_*.jsonl
tar czf "$d.tgz" -C "$OUT" "$(basename "$d")" && cp "$d/step_summary.txt" "$OUT/step_summary${TAG:-}.txt" && rm -rf "$d"
