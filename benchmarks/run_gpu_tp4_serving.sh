#!/usr/bin/env bash
# Issue #23 on 4xH200: dummy Qwen3-32B at TP=4, traces/qwen_1000.jsonl (1000 requests).
#   inproc: torchrun bench-trace --tp 4 in-process at each of $SCALES (default "1.0 0.5") for each of $MODES
#           (default "mixed nomixed"; a suffix -onepass runs a prefill or mixed batch's attention in one paged fa2
#           pass, as before 2026-11-27), with the engine's step log (TBT p99 against the median decode step);
#   serve:  torchrun ... serve --tp 4, then bench-trace --url at $SCALES, then SIGINT and a check that every rank
#           exited (no process left behind).
# One replay at the recorded pace takes ~3 min plus ~1 min of start-up, so split the work over calls (10 min each):
#   source .whl/use-bundle.sh && STAGE=inproc SCALES=1.0 bash benchmarks/run_gpu_tp4_serving.sh
#   source .whl/use-bundle.sh && STAGE=inproc SCALES=0.5 bash benchmarks/run_gpu_tp4_serving.sh
#   source .whl/use-bundle.sh && STAGE=serve SCALES=1.0 bash benchmarks/run_gpu_tp4_serving.sh
# Results: $OUT/tp4_<stage>.tgz (JSON, step logs, logs) and $OUT/tp4_summary.txt. TP=2 for a rehearsal on 2xH200;
# on a CPU: TP=2 MODEL=dummy:tiny-llama EXTRA="--device cpu" NUM=20 SCALES=0.01 OUT=/tmp/o bash <this>.
set -u
bash benchmarks/fi_cache.sh restore
TP=${TP:-4}
d="$OUT/tp4"; mkdir -p "$d"
MODEL=${MODEL:-dummy:Qwen3-32B}
trace=(traces/qwen_1000.jsonl --model "$MODEL" --num-requests "${NUM:-1000}" --quiet)
summary() {  # JSON [step log] -> one line
  python - "$@" <<'PY'
import json, sys, gzip, statistics as st
r = json.load(open(sys.argv[1]))
line = (f"{sys.argv[3]:28} out {r['output_throughput']:7.0f} tok/s  TTFT p50/p90/p99 {r['median_ttft_ms']:6.0f} "
        f"{r['p90_ttft_ms']:6.0f} {r['p99_ttft_ms']:6.0f} ms  TBT p50/p99/max {r['median_itl_ms']:5.1f} {r['p99_itl_ms']:5.1f} "
        f"{r['max_itl_ms']:6.1f} ms  hit {r['cache_hit_rate']:.3f} (bound {r['trace_cache_hit_upper_bound']:.3f})")
if sys.argv[2] != "-":
    s = [json.loads(x) for x in open(sys.argv[2])]
    gaps = [(b["t"] - a["t"]) * 1e3 for a, b in zip(s, s[1:]) if b["prefill_rows"] == 0 and a["prefill_rows"] == 0]
    if gaps:
        med = st.median(gaps)
        line += f"  decode step p50 {med:.1f} ms, TBT p99 = {r['p99_itl_ms'] / med:.1f}x it"
print(line)
PY
}
case ${STAGE:-inproc} in
  inproc)
    for scale in ${SCALES:-1.0 0.5}; do
      for mode in ${MODES:-mixed nomixed}; do
        flags=""; [ "${mode%%-*}" = nomixed ] && flags="--no-mixed-batch"
        pre="pass"  # mode suffix -onepass: decode rows and chunks in one paged fa2 pass (as run_gpu_trace_steps.sh)
        [ "${mode##*-}" = onepass ] && pre="import kernels.attention.flashinfer_backend as f; f.SPLIT_DECODE_ROWS = False; f.CHUNK_FA3_MIN_TOKENS = 10**9"
        name="inproc_${mode}_x${scale}"
        timeout "${RUN_TIMEOUT:-560}" torchrun --nproc-per-node "$TP" --standalone --no-python python -c \
          "$pre; from minisgl_cli.app import main; main()" bench-trace "${trace[@]}" --tp "$TP" \
          --time-scale "$scale" $flags ${EXTRA:-} --json "$d/$name.json" --step-log "$d/steps_$name.jsonl" > "$d/$name.log" 2>&1
        summary "$d/$name.json" "$d/steps_$name.jsonl" "$name" | tee -a "$OUT/tp4_summary.txt"
        pgrep -f "minisgl_cli bench-trace" > /dev/null && echo "LEFT BEHIND after $name: $(pgrep -fa minisgl_cli)"
      done
    done ;;
  serve)
    torchrun --nproc-per-node "$TP" --standalone -m minisgl_cli serve --model "$MODEL" --tp "$TP" \
      --port 8300 ${EXTRA:-} > "$d/serve.log" 2>&1 &
    for i in $(seq 1 240); do curl -sf http://127.0.0.1:8300/health > /dev/null && break; sleep 1; done
    for scale in ${SCALES:-1.0}; do
      name="serve_x${scale}"
      timeout 400 python -m minisgl_cli bench-trace "${trace[@]}" --url http://127.0.0.1:8300 --time-scale "$scale" \
        --json "$d/$name.json" > "$d/$name.log" 2>&1
      summary "$d/$name.json" - "$name" | tee -a "$OUT/tp4_summary.txt"
    done
    pkill -INT -f "minisgl_cli serve"
    for i in $(seq 1 60); do pgrep -f "minisgl_cli serve" > /dev/null || break; sleep 1; done
    left=$(pgrep -fa "minisgl_cli serve" | wc -l)
    echo "serve processes left 60 s after SIGINT: $left" | tee -a "$OUT/tp4_summary.txt" ;;
esac
gzip -f "$d"/steps_*.jsonl 2>/dev/null
tar czf "$OUT/tp4_${STAGE:-inproc}.tgz" -C "$OUT" tp4 && rm -rf "$d"
