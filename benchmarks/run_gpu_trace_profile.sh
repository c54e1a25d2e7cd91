#!/usr/bin/env bash
# Issue #15's saturating replay in-process (bench-trace traces/qwen_1000.jsonl --time-scale 0.2, dummy Qwen3-0.6B)
# under py-spy (from the device bundle, docs/gpu.md "Running it"), with the engine's step log: where the
# engine thread's wall time goes between steps. Usage there:
#   source .whl/use-bundle.sh && FLAGS="..." NAME=mixed bash benchmarks/run_gpu_trace_profile.sh
# Results: $OUT/profile_$NAME.txt (py-spy summary per thread + the step summary) and $OUT/profile_$NAME.tgz.
set -u
bash benchmarks/fi_cache.sh restore
name=${NAME:-mixed}
d="$OUT/profile_$name"
mkdir -p "$d"
spy=$(ls /tmp/site/py_spy-*.data/scripts/py-spy)
chmod +x "$spy"
# SPY_FLAGS: e.g. "-g" (only samples that hold the GIL); PRE: Python run before the CLI (e.g. "import sys; sys.setswitchinterval(2e-4)").
timeout 400 "$spy" record -r ${RATE:-200} -t -i ${SPY_FLAGS:-} --nonblocking -f raw -o "$d/pyspy.txt" -- \
  python -c "${PRE:-pass}; import sys; sys.argv[0] = 'minisgl'; from minisgl_cli.app import main; main()" bench-trace traces/qwen_1000.jsonl --model dummy:Qwen3-0.6B --time-scale 0.2 \
  --quiet ${FLAGS:-} --json "$d/trace.json" --step-log "$d/steps.jsonl" > "$d/log.txt" 2>&1
tail -3 "$d/log.txt"
python benchmarks/trace_line.py "$d/trace.json" "$name" | tee "$OUT/profile_$name.txt"
python benchmarks/step_log_summary.py "$d/steps.jsonl" | tee -a "$OUT/profile_$name.txt"
python benchmarks/pyspy_summary.py "$d/pyspy.txt" --top 60 >> "$OUT/profile_$name.txt"
gzip -f "$d"/steps.jsonl "$d/pyspy.txt"
tar czf "$OUT/profile_$name.tgz" -C "$OUT" "profile_$name" && rm -rf "$d"
[ -f .whl/fi-cache.txz ] || bash benchmarks/fi_cache.sh save "$OUT"
