#!/usr/bin/env bash
# The fp8 pool's decode kernel (kernels/attention/fp8_decode.py) on the GPU: its tests, then bench-offline over an fp8
# pool with it and with FlashInfer's decode (flashinfer_backend.TRITON_FP8_DECODE), and over bf16, interleaved
# ${ROUNDS:-2} times (OFFLINE_MODES of these), ${RUNS:-2} runs each; then issue #15's replay (mixed, the default) over bf16 and fp8 with step logs.
# Stage `kernels` times the engine's kernel (KERNELS of benchmarks/decode_attention_kernels.py) beside FlashInfer's bf16
# decode (LENS, BATCHES; BF16=0 skips FlashInfer; GRAPH=1 times CUDA-graph replays), then profiles NCU_KERNELS with
# Nsight Compute. OFFLINE_MODES `pN` run the Triton kernel with flashinfer_backend.FP8_PROGRAMS_PER_SM = N. The
# twenty-fifth session's programs-per-SM sweep: GRAPH=1 BF16=0 NCU_KERNELS= LENS=offline,shared,skewed
# BATCHES=256,128,64,32,16,8 KERNELS=triton-uniform,triton-spans-p2,triton-spans-p4,triton-spans-p6,triton-spans-p8
# STAGES="kernels offline" OFFLINE_MODES="p2 p4 p6" ROUNDS=1.
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_fp8_decode.sh   (STAGES="tests offline trace")
set -u
bash benchmarks/fi_cache.sh restore
for stage in ${STAGES:-tests offline trace}; do
  case $stage in
    kernels)
      python -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())"
      [ "${BF16:-1}" = 1 ] && python benchmarks/decode_attention_kernels.py --kv-dtypes bf16 --kernels fi-tc --lens "${LENS:-offline,shared}" \
        --batches "${BATCHES:-256,64}" --out "$OUT/variants_bf16.json" 2>&1 | grep -v "^$" | tail -n 20
      python benchmarks/decode_attention_kernels.py --kv-dtypes e4m3 --kernels "${KERNELS:-triton,triton-spans,triton-uniform}" \
        --lens "${LENS:-offline,shared}" --batches "${BATCHES:-256,64}" ${GRAPH:+--graph} --out "$OUT/variants_e4m3.json" \
        2>&1 | tail -n 80
      for k in ${NCU_KERNELS-triton}; do
        timeout 240 ncu --clock-control none --kernel-name regex:_decode --launch-skip 5 --launch-count 1 \
          --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
          --section MemoryWorkloadAnalysis --section SchedulerStats \
          python benchmarks/decode_attention_kernels.py --kv-dtypes e4m3 --kernels "$k" --lens offline --batches 256 \
          --repeat 0 > "$OUT/ncu_$k.txt" 2>&1
        grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Shared Memory Config|Stall|Warp Cycles|Issued Warp|No Eligible|Block Limit|L2 Hit|L1/TEX Hit|Compute \(SM\)" "$OUT/ncu_$k.txt" | head -n 40
      done ;;
    tests)
      timeout 300 python -m pytest -q -x tests/test_gpu.py -k "fp8 or flashinfer_matches or parts_match" 2>&1 \
        | tail -n 5 | tee "$OUT/pytest_fp8_decode.txt" ;;
    offline)
      for round in $(seq "${ROUNDS:-2}"); do
        for mode in ${OFFLINE_MODES:-triton flashinfer bf16}; do
          pre="pass"; kv="--kv-cache-dtype fp8"
          [ $mode = flashinfer ] && pre="import kernels.attention.flashinfer_backend as f; f.TRITON_FP8_DECODE = False"
          case $mode in p[0-9]*) pre="import kernels.attention.flashinfer_backend as f; f.FP8_PROGRAMS_PER_SM = ${mode#p}" ;; esac
          [ $mode = bf16 ] && kv=""
          timeout 200 python -c "$pre; from minisgl_cli.app import main; main()" bench-offline \
            --model dummy:Qwen3-0.6B --runs "${RUNS:-2}" $kv --json "$OUT/offline_${mode}_r$round.json" > "$OUT/offline_${mode}_r$round.log" 2>&1
          python - "$OUT/offline_${mode}_r$round.json" "$mode" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:10} runs", [round(r["output_throughput"]) for r in d["runs"]], "floor", round(d["floor_fraction"], 3))
PY
        done
      done 2>&1 | tee "$OUT/offline_fp8_decode.txt" ;;
    trace)
      MODES="${TRACE_MODES:-mixed fp8=--kv-cache-dtype,fp8}" TAG=_fp8_decode bash benchmarks/run_gpu_trace_steps.sh ;;
  esac
done
