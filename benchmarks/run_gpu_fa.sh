#!/usr/bin/env bash
# FlashAttention-4 on the GPU machine (issue #16): assemble the FA4 bundle, then GPU tests, per-layer prefill kernels
# FA4 vs FlashInfer fa2 (with FA4's JIT compile time apart), and bench-offline + the trace replay's TTFT with
# `fa,flashinfer` vs `flashinfer` (both in one run). Build the parts here first: benchmarks/make_fa_bundle.sh.
#
# run() sequence, kind nvidia-h200, calls sent back to back (/root and the JIT caches in ~ live only while the
# machine stays warm; a call that finds /root/fa-site missing means the machine was replaced: start again at 1):
#   1. carry [".whl/fa/p00"]   command: bash benchmarks/run_gpu_fa.sh assemble .whl/fa/p00   # "have 1/3 fa parts", rc 3
#   2. the same for p01, then p02                                                           # "unpacked into /root/fa-site"
#      (one call per part, any order; a part failing its sha256 is refused: send it again)
#   3. carry [".whl/device-bundle.txz", ".whl/use-bundle.sh", ".whl/fi-cache.txz", ".whl/fa-cache.tgz"], timeout 600:
#      source .whl/use-bundle.sh && COMMIT=<sha> bash benchmarks/run_gpu_fa.sh tests
#   4. same carry:  source .whl/use-bundle.sh && COMMIT=<sha> bash benchmarks/run_gpu_fa.sh kernels
#   5. same carry:  source .whl/use-bundle.sh && COMMIT=<sha> bash benchmarks/run_gpu_fa.sh e2e
#      (page size 16, the default; if `kernels` shows FA4 faster at page 128 (its TMA path), repeat with PAGE=128)
#   6. same carry:  source .whl/use-bundle.sh && COMMIT=<sha> bash benchmarks/run_gpu_fa.sh decode
#      (decode attention per layer, FA4 against FlashInfer's tensor-core decode, CUDA graphs: decode_attention_kernels.py)
#   (fi-cache.txz / fa-cache.tgz: JIT caches an earlier run returned in $OUT, kept in .whl/; leave out if absent.
#   `kernels` before `e2e`, so FA4's Qwen3 kernels are compiled (and on disk) before the trace replay's TTFT counts.)
# Each stage writes at most 5 files to $OUT: gpu.txt; its results (pytest_fa_<c>.txt | fa_prefill_<c>.json and .txt |
# offline_p<PAGE>_<c>.json and trace_p<PAGE>_<c>.json); fi-cache.txz; fa-cache.tgz (FA4's compiled kernels:
# FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=~/.cache/fa4 with FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1).
set -u
SITE=${FA_SITE:-/root/fa-site} PARTS=${FA_PARTS:-/root/fa-parts} NAME=fa-site.tar.xz

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
  cat "$PARTS"/$NAME.part* > "$PARTS/whole.tar.xz"
  [ "$(sha256sum < "$PARTS/whole.tar.xz" | cut -d' ' -f1)" = "$(awk -v n=$NAME '$2 == n {print $1}' "$PARTS/SHA256SUMS")" ] \
    || { echo "assembled archive fails its sha256"; exit 1; }
  rm -rf "$SITE" && mkdir -p "$SITE" && tar xJf "$PARTS/whole.tar.xz" -C "$SITE" && rm "$PARTS/whole.tar.xz" && echo "unpacked into $SITE"
  exit 0
fi
stage=${1:-}
case $stage in tests|kernels|e2e|decode) ;; *) echo "usage: $0 assemble PARTDIR | tests | kernels | e2e | decode"; exit 2;; esac
[ -d "$SITE/flash_attn" ] || { echo "$SITE missing: run the assemble calls first (the machine was replaced?)"; exit 1; }
fa_env
bash benchmarks/fi_cache.sh restore
(tar xzf .whl/fa-cache.tgz -C ~ 2>/dev/null || true)
c=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)"
  python -c "import time; t = time.time(); import flash_attn.cute, cutlass; print('flash_attn.cute imports in',
round(time.time() - t, 1), 's; cutlass-dsl', getattr(cutlass, '__version__', '?'))" 2>&1 | tail -5
} > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

save_caches() {
  bash benchmarks/fi_cache.sh save "$OUT"
  tar czf "$OUT/fa-cache.tgz" -C ~ .cache/fa4 2>/dev/null
}
trap save_caches EXIT

if [ "$stage" = tests ]; then  # FA4 logits vs torch (prefill, cached prefix, decode); greedy tokens vs FlashInfer
  timeout 560 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "fa_ or flashinfer_matches" -rs --durations=10 \
    2>&1 | tail -n 40 > "$OUT/pytest_fa_$c.txt"
  cat "$OUT/pytest_fa_$c.txt"
elif [ "$stage" = kernels ]; then  # per-layer prefill, FA4 JIT (first call per variant) apart
  timeout 560 python benchmarks/fa_prefill_kernels.py "$OUT/fa_prefill_$c.json" > "$OUT/fa_prefill_$c.txt" 2>&1 \
    || echo "fa_prefill_kernels failed: $?" >> "$OUT/fa_prefill_$c.txt"
  tail -n 16 "$OUT/fa_prefill_$c.txt"
elif [ "$stage" = decode ]; then  # decode attention per layer at the offline workload's lengths, graphs
  timeout 560 python benchmarks/decode_attention_kernels.py --graph --kv-dtypes bf16 --pages "${PAGES:-16,128}" \
    --batches "${BATCHES:-256,128,64,32,16}" --kernels "${KERNELS:-fi-tc,fa4,fa4-auto,fa4-split2,fa4-split4}" \
    --out "$OUT/fa_decode_$c.json" > "$OUT/fa_decode_$c.txt" 2>&1 || echo "decode_attention_kernels failed: $?" >> "$OUT/fa_decode_$c.txt"
  tail -n 60 "$OUT/fa_decode_$c.txt"
else  # end to end, both backends in this one run
  python - "$OUT" "$c" "${PAGE:-16}" <<'PY'
import json, subprocess, sys
out, c, page = sys.argv[1:]
res = {"offline": {}, "trace": {}}
for kind, limit, cmd in (
    ("offline", 110, ["bench-offline", "--model", "dummy:Qwen3-0.6B", "--runs", "2"]),
    ("trace", 150, ["bench-trace", "traces/qwen_1000.jsonl", "--model", "dummy:Qwen3-0.6B", "--time-scale", "0.2"]),
):
    for be in ("flashinfer", "fa,flashinfer"):
        path = f"/tmp/{kind}_{be.replace(',', '+')}.json"
        p = subprocess.run(["timeout", str(limit), sys.executable, "-m", "minisgl_cli", *cmd, "--quiet",
                            "--page-size", page, "--attention-backend", be, "--json", path],
                           capture_output=True, text=True)
        try:
            res[kind][be] = json.load(open(path))
        except Exception:
            res[kind][be] = {"error": p.returncode, "tail": (p.stdout + p.stderr)[-3000:]}
    json.dump(res[kind], open(f"{out}/{kind}_p{page}_{c}.json", "w"), indent=1)
for be, r in res["offline"].items():
    print("offline", be, {k: v for k, v in r.items() if "throughput" in k or k in ("runs", "output_tokens", "error")})
for be, r in res["trace"].items():
    print("trace", be, {k: r.get(k) for k in ("median_ttft_ms", "p99_ttft_ms", "output_throughput", "error")})
PY
fi
