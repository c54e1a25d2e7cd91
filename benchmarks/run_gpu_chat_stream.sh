#!/usr/bin/env bash
# The chat's stream on the GPU machine: the engine alone (bench-offline, one request), `chat --no-tui`, and the TUI
# in a real terminal (tmux), the same model and answer length. The TUI's row also times, from the Enter key, when its
# panel shows the finished answer: the engine's time for the answer plus whatever the TUI's process lags behind it.
# run() with carry [".whl/device-bundle.tgz", ".whl/use-bundle.sh"] (the bundle with textual and its dependencies:
# docs/gpu.md, "Running it"): MODEL=dummy:SmolLM2-135M bash benchmarks/run_gpu_chat_stream.sh
set -u; source .whl/use-bundle.sh
M=${MODEL:-dummy:SmolLM2-135M}; N=${TOKENS:-512}; ASK="Write a long story about a dragon."
export XDG_DATA_HOME=/tmp/xdg-chat
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
command -v tmux > /dev/null || { echo "no tmux on this machine"; exit 3; }
python -c "import textual; print('textual', textual.__version__)" || exit 3

wait_screen() {  # wait_screen PATTERN SECONDS: poll the TUI's screen until PATTERN shows
  local end=$((SECONDS + $2))
  until tmux capture-pane -p -t chat | grep -q -- "$1"; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.02
  done
}

echo "== engine alone: one request, $N tokens"
python -m minisgl_cli bench-offline --model "$M" --num-seqs 1 --input-len 40:40 --output-len "$N:$N" --temperature 0 \
  --runs 3 --quiet --json "$OUT/engine_alone.json" 2>&1 | tail -12

for i in 1 2; do
  echo "== chat --no-tui, run $i"
  printf '%s\n' "$ASK" | timeout 300 python -m minisgl_cli chat --no-tui --no-save --model "$M" --max-tokens "$N" \
    --temperature 0 > "$OUT/plain_$i.txt" 2>&1
  echo "rc=$?"; grep "^\[" "$OUT/plain_$i.txt"
done

for i in 1 2; do
  echo "== chat (TUI in tmux 140x40), run $i"
  tmux new-session -d -s chat -x 140 -y 40 "python -m minisgl_cli chat --no-save --model $M --max-tokens $N \
    --temperature 0; echo \$? > $OUT/tui_rc_$i"
  wait_screen "Message (Enter" 300 || { echo "the TUI did not come up"; tmux capture-pane -p -t chat; exit 1; }
  sleep 2
  t0=$(date +%s.%N)
  tmux send-keys -t chat "$ASK" Enter
  wait_screen "/ $N out" 120 || echo "the answer did not finish"
  t1=$(date +%s.%N)
  tmux capture-pane -p -t chat > "$OUT/tui_screen_$i.txt"
  python - "$t0" "$t1" "$OUT/tui_screen_$i.txt" "$N" <<'EOF'
import re, sys
t0, t1, path, n = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
screen = open(path).read()
ttft = float(re.search(r"TTFT\s+([\d.]+) ms", screen).group(1)) / 1000
tps = float(re.search(r"decode\s+([\d.]+) tok/s", screen).group(1))
engine = ttft + (n - 1) / tps
print(f"panel: TTFT {ttft * 1000:.1f} ms, decode {tps:.1f} tok/s; Enter to the finished answer on screen "
      f"{t1 - t0:.3f} s, the engine's {engine:.3f} s: the TUI {t1 - t0 - engine:+.3f} s behind "
      f"({n / (t1 - t0):.1f} tok/s as a person saw it)")
EOF
  tmux send-keys -t chat C-q
  for _ in $(seq 1 100); do [ -f "$OUT/tui_rc_$i" ] && break; sleep 0.1; done
  echo "rc=$(cat "$OUT/tui_rc_$i" 2>/dev/null || echo 'still running')"
  tmux kill-session -t chat 2> /dev/null
done
sleep 1; pgrep -af "python.*minisgl_cli" || echo "no minisgl process left"
