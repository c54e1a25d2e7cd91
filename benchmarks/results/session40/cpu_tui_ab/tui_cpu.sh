#!/usr/bin/env bash
# tui_cpu.sh LABEL [env...]: as tui_rate.sh, plus the chat process's and the engine process's CPU (cores) over 10 s
label=$1; shift
tmux kill-session -t ab 2>/dev/null
tmux new-session -d -s ab -x 140 -y 40 "cd $PWD && exec env $* .venv/bin/python -m minisgl_cli chat --no-save --max-tokens 512 -t 0"
for i in $(seq 60); do tmux capture-pane -pt ab | grep -q "Message (Enter" && break; sleep 1; done
sleep 1
F=$(pgrep -f "minisgl_cli.tui.frontend" | head -1); E=$(ps -o ppid= -p $F | tr -d ' ')
ticks() { awk '{print $14+$15}' /proc/$1/stat; }
tmux send-keys -t ab "Write a long story about a dragon who learns to cook." Enter; sleep 4
e0=$(ticks $E); f0=$(ticks $F); t0=$(date +%s.%N); sleep 10; e1=$(ticks $E); f1=$(ticks $F); t1=$(date +%s.%N)
for i in $(seq 120); do tmux capture-pane -pt ab | grep -q "tokens .* / 512 out" && break; sleep 1; done
sleep 1
cpu=$(python3 -c "dt=$t1-$t0; print(f'engine {($e1-$e0)/100/dt:.2f} cores, chat {($f1-$f0)/100/dt:.2f} cores')")
echo "$label: $(tmux capture-pane -pt ab | grep -o 'decode  *[0-9.]* tok/s' | head -1) $(tmux capture-pane -pt ab | grep -o 'p50 / p90  *[0-9.]* / [0-9.]* ms' | head -1); $cpu"
tmux send-keys -t ab C-q; sleep 2; tmux kill-session -t ab 2>/dev/null
