#!/usr/bin/env bash
# `serve` (engine process + HTTP front end) against the same engine in-process, one machine session: the
# saturating replay (1000 requests of qwen_1000 at 5x pace, "x5") and a light one (first 400 at the recorded pace,
# "x1"), dummy Qwen3-0.6B; the client's absorption check first. STEPS picks what runs (default: all):
#   tests          pytest tests/test_gpu.py (single-GPU ones)
#   inproc         in-process x5 (default scheduling)      light   in-process and serve x1
#   serve          serve x5 (default scheduling)           serve_mixed     serve x5 with --mixed-batch
#   mixed          in-process x5 with --mixed-batch        old     a991c5d in-process x5 (needs .whl/a991c5d.tgz)
# (Runs recorded before b32b171 had mixed batches on by default: there `serve` was mixed, `serve_nomixed` not.)
# Usage there: source .whl/use-bundle.sh && COMMIT=<sha> STEPS="..." bash benchmarks/run_gpu_serve_vs_inproc.sh
set -u
bash benchmarks/fi_cache.sh restore
c=${COMMIT:-unknown}
steps=" ${STEPS:-tests inproc serve serve_mixed light mixed old} "
r="$OUT/r"; mkdir -p "$r"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$r/gpu.txt"
M=(--model dummy:Qwen3-0.6B)
has() { [[ "$steps" == *" $1 "* ]]; }
if has tests; then
  timeout 200 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "not tp2" -s > "$r/pytest_gpu_$c.txt" 2>&1
  grep -E "identical sequences|passed|failed|Error" "$r/pytest_gpu_$c.txt" | tail -n 8
fi
timeout 60 python -m minisgl_cli bench-serve --client-check --json "$r/client_check.json" 2>&1 | tail -3
replay() {  # name, flags...
  timeout 170 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl "${M[@]}" --quiet --json "$r/$1_$c.json" "${@:2}" \
    > "$r/$1.log" 2>&1 || echo "$1 failed: $?"
}
X5=(--time-scale 0.2)
X1=(--time-scale 1.0 --num-requests 400)
serve() {  # name, server flags... ; runs the x5 replay (and x1 with `light`) against it
  (timeout 400 python -m minisgl_cli serve "${M[@]}" --port 8200 --log-level warning "${@:2}" > "$r/$1.log" 2>&1 &)
  for i in $(seq 1 180); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
  replay "$1_x5" "${X5[@]}" --url http://127.0.0.1:8200
  if has light && [ "$1" = serve ]; then replay serve_x1_400 "${X1[@]}" --url http://127.0.0.1:8200; fi
  pkill -INT -f "minisgl_cli serve"
  for i in $(seq 1 30); do pgrep -f "minisgl_cli serve" >/dev/null || break; sleep 1; done
  pgrep -fa "minisgl_cli" && echo "LEFT BEHIND" || echo "$1: no process left"
}
has inproc && replay inproc_x5 "${X5[@]}"
has serve && serve serve
has serve_mixed && serve serve_mixed --mixed-batch
has light && replay inproc_x1_400 "${X1[@]}"
has mixed && replay mixed_x5 "${X5[@]}" --mixed-batch
if has old && [ -f .whl/a991c5d.tgz ]; then
  mkdir -p /tmp/old && tar xzf .whl/a991c5d.tgz -C /tmp/old
  (cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 170 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl \
    "${M[@]}" "${X5[@]}" --quiet --json "$r/a991c5d_x5.json" > "$r/a991c5d.log" 2>&1 || echo "old failed")
fi
tar czf "$OUT/results.tgz" -C "$OUT" r
python - "$r" <<'PY'
import glob, json, os, sys
print(f"{'run':24} {'done':>5} {'tok/s':>7} {'TTFT p50':>9} {'p99':>7} {'TBT p50':>8} {'p99':>6} {'hit':>6} {'mixed':>6}")
for f in sorted(glob.glob(f"{sys.argv[1]}/*_x*.json")):
    r = json.load(open(f))
    print(f"{os.path.basename(f)[:24]:24} {r['completed']:5} {r['output_throughput']:7.0f} {r['median_ttft_ms']:9.1f} "
          f"{r['p99_ttft_ms']:7.0f} {r['median_itl_ms']:8.1f} {r['p99_itl_ms']:6.1f} {r['cache_hit_rate'] or 0:6.1%} "
          f"{r.get('mixed_step_share', 0):6.0%}")
PY
