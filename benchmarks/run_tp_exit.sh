#!/usr/bin/env bash
# On a machine with N GPUs (N=2 unless TP=4 is set): do `bench-offline --tp N`, `bench-trace --tp N` and `serve --tp N`
# (after Ctrl-C) end, and how soon? A command whose ranks are still alive 45 s after its result was written gets SIGABRT on every process, and
# PYTHONFAULTHANDLER prints each thread's Python stack: that is where they hang.
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_tp_exit.sh   (logs land in $OUT)
set -u
export PYTHONFAULTHANDLER=1
N=${TP:-2}
TR="torchrun --nproc-per-node $N --standalone -m minisgl_cli"

ends() {  # ends NAME RESULT_FILE COMMAND...: run it, report the seconds from its result to the end of every rank
  local name=$1 result=$2; shift 2
  rm -f "$result"; local start=$(date +%s%N)
  "$@" > "$OUT/exit_$name.log" 2>&1 & local pid=$!
  for i in $(seq 1 480); do [ -s "$result" ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.25; done
  local written=$(date +%s%N)
  for i in $(seq 1 180); do kill -0 $pid 2>/dev/null || break; sleep 0.25; done
  if kill -0 $pid 2>/dev/null; then
    echo "$name: HANG, still running 45 s after its result"; ps -eo pid,stat,etime,cmd | grep minisgl_cli | grep -v grep
    pkill -ABRT -f "minisgl_cli"; sleep 5; pkill -KILL -f "minisgl_cli"; tail -60 "$OUT/exit_$name.log"
  else
    wait $pid; local rc=$?
    echo "$name: exit code $rc, $(( ($(date +%s%N) - written) / 1000000 )) ms after its result ($(( ($(date +%s%N) - start) / 1000000 )) ms in all)"
  fi
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ends bench-offline /tmp/exit_bo.json $TR bench-offline --model dummy:Qwen3-0.6B --tp $N --num-seqs 64 --quiet \
  --json /tmp/exit_bo.json
ends bench-trace /tmp/exit_bt.json $TR bench-trace traces/qwen_sample.jsonl --model dummy:Qwen3-0.6B --tp $N \
  --num-requests 32 --time-scale 0.2 --json /tmp/exit_bt.json

# serve: the "result" is the moment Ctrl-C is sent (to the whole process group, as a terminal does).
rm -f /tmp/exit_sv; setsid $TR serve --model dummy:Qwen3-0.6B --tp $N --port 8201 > "$OUT/exit_serve.log" 2>&1 &
sid=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8201/health >/dev/null && break; sleep 1; done
curl -s http://127.0.0.1:8201/v1/completions -H 'content-type: application/json' \
  -d '{"model":"dummy:Qwen3-0.6B","prompt":"hello","max_tokens":16}' | head -c 200; echo
sent=$(date +%s%N); kill -INT -- -$sid
for i in $(seq 1 240); do pgrep -f "minisgl_cli serve" >/dev/null || break; sleep 0.25; done
if pgrep -f "minisgl_cli serve" >/dev/null; then echo "serve: HANG 60 s after Ctrl-C"; pkill -ABRT -f minisgl_cli; sleep 5
  tail -60 "$OUT/exit_serve.log"; pkill -KILL -f minisgl_cli
else echo "serve: every rank gone $(( ($(date +%s%N) - sent) / 1000000 )) ms after Ctrl-C"; fi
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
grep -v "^W1\|POST /v1" "$OUT/exit_serve.log" | tail -6
