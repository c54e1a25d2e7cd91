#!/usr/bin/env bash
# The chat and serve layouts (engine loop in the parent, front end in a child) on the GPU machine: a two-turn
# `chat --no-tui` and one `serve` completion, then Ctrl-C; torch attention so no FlashInfer JIT build is needed.
# run() with carry [".whl/device-bundle.tgz", ".whl/use-bundle.sh"]: bash benchmarks/run_gpu_chat_serve_smoke.sh
set -u; source .whl/use-bundle.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="--model dummy:Qwen3-0.6B --attention-backend torch"
printf 'Write a long story about a dragon.\nAnd another one.\n' | timeout 100 python -m minisgl_cli chat --no-tui --no-save $M --max-tokens 64 > /dev/null 2> $OUT/chat_gpu_stderr.txt
echo "chat rc=$?"; grep "^\[" $OUT/chat_gpu_stderr.txt
python -m minisgl_cli serve $M --port 8321 > $OUT/serve_gpu.log 2>&1 &
S=$!
for i in $(seq 1 90); do curl -sf localhost:8321/health >/dev/null && break; sleep 1; done
curl -s localhost:8321/v1/completions -H 'content-type: application/json' -d '{"model":"dummy:Qwen3-0.6B","prompt":"hello","max_tokens":16}' | head -c 300; echo
kill -INT $S; wait $S; echo "serve rc=$?"
sleep 1; pgrep -af "minisgl_cli" | grep python || echo "no minisgl process left"
