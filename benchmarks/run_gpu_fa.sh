#!/usr/bin/env bash
# FlashAttention-4 on the GPU machine (issue #16): assemble the FA4 bundle, then GPU tests, per-layer prefill kernels
# FA4 vs FlashInfer fa2 (with FA4's JIT compile time apart), and bench-offline + the trace replay's TTFT with
# `fa,flashinfer` vs `flashinfer`, in one run. Build the parts here first: benchmarks/make_fa_bundle.sh (.whl/fa/pNN).
#
# run() sequence (kind nvidia-h200; consecutive calls: /root is kept only while the machine stays warm):
#   1. carry [".whl/fa/p00"]:  bash benchmarks/run_gpu_fa.sh assemble .whl/fa/p00      # "have 1/2 parts", exit 3
#   2. carry [".whl/fa/p01"]:  bash benchmarks/run_gpu_fa.sh assemble .whl/fa/p01      # unpacks into /root/fa-site
#      (one call per part, in any order; a call that reports a missing part means the machine was replaced: resend all)
#   3. carry [".whl/device-bundle.tgz", ".whl/use-bundle.sh", ".whl/fi-cache.tgz", ".whl/fa-cache.tgz"], timeout 600:
#      source .whl/use-bundle.sh && COMMIT=<sha> bash benchmarks/run_gpu_fa.sh all
#      (fa-cache.tgz / fi-cache.tgz: the JIT caches that an earlier call 3 returned in $OUT; leave out if absent)
# Results in $OUT (<= 8 files): gpu.txt, pytest_fa.txt, fa_prefill_<c>.json, offline_<c>.json, trace_<c>.json,
# summary.txt, fi-cache.tgz, fa-cache.tgz (FA4's compiled kernels, FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=~/.cache/fa4).
set -u
SITE=/root/fa-site PARTS=/root/fa-parts NAME=fa-site.tar.xz

fa_env() {  # put /root/fa-site on the path (and _compat/* only where the machine lacks the package)
  local extra=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages  # the second: what nvidia_cutlass_dsl's .pth would add
  for m in cuda-bindings:cuda.bindings cuda-pathfinder:cuda.pathfinder protobuf:google.protobuf einops:einops; do
    python -c "import ${m#*:}" 2>/dev/null || extra=$extra:$SITE/_compat/${m%%:*}
  done
  export PYTHONPATH="$extra${PYTHONPATH:+:$PYTHONPATH}"
  export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$HOME/.cache/fa4
}

if [ "${1:-}" = assemble ]; then
  d=$2; mkdir -p "$PARTS"
  (cd "$d" && sha256sum --quiet -c --ignore-missing SHA256SUMS) || { echo "part $d fails its sha256: send it again"; exit 1; }
  cp "$d"/$NAME.part* "$d"/SHA256SUMS "$PARTS"/
  want=$(grep -c "$NAME.part" "$PARTS/SHA256SUMS"); have=$(ls "$PARTS"/$NAME.part* | wc -l)
  [ "$have" -lt "$want" ] && { echo "have $have/$want fa parts"; exit 3; }
  cat "$PARTS"/$NAME.part* > /root/$NAME
  [ "$(sha256sum < /root/$NAME | cut -d' ' -f1)" = "$(awk -v n=$NAME '$2 == n {print $1}' "$PARTS/SHA256SUMS")" ] \
    || { echo "assembled archive fails its sha256"; exit 1; }
  rm -rf "$SITE" && mkdir -p "$SITE" && tar xJf /root/$NAME -C "$SITE" && rm /root/$NAME && echo "unpacked into $SITE"
  exit 0
fi
[ "${1:-}" = all ] || { echo "usage: $0 assemble PARTDIR | all"; exit 2; }
[ -d "$SITE/flash_attn" ] || { echo "$SITE missing: run the assemble calls first"; exit 1; }
fa_env
(tar xzf .whl/fi-cache.tgz -C ~ 2>/dev/null || true)
(tar xzf .whl/fa-cache.tgz -C ~ 2>/dev/null || true)
c=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)"
  python -c "import time; t = time.time(); import flash_attn.cute, cutlass; print('flash_attn.cute imports in',
round(time.time() - t, 1), 's; cutlass-dsl', getattr(cutlass, '__version__', '?'))" 2>&1 | tail -5
} 2>&1 | tee "$OUT/gpu.txt"

# 1. correctness (FA4 vs torch logits; greedy tokens vs FlashInfer), FA tests only
timeout 420 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "fa_ or flashinfer_matches" -rs 2>&1 \
  | tail -n 25 > "$OUT/pytest_fa.txt"
# 2. per-layer prefill kernels, FA4 JIT time apart (first call of each variant)
timeout 300 python benchmarks/fa_prefill_kernels.py "$OUT/fa_prefill_$c.json" > /tmp/fa_prefill.log 2>&1 \
  || echo "fa_prefill_kernels failed: $?" >> /tmp/fa_prefill.log
# 3. end to end, both backends in this one run: bench-offline default workload, trace replay TTFT
python - "$OUT" "$c" <<'PY' > /tmp/e2e.log 2>&1
import json, subprocess, sys
out, c = sys.argv[1:]
res = {"offline": {}, "trace": {}}
for be in ("flashinfer", "fa,flashinfer"):
    tag = be.replace(",", "+")
    for kind, cmd in (
        ("offline", ["bench-offline", "--model", "dummy:Qwen3-0.6B", "--runs", "2"]),
        ("trace", ["bench-trace", "traces/qwen_1000.jsonl", "--model", "dummy:Qwen3-0.6B", "--time-scale", "0.2"]),
    ):
        path = f"/tmp/{kind}_{tag}.json"
        p = subprocess.run(["timeout", "150", sys.executable, "-m", "minisgl_cli", *cmd, "--quiet",
                            "--attention-backend", be, "--json", path], capture_output=True, text=True)
        try:
            res[kind][be] = json.load(open(path))
        except Exception:
            res[kind][be] = {"error": p.returncode, "tail": (p.stdout + p.stderr)[-3000:]}
for kind in res:
    json.dump(res[kind], open(f"{out}/{kind}_{c}.json", "w"), indent=1)
PY
tar czf "$OUT/fi-cache.tgz" -C ~ .cache/flashinfer 2>/dev/null
tar czf "$OUT/fa-cache.tgz" -C ~ .cache/fa4 2>/dev/null
{
  cat "$OUT/pytest_fa.txt"; echo; tail -n 14 /tmp/fa_prefill.log; echo; tail -n 5 /tmp/e2e.log
  python - "$OUT" "$c" <<'PY'
import json, sys
out, c = sys.argv[1:]
for be, r in json.load(open(f"{out}/offline_{c}.json")).items():
    print("offline", be, {k: v for k, v in r.items() if "throughput" in k or k in ("runs", "output_tokens", "error")})
for be, r in json.load(open(f"{out}/trace_{c}.json")).items():
    print("trace", be, {k: r.get(k) for k in ("median_ttft_ms", "p99_ttft_ms", "output_throughput", "error")})
PY
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
