#!/usr/bin/env bash
# Start-up with and without the compile caches (issue #17), dummy Qwen3-0.6B on one GPU, in one call:
#   1. cold Triton: FlashInfer's JIT cache from .whl/fi-cache.txz (a cold FlashInfer build is not timed here),
#      Triton's cache empty: bench-offline's start-up (load, runner, graph capture with Triton's first compiles);
#   2. `minisgl cache export`, then both caches wiped (a new machine), then `minisgl cache import`;
#   (between 1 and 2 a warm start on the same machine, for reference)
#   3. the same start again.
# With COLD_FI=1, FlashInfer's cache starts empty too, so step 1 includes its JIT build (a machine that never ran it).
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_startup_cache.sh   (JSON + log in $OUT)
set -u
if [ "${COLD_FI:-0}" = 1 ]; then rm -rf ~/.cache/flashinfer; else bash benchmarks/fi_cache.sh restore; fi
rm -rf ~/.triton
run() {
  local t0=$(date +%s.%N)
  python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --num-seqs 16 --input-len 64:64 --output-len 32:32 \
    --quiet --json "$OUT/startup_$1.json" > "$OUT/startup_$1.log" 2>&1
  python - "$OUT/startup_$1.json" "$1" "$t0" <<'PY'
import json, sys, time
r = json.load(open(sys.argv[1]))
b = r.get("startup_breakdown", {})
print(f"{sys.argv[2]:22} command {time.time() - float(sys.argv[3]):5.1f} s, engine start {r['startup_seconds']:5.1f} s "
      f"(" + ", ".join(f"{k} {v:.1f}" for k, v in b.items()) + ")")
PY
}
run cold_$([ "${COLD_FI:-0}" = 1 ] && echo all || echo triton)
run warm
python -m minisgl_cli cache export /tmp/minisgl-caches.tar.gz | tail -1
rm -rf ~/.triton ~/.cache/flashinfer
python -m minisgl_cli cache import /tmp/minisgl-caches.tar.gz | tail -2
run after_import
python -m minisgl_cli cache info > "$OUT/cache_info.txt" 2>&1
