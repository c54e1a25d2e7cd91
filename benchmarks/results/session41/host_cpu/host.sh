#!/bin/bash
# the session's two CPU kernel A/Bs on the GPU host's CPU (C only: random blocks and pools)
set -e
cd "$(dirname "$0")"
mk() { sed "s/^void q4_1_matmul/void q4_1_matmul_$2/; s/^void q8_0_matmul/void q8_0_matmul_$2/; s/^void decode_attention_f32/void decode_attention_f32_$2/; s/^void \(rmsnorm_f32\|rope_f32\|silu_mul_f32\)/static void \1/" $1 > $2.c; }
mk before.c orig; mk after.c new
lscpu | head -20; gcc --version | head -1
for a in native haswell; do
  gcc -O3 -march=$a -fopenmp orig.c new.c c_bench.c -o cb_$a -lm -w
  gcc -O3 -march=$a -fopenmp orig.c new.c attention_bench.c -o ab_$a -lm -w
done
for a in native haswell; do
  echo "== -march=$a"
  for t in 1 2; do
    for M in 1 4 16; do echo -n "threads $t: "; OMP_NUM_THREADS=$t taskset -c 0,1 ./cb_$a $M | tail -1; done
    for c in "9 3 1 150" "9 3 1 600" "9 3 1 2000" "9 3 16 150" "32 8 1 600"; do echo -n "threads $t: "; OMP_NUM_THREADS=$t taskset -c 0,1 ./ab_$a $c; done
  done
done
