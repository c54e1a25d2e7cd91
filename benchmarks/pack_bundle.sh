#!/usr/bin/env bash
# Repacks ../shared/gpu/make-bundle.sh's .whl/device-bundle.tgz (36 MB) with xz (22 MB), so that one run() call
# carries the tree (~26 MB), the bundle and FlashInfer's JIT cache (.whl/fi-cache.txz: every module the GPU tests
# build, 8.6 MB with xz, 24 MB with gzip) under its 64 MiB: a fresh GPU machine then skips FlashInfer's JIT builds
# (the single-GPU tests' first run spent ~5 of its 8 minutes in them, thirty-eighth and thirty-ninth sessions; two
# SmolLM2 engines started in 23 s with the cache). Also writes .whl/use-bundle.sh, which takes either bundle.
# Usage (here, from the project root, after make-bundle.sh): bash benchmarks/pack_bundle.sh
# Then run() with carry [".whl/device-bundle.txz", ".whl/use-bundle.sh", ".whl/fi-cache.txz"] and a command starting
#   source .whl/use-bundle.sh && ...
# A run that built more modules leaves them in $OUT/fi-cache.txz (run_gpu_vllm_compare.sh's bench and tests stages;
# a file comes back from $OUT only under 16 MiB, which the gzip one was not): copy it over .whl/fi-cache.txz.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ -f .whl/device-bundle.tgz ] || { echo "no .whl/device-bundle.tgz: run ../shared/gpu/make-bundle.sh first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf .whl/device-bundle.tgz -C "$tmp"
tar cf - -C "$tmp" . | xz -T0 -9 > .whl/device-bundle.txz
cat > .whl/use-bundle.sh <<'SH'
# Source this at the start of a command on the GPU machine, from the project root, with .whl/ carried along:
#   source .whl/use-bundle.sh
# (written by benchmarks/pack_bundle.sh) Unpacks the bundle (.whl/device-bundle.txz, or make-bundle.sh's .tgz) into
# /tmp/site once per machine, restores FlashInfer's JIT cache from a carried .whl/fi-cache.txz (benchmarks/fi_cache.sh),
# and puts the bundle and the project on PYTHONPATH.
if [ ! -f /tmp/site/.unpacked ]; then
  mkdir -p /tmp/site
  if [ -f .whl/device-bundle.txz ]; then
    python -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
      .whl/device-bundle.txz /tmp/site
  else
    tar xzf .whl/device-bundle.tgz -C /tmp/site
  fi && touch /tmp/site/.unpacked
fi
bash benchmarks/fi_cache.sh restore
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
SH
du -h .whl/device-bundle.txz
