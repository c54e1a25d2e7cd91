set -u
export PATH=/usr/local/cuda/bin:$PATH
bash benchmarks/fi_cache.sh restore
timeout 330 python -m pytest -q -n 4 -x tests/test_gpu.py -m gpu -k "cuda_decode or flashinfer_matches_torch or engine_decodes_a_16 or graphs_and_overlap or mixed_batch_parts" 2>&1 | tail -8
bash benchmarks/fi_cache.sh save "$OUT"
