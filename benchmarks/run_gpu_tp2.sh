#!/usr/bin/env bash
# On two GPUs of one host (nvidia-h200-x2), the stages named (default: all three, in this order); files land in $OUT.
#   tests    the Python API's step-failure tests on GPU 0 (tests/test_llm_api.py -m gpu), then the TP=2 tests
#   load     `serve --tp 2` under issue #15's saturating replay (qwen_1000 at 5x pace, dummy Qwen3-0.6B), then Ctrl-C
#            as a person gives it (SIGINT to torchrun, which forwards it to every rank): no process may stay
#   sigterm  `serve --tp 2` stopped by SIGTERM to torchrun with a stream open (the forty-sixth session: followers leave
#            the signal to rank 0): the stream's last events, the IPC directory, the processes
#   stuck0   (not in the default) rank 0 of `serve --tp 2` stopped (SIGSTOP) with a stream open, the collectives' timeout
#            at 10 s: rank 1 gives up, torchrun stops the group, and the front end must end the stream with an error
# Usage there: COMMIT=<sha> bash benchmarks/run_gpu_tp2.sh [tests] [load] [sigterm] [stuck0]
# (.whl/use-bundle.sh, sourced here, also restores FlashInfer's JIT cache when .whl/fi-cache.txz is carried)
set -u
source .whl/use-bundle.sh > /dev/null 2>&1
c=${COMMIT:-unknown}
stages=${*:-tests load sigterm}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

start_serve() {  # $1: the log's name under $OUT
  (timeout 300 torchrun --nproc-per-node 2 --standalone -m minisgl_cli serve --model dummy:Qwen3-0.6B --tp 2 \
    --port 8200 --log-level warning > "$OUT/$1.log" 2>&1 &)
  for i in $(seq 1 150); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
  echo "serve --tp 2 healthy after ${i} s"
}

open_stream() {  # $1: the file under $OUT the long answer streams into; sets $ipc, the engine's socket folder
  (curl -sN http://127.0.0.1:8200/v1/completions -H 'content-type: application/json' \
    -d '{"model":"dummy:Qwen3-0.6B","prompt":"hi","max_tokens":30000,"stream":true,"ignore_eos":true}' \
    > "$OUT/$1" 2>&1 &)
  sleep 2
  ipc=$(ls -d /tmp/minisgl-* 2>/dev/null | head -1); echo "ipc dir: $ipc"
}

wait_gone() {  # $1: what stopped it
  for i in $(seq 1 60); do pgrep -f "minisgl_cli" >/dev/null || break; sleep 1; done
  pgrep -fa "minisgl_cli" && echo "LEFT BEHIND" || echo "$1: no process left after ${i} s"
}

for stage in $stages; do
  case $stage in
    tests)
      CUDA_VISIBLE_DEVICES=0 timeout 200 python -m pytest -q -p no:cacheprovider tests/test_llm_api.py -m gpu \
        > "$OUT/pytest_llm_api_gpu_$c.txt" 2>&1
      echo "llm_api gpu: rc=$?"; tail -n 3 "$OUT/pytest_llm_api_gpu_$c.txt"
      timeout 240 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k tp2 > "$OUT/pytest_tp2_$c.txt" 2>&1
      echo "tp2: rc=$?"; tail -n 3 "$OUT/pytest_tp2_$c.txt"
      ;;
    load)
      start_serve serve_tp2_load
      timeout 200 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl --url http://127.0.0.1:8200 \
        --time-scale 0.2 --vocab-size 151936 --max-model-len 40960 --quiet --json "$OUT/serve_tp2_x5_$c.json" \
        > "$OUT/serve_tp2_x5.log" 2>&1
      echo "replay: rc=$?"; tail -n 24 "$OUT/serve_tp2_x5.log"
      pkill -INT -f "torchrun.*minisgl_cli serve"
      wait_gone "Ctrl-C"
      grep -v "POST /v1" "$OUT/serve_tp2_load.log" | tail -n 8
      ;;
    sigterm)
      start_serve serve_tp2_sigterm
      open_stream stream.txt
      pkill -TERM -f "torchrun.*minisgl_cli serve"
      wait_gone "SIGTERM"
      echo "stream events: $(grep -c '^data:' "$OUT/stream.txt")"; grep '^data:' "$OUT/stream.txt" | tail -2 | cut -c1-300
      [ -n "$ipc" ] && { [ -e "$ipc" ] && echo "IPC DIR LEFT" || echo "ipc dir removed"; }
      echo "'tensor-parallel group failed' lines: $(grep -c "tensor-parallel group failed" "$OUT/serve_tp2_sigterm.log")"
      grep -v "POST /v1" "$OUT/serve_tp2_sigterm.log" | tail -n 5
      ;;
    stuck0)
      export MINISGL_DIST_TIMEOUT=10
      start_serve serve_tp2_stuck0
      unset MINISGL_DIST_TIMEOUT
      open_stream stream_stuck0.txt
      for p in $(pgrep -f "minisgl_cli serve"); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "LOCAL_RANK=0" && rank0=$p
      done
      echo "rank 0 (pid ${rank0:-none}) stopped (SIGSTOP)"; kill -STOP "$rank0"
      for i in $(seq 1 60); do grep -q '^data: \[DONE\]' "$OUT/stream_stuck0.txt" && break; sleep 1; done
      echo "stream ended after ${i} s: $(grep -c '^data:' "$OUT/stream_stuck0.txt") events"
      grep '^data:' "$OUT/stream_stuck0.txt" | tail -2 | cut -c1-300
      wait_gone "rank 0 stuck"
      [ -n "$ipc" ] && { [ -e "$ipc" ] && echo "IPC DIR LEFT" || echo "ipc dir removed"; }
      grep -v "POST /v1" "$OUT/serve_tp2_stuck0.log" | grep -v "^W1\|^  \|^Traceback\|^torch.distributed" | tail -n 8
      ;;
    *) echo "unknown stage $stage (tests, load, sigterm, stuck0)"; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=memory.used --format=csv,noheader
