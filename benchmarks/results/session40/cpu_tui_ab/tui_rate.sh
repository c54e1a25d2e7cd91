#!/usr/bin/env bash
# tui_rate.sh LABEL [env assignments...]: the chat TUI in tmux answers one prompt (512 tokens, temperature 0); prints
# the panel's decode line. Run from the repo root.
label=$1; shift
tmux kill-session -t ab 2>/dev/null
tmux new-session -d -s ab -x 140 -y 40 "cd $PWD && env $* .venv/bin/minisgl chat --no-save --max-tokens 512 -t 0; sleep 30"
for i in $(seq 60); do tmux capture-pane -pt ab | grep -q "Message (Enter" && break; sleep 1; done
sleep 1
tmux send-keys -t ab "Write a long story about a dragon who learns to cook." Enter
sleep 3
for i in $(seq 120); do
  tmux capture-pane -pt ab | grep -q "tokens .* / 512 out" && break; sleep 1
done
sleep 1
echo "$label: $(tmux capture-pane -pt ab | grep -o 'decode  *[0-9.]* tok/s' | head -1) $(tmux capture-pane -pt ab | grep -o 'p50 / p90  *[0-9.]* / [0-9.]* ms' | head -1)"
tmux send-keys -t ab C-q; sleep 2; tmux kill-session -t ab 2>/dev/null
