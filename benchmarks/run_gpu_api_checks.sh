#!/usr/bin/env bash
# On one GPU (CUDA_VISIBLE_DEVICES picks it), what the thirty-fifth session changed and tested on CPU only:
#   llm      the Python API: `with LLM(...)` on CUDA, two threads' generate() at once, refusal after the block, the
#            GPU memory the engine held after shutdown
#   steplog  `serve --step-log` under a file (not a directory) exits 2 before the model loads; into a directory
#            that does not exist yet, a replay of 64 requests, then Ctrl-C: the log is written, no process left
#   peer     `bench-offline --compare transformers --quiet` on a small greedy workload: nothing but the table
# Usage there: source .whl/use-bundle.sh && MINISGL_COMMIT=<sha> bash benchmarks/run_gpu_api_checks.sh [stages]
set -u
c=${MINISGL_COMMIT:-unknown}
stages=" ${*:-llm steplog peer} "
d="$OUT/api_checks_$c"; mkdir -p "$d"
has() { [[ "$stages" == *" $1 "* ]]; }
if has llm; then
  timeout 240 python - <<'PY' 2>&1 | tee "$d/llm.txt"
import threading
import torch
from engine.llm import LLM
from engine.sampling_params import SamplingParams

p = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
with LLM(model="dummy:Qwen3-0.6B") as llm:
    held = torch.cuda.memory_allocated()
    outs: dict[int, list] = {}
    def run(i: int) -> None:
        outs[i] = llm.generate([[1, 2, 3, 4 + i]] * 8, p)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    [t.start() for t in ts]
    [t.join(120) for t in ts]
    print("threads:", {i: [len(o.token_ids) for o in v] for i, v in sorted(outs.items())})
    alone = list(llm.generate([[1, 2, 3, 4]], p)[0].token_ids)
    print("thread 0's 8 equal a lone run of its prompt:", all(list(o.token_ids) == alone for o in outs[0]))
try:
    llm.generate([[1, 2, 3]], p)
    print("after the block: ANSWERED (wrong)")
except Exception as e:  # noqa: BLE001
    print("after the block:", type(e).__name__, str(e)[:160])
del llm
import gc
gc.collect()
torch.cuda.synchronize()
print(f"GPU memory allocated: {held / 2**30:.2f} GiB in the block, {torch.cuda.memory_allocated() / 2**30:.2f} GiB after")
PY
fi
if has steplog; then
  t0=$(date +%s%N)
  timeout 120 python -m minisgl_cli serve --model dummy:Qwen3-0.6B --port 8210 --step-log "$d/steplog_bad.txt/steps.jsonl" \
    > "$d/steplog_bad.txt" 2>&1
  echo "serve --step-log under a file: rc=$? in $((($(date +%s%N) - t0) / 1000000)) ms: $(tail -n 2 "$d/steplog_bad.txt" | tr '\n' ' ')"
  (timeout 300 python -m minisgl_cli serve --model dummy:Qwen3-0.6B --port 8210 --log-level warning \
    --step-log "$d/new/steps.jsonl" > "$d/serve.log" 2>&1 &)
  for i in $(seq 1 180); do curl -sf http://127.0.0.1:8210/health >/dev/null && break; sleep 1; done
  timeout 120 python -m minisgl_cli bench-trace traces/qwen_sample.jsonl --url http://127.0.0.1:8210 --num-requests 64 \
    --vocab-size 151936 --max-model-len 40960 --quiet --json "$d/trace.json" > "$d/trace.log" 2>&1
  echo "replay rc=$?: $(python -c "import json; r = json.load(open('$d/trace.json')); print(r['completed'], 'done', r['failed'], 'failed')")"
  pkill -INT -f "minisgl_cli serve"
  for i in $(seq 1 30); do pgrep -f "minisgl_cli serve" >/dev/null || break; sleep 1; done
  pgrep -fa "minisgl_cli serve" && echo "LEFT BEHIND" || echo "no process left"
  echo "step log: $(wc -l < "$d/new/steps.jsonl") steps"
  python benchmarks/step_log_summary.py "$d/new/steps.jsonl" 2>&1 | head -n 12
fi
if has peer; then
  timeout 300 python -m minisgl_cli bench-offline --model dummy:Qwen3-0.6B --num-seqs 16 --input-len 100:200 \
    --output-len 64:128 --temperature 0 --compare transformers --quiet --json "$d/peer.json" > "$d/peer.out" 2> "$d/peer.err"
  echo "bench-offline --compare transformers --quiet: rc=$?, stdout $(wc -l < "$d/peer.out") lines, stderr $(wc -l < "$d/peer.err") lines"
  cat "$d/peer.out"; head -n 20 "$d/peer.err"
fi
