#!/usr/bin/env bash
# FlashInfer's JIT cache (~/.cache/flashinfer) between GPU sessions, on the GPU machine, from the project root:
#   bash benchmarks/fi_cache.sh restore       unpack a carried .whl/fi-cache.txz (or an older .whl/fi-cache.tgz), once
#                                             per machine (.restored marks it: later calls keep what was built since)
#   bash benchmarks/fi_cache.sh save "$OUT"   write $OUT/fi-cache.txz: every module built so far
# xz, since a file comes back from $OUT only under 16 MiB: the GPU tests' modules are 8.6 MB so, 24 MB with gzip
# (thirty-ninth session). Keep the returned file as .whl/fi-cache.txz. Neither step fails its caller.
case ${1:-} in
  restore)
    if [ ! -f ~/.cache/flashinfer/.restored ]; then
      if [ -f .whl/fi-cache.txz ]; then tar xJf .whl/fi-cache.txz -C ~ 2>/dev/null && touch ~/.cache/flashinfer/.restored
      elif [ -f .whl/fi-cache.tgz ]; then tar xzf .whl/fi-cache.tgz -C ~ 2>/dev/null && touch ~/.cache/flashinfer/.restored
      fi
    fi
    true ;;
  save)
    [ -d ~/.cache/flashinfer ] && tar cJf "${2:?save needs the output folder}/fi-cache.txz" -C ~ .cache/flashinfer
    true ;;
  *) echo "usage: $0 restore | save OUTDIR" >&2; exit 2 ;;
esac
