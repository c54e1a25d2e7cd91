#!/usr/bin/env bash
# Issue #17, vLLM side by side: `bench-offline --compare vllm` on one GPU, minisgl and vLLM 0.26.0 on the identical
# workload (nano-vllm's, 133,966 output tokens) in one run, one table and one JSON per model.
#
# A call carries at most 64 MiB, and the tracked tree is now ~25 MB (benchmarks/results/ grew). So vLLM travels in
# three ~28 MiB parts: build them here, once, with `PART_MIB=28 ../shared/gpu/peers/make-vllm-parts.sh`
# (../shared/gpu/peers/README.md; its default of 40 MiB no longer fits beside the tree). The project's bundle must
# hold serve's packages, since bench-offline's CLI imports them, and hypothesis for the tests stage's GPU fuzz:
# `../shared/gpu/make-bundle.sh pyzmq msgpack uvloop httptools hypothesis sortedcontainers` (~36 MB). No call can carry a part and the bundle, so the bundle is unpacked (to /tmp/site) in a call of
# its own BEFORE the parts; then the call that brings the last part runs both engines in one command. The machine
# keeps /tmp/site and /root only while it stays warm: send the calls one right after the other.
#
# The run() calls (kind nvidia-h100-x1 or nvidia-h200; figures from the two are not comparable):
#   0. carry [".whl/device-bundle.txz", ".whl/use-bundle.sh", ".whl/fi-cache.txz"] (benchmarks/pack_bundle.sh makes
#      the xz bundle, small enough for the JIT cache to travel beside it; with make-bundle.sh's .tgz the cache does
#      not fit, and FlashInfer JIT-builds its modules: ~1-2 min of the engine's start-up, ~5 min of the tests)
#      command: rm -rf /tmp/site; bash benchmarks/run_gpu_vllm_compare.sh bundle [tests]
#      (~15 s; tests ~2 min with the cache, 8+ without; they leave the cache they built in $OUT/fi-cache.txz)
#   1. carry [".whl/vllm/p00"]
#      command: bash benchmarks/run_gpu_vllm_compare.sh assemble                 (exit 0: "have 1/3 vllm parts")
#   2. carry [".whl/vllm/p01"]
#      command: bash benchmarks/run_gpu_vllm_compare.sh assemble                 (exit 0: "have 2/3 vllm parts")
#   3. carry [".whl/vllm/p02", ".whl/fi-cache.txz"] (the last part is the smallest: the JIT cache fits beside it;
#      without it, drop `ficache`), timeout_s 600
#      command: bash benchmarks/run_gpu_vllm_compare.sh assemble ficache qwen   (unpack ~10 s, then Qwen3-0.6B)
#   4. no carry, timeout_s 600
#      command: bash benchmarks/run_gpu_vllm_compare.sh llama                              (Llama-3.1-8B, ~7 min)
# A stage that finds something missing says which call to send again (the machine may have been replaced).
# The tree there may carry a stale .git: prefix the commands with MINISGL_COMMIT=<this commit> to name the results.
# `timeout` ends a bench stage's whole process group (vLLM's child and its engine core too) if it runs over.
#
# Stages (several per call, in the order given):
#   bundle    unpack the project's bundle (FlashInfer) into /tmp/site, restore FlashInfer's JIT cache (and import
#             .whl/cache.tgz if carried)
#   ficache   restore FlashInfer's JIT cache from a carried .whl/fi-cache.txz (from an earlier run on a GPU of the same
#             architecture), so that the engine's start-up skips the JIT builds
#   assemble  store the carried vLLM part(s) (.whl/vllm/pNN); once both are there, unpack to /root/vllm-site and
#             check that vLLM imports under vllm-env.sh (else probe-vllm.py's report goes to $OUT)
#   qwen      bench-offline --model dummy:Qwen3-0.6B --runs ${RUNS:-3} --compare vllm (plus ${EXTRA} flags, e.g.
#             EXTRA="--kv-cache-dtype fp8": vLLM gets the same KV dtype)
#   qwen-fp8  the same with --kv-cache-dtype fp8 on both engines
#   llama     bench-offline --model dummy:Llama-3.1-8B --runs ${RUNS:-3} --compare vllm
#   tests     (after bundle) the single-GPU tests (tests/test_gpu.py and test_llm_api.py's GPU cases, not tp2, not
#             fa_) and sampler_rng.py
#   ab_budget (after bundle) offline_wall.py --ab-budget ${BUDGETS:-8192,16384}: bench-offline's run under each
#             per-step token budget, interleaved, ${AB_RUNS:-6} runs each
#   trace     issue #15's saturating replay (bench-trace traces/qwen_1000.jsonl --time-scale 0.2, dummy Qwen3-0.6B)
#             in-process, one run per name in ${TRACE_RUNS:-minisgl vllm minisgl-run1024}: minisgl; vLLM's AsyncLLM
#             (`--engine vllm`, under vllm-env.sh); minisgl admitting up to 1024 requests as vLLM's server does
#             (minisgl-run1024); vLLM admitting 256 as minisgl does (vllm-seqs256)
#   peer_check bench-offline --engine vllm on 32 prompts with --vllm-arg max_num_seqs=64, with and without --quiet;
#             bench-trace --engine vllm --quiet on 16 requests of traces/qwen_sample.jsonl
# Each bench stage: vLLM first, in a child process under /root/vllm-site/vllm-env.sh (no FlashInfer of ours on its
# path), then minisgl in the parent with /tmp/site. Out: $OUT/bench_offline_vllm_<model>_<commit>.json (minisgl at
# the top level, vLLM under `peers`), its log, summary_vllm_<commit>.txt, and fi-cache.txz (keep it in .whl/).
set -u
stages=("$@")
[ ${#stages[@]} -eq 0 ] && { sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2; }
c=${MINISGL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export MINISGL_COMMIT=$c
summary=$OUT/summary_vllm_$c.txt
log() { echo "$@" | tee -a "$summary"; }
vllm_env=/root/vllm-site/vllm-env.sh
rc=0

bench() {  # bench MODEL TAG
  if [ ! -f /tmp/site/.unpacked ]; then
    log "$2: no /tmp/site (the machine was replaced?): send calls 0 to 3 again"; rc=1; return
  fi
  if [ ! -f "$vllm_env" ]; then
    log "$2: no vLLM at /root/vllm-site: send calls 1 to 3 (the three parts) again"; rc=1; return
  fi
  local json=$OUT/bench_offline_vllm_${2}_$c.json t0=$(date +%s)
  PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 timeout 570 python -m minisgl_cli bench-offline --model "$1" \
    --runs "${RUNS:-3}" --compare vllm --vllm-env "$vllm_env" ${EXTRA:-} --quiet --json "$json" \
    > "$OUT/bench_offline_vllm_$2.log" 2>&1
  local r=$?
  log "$2: rc=$r in $(($(date +%s) - t0)) s"
  [ $r -eq 0 ] || { rc=$r; tail -n 40 "$OUT/bench_offline_vllm_$2.log" | tee -a "$summary"; }
  grep -E "^ *[┃│]|settings|output throughput|Error|error" "$OUT/bench_offline_vllm_$2.log" | tail -n 24 | tee -a "$summary"
  bash benchmarks/fi_cache.sh save "$OUT"
}

for s in "${stages[@]}"; do
  case $s in
    bundle)
      [ -f .whl/device-bundle.txz ] || [ -f .whl/device-bundle.tgz ] || {
        log "bundle: carry .whl/device-bundle.txz (benchmarks/pack_bundle.sh) and .whl/use-bundle.sh"; exit 1; }
      source .whl/use-bundle.sh  # (pack_bundle.sh's also restores a carried fi-cache.txz; else the ficache stage)
      [ -f .whl/cache.tgz ] && python -m minisgl_cli cache import .whl/cache.tgz 2>&1 | tail -n 1
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"
      python -c "import torch, flashinfer as f; print('torch', torch.__version__, 'flashinfer', f.__version__)" \
        2>&1 | tee -a "$summary"
      ;;
    ficache)
      [ -f .whl/fi-cache.txz ] || { log "ficache: carry .whl/fi-cache.txz"; exit 1; }
      bash benchmarks/fi_cache.sh restore; log "ficache: $(find ~/.cache/flashinfer -name '*.so' | wc -l) modules"
      ;;
    assemble)
      parts=(.whl/vllm/p*/)
      [ -d "${parts[0]}" ] || { log "assemble: carry .whl/vllm/p00 (call 1) or .whl/vllm/p01 (call 2)"; exit 1; }
      for d in "${parts[@]}"; do bash "$d/assemble-vllm.sh" 2>&1 | tee -a "$summary"; a=${PIPESTATUS[0]}; done
      if [ "$a" = 3 ]; then log "assemble: part stored; send the other part in the next call"; continue; fi
      [ "$a" = 0 ] || { log "assemble: failed (exit $a)"; exit 1; }
      # shellcheck disable=SC1090
      if ! (source "$vllm_env" && python -c "import vllm; print('vllm', vllm.__version__, 'imports')") 2>&1 \
          | tail -n 3 | tee -a "$summary" | grep -q imports; then
        (source "$vllm_env" && python /root/vllm-site/probe-vllm.py) > "$OUT/vllm_probe.log" 2>&1
        log "assemble: vLLM does not import: see vllm_probe.txt / vllm_probe.log in \$OUT"; exit 1
      fi
      ;;
    tests)
      PYTHONPATH=/tmp/site:$PWD timeout 500 python -m pytest -q -p no:cacheprovider tests/test_gpu.py \
        tests/test_llm_api.py tests/test_fuzz_engine.py -m gpu -k "not tp2 and not fa_" > "$OUT/pytest_gpu_$c.txt" 2>&1
      log "tests: rc=$?"; tail -n 3 "$OUT/pytest_gpu_$c.txt" | tee -a "$summary"
      PYTHONPATH=/tmp/site:$PWD timeout 60 python benchmarks/sampler_rng.py > "$OUT/sampler_rng_$c.txt" 2>&1
      log "sampler_rng: rc=$?"; tail -n 6 "$OUT/sampler_rng_$c.txt" | tee -a "$summary"
      bash benchmarks/fi_cache.sh save "$OUT"  # the modules the tests built
      ;;
    ab_budget)
      PYTHONPATH=/tmp/site:$PWD timeout 400 python benchmarks/offline_wall.py --ab-budget "${BUDGETS:-8192,16384}" \
        --runs "${AB_RUNS:-6}" --no-profiles --out "$OUT/ab_budget_$c.json" > "$OUT/ab_budget_$c.log" 2>&1
      log "ab_budget: rc=$?"; grep -E "^budget|^\{" "$OUT/ab_budget_$c.log" | cut -c1-160 | tee -a "$summary"
      ;;
    trace)
      T=(traces/qwen_1000.jsonl --model dummy:Qwen3-0.6B --time-scale 0.2 --quiet)
      runs=(${TRACE_RUNS:-minisgl vllm minisgl-run1024})
      for run in "${runs[@]}"; do
        case $run in
          minisgl) flags=() ;;
          minisgl-run1024) flags=(--max-running-requests 1024) ;;  # as many as vLLM's server admits
          vllm) flags=(--engine vllm) ;;
          vllm-seqs256) flags=(--engine vllm --vllm-arg max_num_seqs=256) ;;  # as many as minisgl admits
          *) log "trace: unknown run $run"; continue ;;
        esac
        if [ "${run%%-*}" = vllm ]; then
          # shellcheck disable=SC1090
          (source "$vllm_env" && timeout 400 python -m minisgl_cli bench-trace "${T[@]}" "${flags[@]}" \
            --json "$OUT/trace_${run}_$c.json") > "$OUT/trace_${run}_$c.log" 2>&1
        else
          PYTHONPATH=/tmp/site:$PWD timeout 200 python -m minisgl_cli bench-trace "${T[@]}" "${flags[@]}" \
            --json "$OUT/trace_${run}_$c.json" > "$OUT/trace_${run}_$c.log" 2>&1
        fi
        r=$?; log "trace $run: rc=$r"; [ $r -eq 0 ] || tail -n 5 "$OUT/trace_${run}_$c.log" | tee -a "$summary"
      done
      python - "$OUT" "$c" "${runs[@]}" <<'PY' | tee -a "$summary"
import json, sys
for name in sys.argv[3:]:
    try:
        r = json.load(open(f"{sys.argv[1]}/trace_{name}_{sys.argv[2]}.json"))
    except OSError:
        print(name, "no result"); continue
    print(f"{name:15} done {r['completed']} failed {r['failed']} out {r['output_throughput']:7.0f} tok/s  TTFT p50 "
          f"{r['median_ttft_ms']:7.0f} p99 {r['p99_ttft_ms']:7.0f}  TBT p50 {r['median_itl_ms']:5.1f} p90 "
          f"{r['p90_itl_ms']:5.1f} p99 {r['p99_itl_ms']:5.1f} max {r['max_itl_ms']:6.0f} ms  hit "
          f"{r['cache_hit_rate'] or 0:.1%}  pool {r.get('kv_pool_tokens')}  {r.get('settings', '')}")
PY
      ;;
    peer_check)  # the offline vLLM peer on a small workload, with an engine-argument override; --quiet hides vLLM's
      # load and graph-capture bars (its use_tqdm_on_load): counted in the log, against a run without --quiet
      for q in quiet loud; do
        qflag=(--quiet); [ $q = loud ] && qflag=()
        # shellcheck disable=SC1090
        (source "$vllm_env" && timeout 300 python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --engine vllm \
          --num-seqs 32 --runs 1 --vllm-arg max_num_seqs=64 "${qflag[@]}" --json "$OUT/peer_check_${q}_$c.json") \
          > "$OUT/peer_check_${q}_$c.log" 2>&1
        log "peer_check $q: rc=$? capture-bar lines: $(grep -c 'Capturing CUDA graphs' "$OUT/peer_check_${q}_$c.log")"
        grep -E "output tok/s|max_num_seqs|Error" "$OUT/peer_check_${q}_$c.log" | tail -n 4 | tee -a "$summary"
      done
      # shellcheck disable=SC1090
      (source "$vllm_env" && timeout 300 python -m minisgl_cli bench-trace traces/qwen_sample.jsonl --model \
        dummy:Qwen3-0.6B --engine vllm --num-requests 16 --quiet --json "$OUT/peer_check_trace_$c.json") \
        > "$OUT/peer_check_trace_$c.log" 2>&1
      log "peer_check bench-trace --quiet: rc=$? capture-bar lines: $(grep -c 'Capturing CUDA graphs' "$OUT/peer_check_trace_$c.log")"
      ;;
    qwen) bench dummy:Qwen3-0.6B qwen3-0.6b ;;
    qwen-fp8) EXTRA="--kv-cache-dtype fp8" bench dummy:Qwen3-0.6B qwen3-0.6b-fp8kv ;;
    llama) bench dummy:Llama-3.1-8B llama-3.1-8b ;;
    *) log "unknown stage $s (bundle, ficache, assemble, tests, ab_budget, trace, peer_check, qwen, qwen-fp8, llama)"; exit 2 ;;
  esac
done
exit $rc
