#!/usr/bin/env bash
# Piecewise CUDA graphs for prefill and mixed steps (engine/piecewise_graph.py) on one GPU, against the eager forward.
# There, with .whl carried (device-bundle.tgz, use-bundle.sh, fi-cache.txz):
#   source .whl/use-bundle.sh && MINISGL_COMMIT=<commit> bash benchmarks/run_gpu_piecewise.sh tests steps ...
# Stages (in the order given):
#   tests    the piecewise tests, then the rest of tests/test_gpu.py's single-GPU tests (not tp2, not fa_)
#   steps    benchmarks/piecewise_steps.py: a lone prompt's first token and the running streams' step period while
#            prompts arrive, pieces on and off interleaved in one process
#   trace    bench-trace traces/qwen_1000.jsonl in-process at --time-scale ${SCALES:-1 0.2}, pieces on then off per scale
#   sync     benchmarks/launch_sync_check.py: which host calls of a decode or mixed step wait for queued GPU work
#            (under overlap such a call delays the previous step's tokens: the replay's step log suggests it)
#   offline  bench-offline --model dummy:Qwen3-0.6B --runs 3, pieces on, off, on
#   budgets  the saturating replay (--time-scale 0.2) with pieces at --max-batch-tokens ${BUDGETS:-2048 4096 8192}:
#            with a mixed step's host cost down to the pieces', smaller prefill chunks per step may now shorten
#            the inter-token tail without the output loss they cost when every mixed step launched eagerly
# Out: $OUT/*_<commit>.{json,log,txt} and summary_piecewise_<commit>.txt.
set -u
c=${MINISGL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
summary=$OUT/summary_piecewise_$c.txt
log() { echo "$@" | tee -a "$summary"; }
bash benchmarks/fi_cache.sh restore
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"
rc=0
replay() {  # replay NAME FLAGS...: issue #15's trace in-process, into trace_NAME_<commit>.{json,log}
  local name=$1; shift
  timeout 200 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl --model dummy:Qwen3-0.6B --quiet "$@" \
    --json "$OUT/trace_${name}_$c.json" > "$OUT/trace_${name}_$c.log" 2>&1
  local r=$?; log "trace $name: rc=$r"; [ $r -eq 0 ] || tail -n 5 "$OUT/trace_${name}_$c.log" | tee -a "$summary"
}
table() {  # table GLOB: one line per replay's JSON under $OUT
  python - "$OUT" "$1" <<'PY' | tee -a "$summary"
import glob, json, os, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/{sys.argv[2]}")):
    r = json.load(open(f))
    print(f"{os.path.basename(f):32} out {r['output_throughput']:7.0f} tok/s  TTFT p50 {r['median_ttft_ms']:7.1f} "
          f"p99 {r['p99_ttft_ms']:7.0f}  TBT p50 {r['median_itl_ms']:5.1f} p90 {r['p90_itl_ms']:5.1f} "
          f"p99 {r['p99_itl_ms']:5.1f} max {r['max_itl_ms']:6.1f}  mixed {r.get('mixed_step_share')}")
PY
}
for s in "$@"; do
  case $s in
    tests)
      timeout 300 python -m pytest -q -x tests/test_gpu.py -k piecewise > "$OUT/pytest_piecewise_$c.txt" 2>&1
      r=$?; log "tests piecewise: rc=$r"; tail -n 3 "$OUT/pytest_piecewise_$c.txt" | tee -a "$summary"; [ $r -eq 0 ] || rc=$r
      timeout 500 python -m pytest -q tests/test_gpu.py -k "not tp2 and not fa_ and not piecewise" \
        > "$OUT/pytest_gpu_$c.txt" 2>&1
      r=$?; log "tests rest: rc=$r"; tail -n 3 "$OUT/pytest_gpu_$c.txt" | tee -a "$summary"; [ $r -eq 0 ] || rc=$r
      ;;
    steps)
      timeout 400 python benchmarks/piecewise_steps.py ${STEPS_ARGS:-} --out "$OUT/piecewise_steps_$c.json" \
        > "$OUT/piecewise_steps_$c.log" 2>&1
      r=$?; log "steps: rc=$r"; grep -E "^running|^\{|Error" "$OUT/piecewise_steps_$c.log" | cut -c1-400 | tee -a "$summary"
      ;;
    trace)
      for scale in ${SCALES:-1 0.2}; do
        replay "${scale}_on" --time-scale "$scale"
        replay "${scale}_off" --time-scale "$scale" --piecewise-graph-tokens 0
      done
      table "trace_*_$c.json"
      ;;
    sync)
      timeout 300 python benchmarks/launch_sync_check.py --out "$OUT/launch_sync_$c.json" > "$OUT/launch_sync_$c.log" 2>&1
      r=$?; log "sync: rc=$r"; grep -E "^(pieces|eager)|Error" "$OUT/launch_sync_$c.log" | cut -c1-300 | tee -a "$summary"
      ;;
    budgets)
      for b in ${BUDGETS:-2048 4096 8192}; do replay "0.2_budget$b" --time-scale 0.2 --max-batch-tokens "$b"; done
      table "trace_0.2_budget*_$c.json"
      ;;
    offline)
      for mode in on off on; do
        flags=(); [ $mode = off ] && flags=(--piecewise-graph-tokens 0)
        timeout 200 python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --runs 3 --quiet "${flags[@]}" \
          --json "$OUT/offline_${mode}_$c.json" > "$OUT/offline_${mode}_$c.log" 2>&1
        r=$?; log "offline $mode: rc=$r"
        grep -E "output throughput|startup|Error" "$OUT/offline_${mode}_$c.log" | tail -n 4 | tee -a "$summary"
      done
      ;;
    *) log "unknown stage $s"; rc=2 ;;
  esac
done
bash benchmarks/fi_cache.sh save "$OUT"
exit $rc
