#!/usr/bin/env bash
# A long request among many short ones (flashinfer_backend.fixed_split_pages): the GPU tests that cover decode plans and
# graphs, then benchmarks/long_context_decode.py at ROWS (default "256 64") rows.
# Usage there: source .whl/use-bundle.sh && bash benchmarks/run_gpu_long_context.sh
set -u
bash benchmarks/fi_cache.sh restore
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format=%h 2>/dev/null
if [ "${TESTS:-1}" = 1 ]; then
  timeout 420 python -m pytest -q -x tests/test_gpu.py -k "${TEST_K:-fixed_split or decode_without_split or piecewise or cuda_graphs_and_overlap or flashinfer_matches_torch}" \
    2>&1 | tail -n 15 | tee "$OUT/pytest_long_context.txt"
fi

for rows in ${ROWS:-256 64}; do
  timeout 300 python benchmarks/long_context_decode.py --rows "$rows" --rounds "${ROUNDS:-2}" --out "$OUT/long_context_$rows.json"
done
bash benchmarks/fi_cache.sh save "$OUT"
