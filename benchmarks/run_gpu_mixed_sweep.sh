#!/usr/bin/env bash
# Mixed batches vs prefill-first through `minisgl serve` (dummy Qwen3-0.6B, one GPU) at the loads where the rate
# sweep (docs/benchmarks.md) shows arriving prompts stalling running streams: 512-token prompts, 256 output tokens,
# Poisson at 48/64/96 req/s, 15 s each. One server per mode, same machine session; results in one tar in $OUT.
# Usage there: source .whl/use-bundle.sh && MODES="nomixed mixed mixed2048" bash benchmarks/run_gpu_mixed_sweep.sh
# Modes: nomixed (prefill-first), mixed (the default), mixed2048 (mixed, 2048-token budget), NAME=FLAG,FLAG,...
# (e.g. cap400k=--max-running-tokens,400000,--max-batch-tokens,2048), else $FLAGS. SWEEP=0 skips the rate sweep.
# (mixedalways / mixed with --mixed-backlog 2 in benchmarks/results/mixed_backlog_ab_h200_01ae9e1_*: commit 01ae9e1,
# a backlog rule since reverted; there "mixedalways" is today's mixed.)
# TRACE=1 also replays traces/qwen_1000.jsonl at 5x pace (--time-scale 0.2) against each server (the saturating load).
# STEPLOG=1: each server writes its engine's step log (serve --step-log) when stopped, summarized by
# benchmarks/step_log_summary.py (with SWEEP=0 TRACE=1: the replay's steps alone).
set -u
bash benchmarks/fi_cache.sh restore
mkdir -p "$OUT/mixed_sweep"
for mode in ${MODES:-nomixed mixed mixed2048}; do
  case $mode in
    nomixed) flags="--no-mixed-batch" ;;
    mixed) flags="--mixed-batch" ;;
    mixed2048) flags="--mixed-batch --max-batch-tokens 2048" ;;
    *=*) flags="${mode#*=}"; flags="${flags//,/ }"; mode="${mode%%=*}" ;;
    *) flags="${FLAGS:-}" ;;
  esac
  [ -n "${STEPLOG:-}" ] && flags="$flags --step-log $OUT/mixed_sweep/steps_$mode.jsonl"
  (timeout 300 python -m minisgl_cli serve --model dummy:Qwen3-0.6B --port 8200 $flags \
    > "$OUT/mixed_sweep/serve_$mode.log" 2>&1 &)
  for i in $(seq 1 180); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
  [ "${SWEEP:-1}" = 0 ] || timeout 200 python -m minisgl_cli bench-serve --url http://127.0.0.1:8200 --model dummy:Qwen3-0.6B \
    --input-len 512:512 --output-len 256:256 --rate ${RATES:-48,64,96} --duration 15 --num-requests 600 \
    --warmup 32 --slo ttft=500ms,tpot=25ms --quiet --no-client-check --label "$mode" \
    --json "$OUT/mixed_sweep/sweep_$mode.json" 2>&1 | tail -3
  if [ -n "${TRACE:-}" ]; then
    timeout 150 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl --url http://127.0.0.1:8200 \
      --model dummy:Qwen3-0.6B --time-scale 0.2 --quiet --json "$OUT/mixed_sweep/trace_$mode.json" 2>&1 | tail -2
    curl -s http://127.0.0.1:8200/metrics > "$OUT/mixed_sweep/metrics_$mode.txt"
  fi
  pkill -INT -f "minisgl_cli serve"
  for i in $(seq 1 60); do pgrep -f "minisgl_cli serve" >/dev/null || break; sleep 1; done
done
python - "$OUT/mixed_sweep" <<'PY'
import glob, json, os, sys
print(f"{'mode':10} {'load':9} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'ITL p50':>8} {'ITL p99':>8}")
for f in sorted(glob.glob(f"{sys.argv[1]}/sweep_*.json")):
    for r in json.load(open(f))["sweep"]:
        print(f"{os.path.basename(f)[6:-5]:10} {r['load']:9} {r['output_throughput']:7.0f} {r['median_ttft_ms']:9.1f} "
              f"{r['p99_ttft_ms']:9.1f} {r['median_tpot_ms']:9.2f} {r['median_itl_ms']:8.2f} {r['p99_itl_ms']:8.1f}")
for f in sorted(glob.glob(f"{sys.argv[1]}/trace_*.json")):
    r = json.load(open(f))
    print(f"{os.path.basename(f)[6:-5]:10} {'trace 5x':9} {r['output_throughput']:7.0f} {r['median_ttft_ms']:9.1f} "
          f"{r['p99_ttft_ms']:9.1f} {r['median_tpot_ms']:9.2f} {r['median_itl_ms']:8.2f} {r['p99_itl_ms']:8.1f}")
PY
if [ -n "${STEPLOG:-}" ]; then
  python benchmarks/step_log_summary.py "$OUT"/mixed_sweep/steps_*.jsonl | tee "$OUT/mixed_sweep/step_summary.txt"
  gzip -f "$OUT"/mixed_sweep/steps_*.jsonl
fi
tar czf "$OUT/mixed_sweep.tgz" -C "$OUT" mixed_sweep && rm -rf "$OUT/mixed_sweep"
