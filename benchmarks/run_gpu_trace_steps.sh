#!/usr/bin/env bash
# Issue #15's saturating replay in-process (bench-trace traces/qwen_1000.jsonl --time-scale 0.2, dummy Qwen3-0.6B,
# one GPU) per mode, with the engine's step log, then benchmarks/step_log_summary.py over all of them.
# Usage there: source .whl/use-bundle.sh && MODES="nomixed mixed b2048=--max-batch-tokens,2048" bash <this>
# Modes: nomixed, mixed (the default), or NAME=FLAG,FLAG,...; a mode ending in "-nogc" runs with Python's GC off,
# one ending in "-swi" with a 0.5 ms thread switch interval (Python's default: 5 ms), one ending in "-q1x" with
# CUDA_SCALE_LAUNCH_QUEUES=1x (CUDA's own launch queue size), "-q4x" with 4x, one ending in "-eagerload" with
# CUDA_MODULE_LOADING=EAGER (every kernel loaded when CUDA starts; the default loads each at its first launch), one
# ending in "-nowarm" without the engine's start-up pass of the LM head over every row count, one ending in
# "-fullgc" with the collector's automatic full passes while the engine loop runs (engine/gc_heap.py), one ending in
# "-onepass" with a prefill or mixed batch's decode rows and chunks in one paged fa2 pass, as before 2026-11-27 (the
# engine now attends in parts: kernels/attention/flashinfer_backend.py).
# "-split4" splits a mixed batch's decode rows off from a group of 4 query heads per KV head (SPLIT_MIN_GROUP, the
# engine's since the twenty-second session), "-group8" only from 8 (the engine's before).
# TIME_SCALE (default 0.2) sets the pace, MODEL (default dummy:Qwen3-0.6B) the model, NUM the first NUM requests (all
# by default); TAG names the results: $OUT/trace_steps$TAG.tgz (+ step_summary$TAG.txt).
set -u
bash benchmarks/fi_cache.sh restore
d="$OUT/trace_steps${TAG:-}"
mkdir -p "$d"
for mode in ${MODES:-nomixed mixed}; do
  case $mode in
    nomixed*) flags="--no-mixed-batch" ;;
    mixed*) flags="" ;;
    *=*) flags="${mode#*=}"; flags="${flags//,/ }"; mode="${mode%%=*}" ;;
  esac
  # A/B variants: a statement run before the CLI, or an environment variable CUDA reads when it starts
  pre="pass"; env=()
  case $mode in
    *-nogc) pre="import gc; gc.disable()" ;;
    # the interpreter hands its lock to a waiting thread every 0.5 ms instead of 5: if the engine thread's launches
    # wait on the replay client for the lock, their tail shrinks
    *-swi) pre="import sys; sys.setswitchinterval(5e-4)" ;;
    # the engine without its start-up pass of the LM head over every row count (engine/runner.py WARM_UP_LM_HEAD)
    *-nowarm) pre="import engine.runner as r; r.WARM_UP_LM_HEAD = False" ;;
    # automatic full collections while the loop runs, as before engine/gc_heap.py held them back
    *-fullgc) pre="import engine.gc_heap as g; g.FULL_COLLECTIONS_OFF = 10" ;;
    *-split4) pre="import kernels.attention.flashinfer_backend as f; f.SPLIT_MIN_GROUP = 4" ;;
    *-group8) pre="import kernels.attention.flashinfer_backend as f; f.SPLIT_MIN_GROUP = 8" ;;
    *-onepass) pre="import kernels.attention.flashinfer_backend as f; f.SPLIT_DECODE_ROWS = False; f.CHUNK_FA3_MIN_TOKENS = 10**9" ;;
    *-q[0-9]x) env=("CUDA_SCALE_LAUNCH_QUEUES=${mode##*-q}") ;;
    *-eagerload) env=(CUDA_MODULE_LOADING=EAGER) ;;
  esac
  timeout "${RUN_TIMEOUT:-200}" env ${env[@]+"${env[@]}"} python -c "$pre; from minisgl_cli.app import main; main()" bench-trace \
    traces/qwen_1000.jsonl --model "${MODEL:-dummy:Qwen3-0.6B}" --time-scale "${TIME_SCALE:-0.2}" --quiet $flags \
    ${NUM:+--num-requests "$NUM"} \
    --json "$d/trace_$mode.json" --step-log "$d/steps_$mode.jsonl" > "$d/log_$mode.txt" 2>&1
  python benchmarks/trace_line.py "$d/trace_$mode.json" "$mode"
done
python benchmarks/step_log_summary.py "$d"/steps_*.jsonl --json "$d/step_summary.json" | tee "$d/step_summary.txt"
gzip -f "$d"/steps_*.jsonl
tar czf "$d.tgz" -C "$OUT" "$(basename "$d")" && cp "$d/step_summary.txt" "$OUT/step_summary${TAG:-}.txt" && rm -rf "$d"
