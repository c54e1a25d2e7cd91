#!/usr/bin/env bash
# `serve` (engine process + HTTP front end) against the same engine in-process, one machine session: the
# saturating replay (1000 requests of qwen_1000 at 5x pace) and a light one (first 400 at the recorded pace),
# dummy Qwen3-0.6B, mixed batches on; the client's absorption check first. With .whl/a991c5d.tgz present, the
# pre-mixed-batch engine (a991c5d) and today's --no-mixed-batch replay at 5x pace too (a regression check).
# Usage there: source .whl/use-bundle.sh && COMMIT=<sha> bash benchmarks/run_gpu_serve_vs_inproc.sh
set -u
(tar xzf .whl/fi-cache.tgz -C ~ 2>/dev/null || true)
c=${COMMIT:-unknown}
r="$OUT/r"; mkdir -p "$r"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$r/gpu.txt"
M=(--model dummy:Qwen3-0.6B)
timeout 60 python -m minisgl_cli bench-serve --client-check --json "$r/client_check.json" 2>&1 | tail -4
inproc() {  # name, flags...
  timeout 170 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl "${M[@]}" --quiet --json "$r/$1_$c.json" "${@:2}" \
    > "$r/$1.log" 2>&1 || echo "$1 failed: $?"
}
inproc inproc_x5 --time-scale 0.2
(timeout 400 python -m minisgl_cli serve "${M[@]}" --port 8200 --log-level warning > "$r/serve.log" 2>&1 &)
for i in $(seq 1 180); do curl -sf http://127.0.0.1:8200/health >/dev/null && break; sleep 1; done
inproc serve_x5 --time-scale 0.2 --url http://127.0.0.1:8200
inproc serve_x1_400 --time-scale 1.0 --num-requests 400 --url http://127.0.0.1:8200
pkill -INT -f "minisgl_cli serve"
for i in $(seq 1 30); do pgrep -f "minisgl_cli serve" >/dev/null || break; sleep 1; done
pgrep -fa "minisgl" && echo "LEFT BEHIND" || echo "serve: no process left"
inproc inproc_x1_400 --time-scale 1.0 --num-requests 400
inproc nomixed_x5 --time-scale 0.2 --no-mixed-batch
if [ -f .whl/a991c5d.tgz ]; then
  mkdir -p /tmp/old && tar xzf .whl/a991c5d.tgz -C /tmp/old
  (cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 170 python -m minisgl_cli bench-trace traces/qwen_1000.jsonl \
    "${M[@]}" --time-scale 0.2 --quiet --json "$r/a991c5d_x5.json" > "$r/a991c5d.log" 2>&1 || echo "old failed")
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
