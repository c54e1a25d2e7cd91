#!/usr/bin/env bash
# The engine's Triton decode (kernels/attention/fp8_decode.py) over a bf16 pool, beside FlashInfer's bf16 decode (what
# the engine runs there), one layer, CUDA graphs, at each tile shape of CONFIGS (BLOCK_N/NUM_STAGES/NUM_WARPS).
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_triton_bf16.sh
set -u
(tar xzf .whl/fi-cache.tgz -C ~ 2>/dev/null || true)
for cfg in ${CONFIGS:-128/3/4 64/3/4 64/4/4 32/4/4 64/2/4 128/2/8}; do
  IFS=/ read -r bn st nw <<< "$cfg"
  python - "$bn" "$st" "$nw" <<'PY' 2>&1 | grep -v "^$" | tee -a "$OUT/triton_bf16.txt"
import sys
sys.path.insert(0, "benchmarks")
import kernels.attention.fp8_decode as f
f.BLOCK_N, f.NUM_STAGES, f.NUM_WARPS = map(int, sys.argv[1:4])
import decode_attention_kernels as d
kernels = "fi-tc,triton-spans,triton-spans-p4" if sys.argv[1:4] == ["128", "3", "4"] else "triton-spans"
print("config BLOCK_N/NUM_STAGES/NUM_WARPS", "/".join(sys.argv[1:4]))
sys.argv = ["x", "--kv-dtypes", "bf16", "--kernels", kernels, "--lens", __import__("os").environ.get("LENS", "offline,shared"), "--batches",
            __import__("os").environ.get("BATCHES", "256,128,64,32,16"), "--graph", "--repeat", "0", "--out", __import__("os").environ["OUT"] + f"/bf16_{'_'.join(sys.argv[1:4])}.json"]
d.main()
PY
done
