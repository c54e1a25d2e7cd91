#!/usr/bin/env bash
# Issue #18 on the GPU: Qwen2.5 / Mistral / Qwen3-MoE checks, Qwen3-30B-A3B's offline throughput and decode-step
# profile, and the real SmolLM2 GGUF against transformers. Stages (several per call are fine, in this order):
#   split    (here, not there) cut the embedded GGUF (98 MB) into .whl/gguf/part.NN of $PART (27M) + a manifest: a part
#            and the bundle fit one call's 64 MiB carry (PART=48M: two parts, for calls that carry no bundle)
#   stash    (every stage does this first) copy the carried .whl/gguf/ parts to ~/minisgl-gguf and join them once
#            all the manifest's parts have arrived (sha256 checked)
#   tests    the new GPU tests of tests/test_gpu.py (fused MoE, presets vs transformers); ALL=1: the whole file
#   real     benchmarks/real_checkpoint_gpu.py on the joined GGUF (20 prompts, 64 tokens, bf16, FlashInfer)
#   bench    bench-offline on dummy:Qwen3-30B-A3B (61 GB of bf16 weights: use an H200), with its floor fraction
#   profile  benchmarks/step_profile.py on dummy:Qwen3-30B-A3B, with the kernel breakdown
#   chat     benchmarks/run_gpu_chat_gguf.sh on the joined GGUF: the engine alone, `chat --no-tui` and the TUI in tmux
#            (the bundle must hold Textual: docs/gpu.md, "Running it")
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_models.sh tests real
# Everything lands in $OUT as models_<stages>_<commit>.tgz, summary_<commit>.txt and fi-cache.txz (keep the last in
# .whl/ for the next run: it skips FlashInfer's JIT).
set -u
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests real bench profile)
c=${MINISGL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}  # the tree there may carry a stale .git
parts=.whl/gguf
store=$HOME/minisgl-gguf
gguf=$store/SmolLM2-135M-Instruct.Q4_1.gguf

if [ "${stages[0]}" = split ]; then
  src=$(python -c "from engine.model_source import embedded_default_path as p; print(p())") || exit 1
  rm -rf "$parts" && mkdir -p "$parts"
  split -b "${PART:-27M}" -d "$src" "$parts/part."
  (cd "$parts" && sha256sum "$src" | cut -d' ' -f1 > manifest && ls part.* >> manifest)
  ls -l "$parts" && exit 0
fi

work=$(mktemp -d)
summary=$OUT/summary_$c.txt
log() { echo "$@" | tee -a "$summary"; }
bash benchmarks/fi_cache.sh restore
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"
python -c "import torch, triton, transformers, flashinfer as f; print('torch', torch.__version__, 'triton',
triton.__version__, 'transformers', transformers.__version__, 'flashinfer', f.__version__)" | tee -a "$summary"

# stash: parts carried in this call go to ~/minisgl-gguf (a carried path is gone again in the next call)
mkdir -p "$store"
if [ -f "$parts/manifest" ]; then
  cp "$parts/manifest" "$store/"
  cp "$parts"/part.* "$store/" 2>/dev/null || true
fi
if [ ! -f "$gguf" ] && [ -f "$store/manifest" ]; then
  names=$(tail -n +2 "$store/manifest")
  if (cd "$store" && ls $names >/dev/null 2>&1); then
    (cd "$store" && cat $names > "$gguf.tmp")
    if [ "$(sha256sum "$gguf.tmp" | cut -d' ' -f1)" = "$(head -1 "$store/manifest")" ]; then
      mv "$gguf.tmp" "$gguf" && log "gguf joined: $gguf"
    else
      log "gguf parts joined to the wrong checksum; carry them again"
    fi
  else
    log "gguf parts so far: $(cd "$store" && ls part.* 2>/dev/null | tr '\n' ' ')(need: $(echo $names))"
  fi
fi

for s in "${stages[@]}"; do
  t0=$(date +%s)
  case $s in
    stash) ;;
    tests)
      k=${ALL:+"not tp2"}
      timeout 420 python -m pytest -q -p no:cacheprovider tests/test_gpu.py -s -k "${k:-moe or new_presets}" \
        > "$work/pytest_gpu_models.txt" 2>&1
      log "tests: rc=$?"; grep -E "engine vs fp32|passed|failed|Error" "$work/pytest_gpu_models.txt" | tail -n 12 | tee -a "$summary"
      ;;
    real)
      if [ ! -f "$gguf" ]; then log "real: skipped, no GGUF yet (carry .whl/gguf/manifest and the parts)"; continue; fi
      timeout 420 python benchmarks/real_checkpoint_gpu.py --gguf "$gguf" --out "$work/real_checkpoint_$c.json" \
        > "$work/real_checkpoint.log" 2>&1
      log "real: rc=$?"; grep -E "identical|difference" "$work/real_checkpoint.log" | tee -a "$summary"
      ;;
    bench)
      timeout 480 python -m minisgl_cli bench-offline --model dummy:Qwen3-30B-A3B --runs 2 \
        --json "$work/bench_offline_qwen3-30b-a3b_$c.json" > "$work/bench_offline.log" 2>&1
      log "bench: rc=$?"; tail -n 16 "$work/bench_offline.log" | tee -a "$summary"
      ;;
    profile)
      timeout 480 python benchmarks/step_profile.py --model dummy:Qwen3-30B-A3B --kernels \
        --out "$work/step_profile_qwen3-30b-a3b_$c.json" > "$work/step_profile.log" 2>&1
      log "profile: rc=$?"; tail -n 40 "$work/step_profile.log" | tee -a "$summary"
      ;;
    chat)
      if [ ! -f "$gguf" ]; then log "chat: skipped, no GGUF yet (carry .whl/gguf/manifest and the parts)"; continue; fi
      OUT=$work timeout 540 bash benchmarks/run_gpu_chat_gguf.sh "$gguf" > "$work/chat_gguf.log" 2>&1
      log "chat: rc=$?"; tail -n 60 "$work/chat_gguf.log" | tee -a "$summary"
      ;;
    *) log "unknown stage $s (split, stash, tests, real, bench, profile, chat)" ;;
  esac
  log "stage $s: $(( $(date +%s) - t0 )) s"
done

cp "$summary" "$work/"
tar czf "$OUT/models_$(IFS=-; echo "${stages[*]}")_$c.tgz" -C "$work" .
bash benchmarks/fi_cache.sh save "$OUT"
rm -rf "$work"
