#!/usr/bin/env bash
# The CUDA decode kernel over a bf16 pool (kernels/cuda/paged_decode.cu) beside FlashInfer's tensor-core decode,
# one layer at Qwen3-0.6B's heads (benchmarks/decode_attention_kernels.py, CUDA-graph replays; LENS, BATCHES,
# KERNELS), after torch's sum over the same bytes; then Nsight Compute on NCU_KERNELS / NCU_METRIC_KERNELS
# (STAGES=none: only those).
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_cuda_decode.sh
# The library may be built here (nvcc 13.0, sm_90a, named as kernels/cuda_build.library_path names it; the benchmark's
# shapes other than the engine's need the ALL_SHAPES build) and carried in .whl/cuda; beside
# the bundle and FlashInfer's JIT cache it puts a call over 64 MiB, so carry it xz-compressed in .whl/cudaxz and start
# the command with: mkdir -p .whl/cuda && for f in .whl/cudaxz/*.xz; do xz -dc "$f" > .whl/cuda/$(basename "$f" .xz); done
# (fifty-fifth session). -l2 (cp.async.ca) at -w8 -s2 is the kernel's fastest (docs/gpu.md): the engine's, `cuda`.
set -u
bash benchmarks/fi_cache.sh restore
# kernels built here beforehand (the same nvcc 13.0): skips the build there
mkdir -p ~/.cache/minisgl/cuda && cp .whl/cuda/*.so ~/.cache/minisgl/cuda/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for stage in ${STAGES:-kernels}; do
  case $stage in
    kernels)
      t0=$(date +%s)
      python -c "
import torch
from engine.cache_paths import cache_root
from kernels.attention import cuda_decode as c
for flags in ((), c.ALL_SHAPES):
    assert c.load(cache_root() / 'cuda', torch.device('cuda'), flags) is None
print('built')" || exit 1
      echo "build $(( $(date +%s) - t0 )) s"
      # what a plain streaming read of the same bytes costs: torch's sum over contiguous bf16, CUDA graphs
      python - <<'PY'
import torch
for mb in (1117, 549, 288, 135, 62):
    x = torch.randn(mb * 2**19, device="cuda", dtype=torch.bfloat16)
    out = torch.empty((), device="cuda", dtype=torch.float32)
    for _ in range(3):
        torch.sum(x, dim=0, out=out)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(30):
            torch.sum(x, dim=0, out=out)
    g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); g.replay(); b.record(); torch.cuda.synchronize()
    us = a.elapsed_time(b) * 1e3 / 30
    print(f"sum over {mb} MB: {us:.1f} us, {x.numel() * 2 / us / 1e6:.2f} TB/s, bytes at 3.06 TB/s {x.numel() * 2 / 3.06e6:.1f} us")
PY
      python benchmarks/decode_attention_kernels.py --kv-dtypes bf16 --graph --lens "${LENS:-offline}" \
        --heads "${HEADS:-16/8}" --batches "${BATCHES:-256,128,64,32,16}" \
        --kernels "${KERNELS:-fi-tc,fi-tc-nosplit,cuda,cuda-spans,cuda-spans-p1,cuda-spans-p4}" \
        --out "$OUT/cuda_decode_kernels.json" 2>&1 | grep -v "^$" | tail -n 90 ;;
  esac
done
bash benchmarks/fi_cache.sh save "$OUT"
# Nsight Compute on one call of each kernel in NCU_KERNELS (name regex per kernel: cuda -> paged_decode, fi-* -> FlashInfer's)
for k in ${NCU_KERNELS-}; do
  case $k in cuda*) rx=paged_decode ;; *) rx="Prefill|Decode" ;; esac
  timeout 240 ncu --clock-control none --kernel-name "regex:$rx" --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
    python benchmarks/decode_attention_kernels.py --kv-dtypes bf16 --kernels "$k" --lens offline --batches 256 \
    --repeat 0 > "$OUT/ncu_$k.txt" 2>&1
  echo "== $k"; grep -E "Duration|DRAM Throughput|Memory Throughput|L1/TEX Cache Throughput|Achieved Occupancy|Registers Per|Block Limit|Issue Slots Busy|Issued Warp|No Eligible|Warp Cycles Per Issued|Executed Ipc|LSU|Stall|Lg Throttle|Mio|Theoretical Occ|Dynamic Shared" "$OUT/ncu_$k.txt" | head -n 40
done
# L2 and DRAM traffic of one call of each kernel in NCU_METRIC_KERNELS
for k in ${NCU_METRIC_KERNELS-}; do
  case $k in cuda*) rx=paged_decode ;; *) rx="Prefill|Decode" ;; esac
  timeout 240 ncu --clock-control none --kernel-name "regex:$rx" --launch-skip 5 --launch-count 1 --metrics \
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_requests_srcunit_tex_op_read.sum,dram__bytes_read.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_read_lookup_hit.sum,smsp__inst_executed_op_ldgsts.sum,gpu__time_duration.sum \
    python benchmarks/decode_attention_kernels.py --kv-dtypes bf16 --kernels "$k" --lens offline --batches 256 \
    --repeat 0 > "$OUT/ncu_metrics_$k.txt" 2>&1
  echo "== $k"; grep -E "^\s+(lts|dram|l1tex|smsp|gpu)__" "$OUT/ncu_metrics_$k.txt"
done
[ -n "${SASS-}" ] && cuobjdump -sass ~/.cache/minisgl/cuda/paged_decode-*.so | grep -E "Function|LDGSTS" | grep -B1 -m 12 LDGSTS
