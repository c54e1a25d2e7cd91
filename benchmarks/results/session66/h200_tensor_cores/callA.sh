set -u
export PATH=/usr/local/cuda/bin:$PATH
bash benchmarks/fi_cache.sh restore
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log --oneline -1 2>/dev/null
echo "== G=4 kernels"
python benchmarks/decode_attention_kernels.py --kv-dtypes bf16 --graph --lens offline-run8 --heads 32/8,16/4 --batches 256,128,64,32,16 --kernels fi-tc,cuda-ht-spans-cc,cuda-ht-spans-tc --repeat 1 --out $OUT/g4.json 2>&1 | grep -v "^$" | grep -v INFO | grep "repeat\| us " | awk 'NR%1==0' | tail -60 > $OUT/g4.txt; tail -30 $OUT/g4.txt
echo "== tests"
timeout 200 python -m pytest -q -n 4 tests/test_gpu.py -m gpu -k "cuda_decode or flashinfer_matches_torch or engine_decodes_a_16 or graphs_and_overlap or mixed_batch_parts" 2>&1 | tail -5
echo "== A/B with kernels"
python benchmarks/step_profile.py --variant base --variant cuda-cores --kernels --out $OUT/ab_kernels.json 2>&1 | grep -v INFO | tail -30
bash benchmarks/fi_cache.sh save "$OUT"
