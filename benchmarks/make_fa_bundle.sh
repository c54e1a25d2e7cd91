#!/usr/bin/env bash
# Builds the FlashAttention-4 bundle for the offline GPU machine (Python 3.12, torch 2.11+cu130). Run here, from the
# project root:   benchmarks/make_fa_bundle.sh
# Downloads the pinned wheels (cp312, manylinux x86_64) into .whl/fa-wheels, unpacks them into one site dir, drops
# what an x86-64 run never loads (aarch64/QNX stubs), packs it as tar.xz and splits it into parts of 24 MiB:
#     .whl/fa/SHA256SUMS     sha256 of the whole archive and of each part
#     .whl/fa/pNN/           fa-site.tar.xz.partNN and a copy of SHA256SUMS
# A GPU call carries at most 64 MiB with the tree (27 MB at the fortieth session: a 39 MiB part no longer fits beside
# it), so carry one pNN dir per call; benchmarks/run_gpu_fa.sh assembles them
# (its header has the call sequence). The apache-tvm-ffi that FA4 needs comes from the project bundle
# (.whl/device-bundle.tgz, 0.1.15.post2); cuda-bindings, cuda-pathfinder, protobuf and einops go under _compat/ and
# are put on the path there only where the machine lacks them (run_gpu_fa.sh env).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
WHL=.whl/fa-wheels BUILD=.whl/fa-build OUTDIR=.whl/fa NAME=fa-site.tar.xz PART_MIB=${PART_MIB:-24}
PY=${PYTHON:-python3}
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
PKGS=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
      torch-c-dlpack-ext==0.1.5)
COMPAT=(cuda-bindings==13.5.0 cuda-pathfinder==1.9.0 protobuf==7.36.2 einops==0.8.1)
mkdir -p "$WHL"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$WHL" "${PKGS[@]}" "${COMPAT[@]}" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
wheel_of() { local n=${1%%==*} v=${1##*==}; n=${n//-/_}; ls "$WHL/$n-$v-"*.whl 2>/dev/null | head -1; }
rm -rf "$BUILD"; trap 'rm -rf "$BUILD"' EXIT
STAGE=$BUILD/site; mkdir -p "$STAGE"
for p in "${PKGS[@]}"; do f=$(wheel_of "$p"); [ -n "$f" ] || { echo "no wheel for $p"; exit 1; }; "$PY" -m zipfile -e "$f" "$STAGE"; done
for p in "${COMPAT[@]}"; do
  f=$(wheel_of "$p"); [ -n "$f" ] || { echo "no wheel for $p"; exit 1; }
  mkdir -p "$STAGE/_compat/${p%%==*}"; "$PY" -m zipfile -e "$f" "$STAGE/_compat/${p%%==*}"
done
rm -rf "$STAGE"/nvidia_cutlass_dsl/cu13/lib/stubs   # aarch64 / QNX stub libraries
find "$STAGE" -name __pycache__ -type d -prune -exec rm -rf {} +
[ -f "$STAGE/flash_attn/cute/interface.py" ] || { echo "flash_attn/cute missing"; exit 1; }
UNPACKED=$(du -sh "$STAGE" | cut -f1)
echo "packing (xz -9)"
tar -C "$STAGE" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . | xz -9 -T0 -c > "$BUILD/$NAME"
split -b "${PART_MIB}M" -d -a 2 "$BUILD/$NAME" "$BUILD/$NAME.part"
(cd "$BUILD" && sha256sum "$NAME" "$NAME".part*) > "$BUILD/SHA256SUMS"
rm -rf "$OUTDIR"; mkdir -p "$OUTDIR"; cp "$BUILD/SHA256SUMS" "$OUTDIR/"
for f in "$BUILD/$NAME".part*; do d=$OUTDIR/p${f##*.part}; mkdir -p "$d"; mv "$f" "$d/"; cp "$OUTDIR/SHA256SUMS" "$d/"; done
(cd "$OUTDIR" && for d in p*/; do (cd "$d" && sha256sum --quiet -c --ignore-missing SHA256SUMS) || exit 1; done)
[ "$(cat "$OUTDIR"/p*/"$NAME".part* | sha256sum | cut -d' ' -f1)" = "$(awk -v n="$NAME" '$2 == n {print $1}' "$OUTDIR/SHA256SUMS")" ] \
  || { echo "parts do not rebuild the archive"; exit 1; }
echo "unpacked: $UNPACKED  packed: $(stat -c %s "$BUILD/$NAME") bytes  parts: $(ls -d "$OUTDIR"/p* | wc -l)"
cat "$OUTDIR/SHA256SUMS"; ls -la "$OUTDIR"/p*
