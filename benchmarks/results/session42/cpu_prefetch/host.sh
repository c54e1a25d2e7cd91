#!/bin/bash
# kernels/cpu_ops.c before (orig) and after (new) the prefetch, C only, on whatever CPU runs it: pinned to 2 cores.
# First, from the project root, B this folder: git show 0215ab5:kernels/cpu_ops.c > B/before.c, and kernels/cpu_ops.c
# as of the commit that added this folder (the prefetch) copied to B/after.c.
set -e
cd "$(dirname "$0")"
mk() { sed "s/^void q4_1_matmul/void q4_1_matmul_$2/; s/^void q8_0_matmul/void q8_0_matmul_$2/; s/^void \(rmsnorm_f32\|rope_f32\|silu_mul_f32\|decode_attention_f32\)/static void \1/" $1 > /tmp/$2.c; }
mk before.c orig; mk after.c new
lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"; gcc --version | head -1
for a in native haswell; do
  gcc -O3 -march=$a -fopenmp /tmp/orig.c /tmp/new.c pass_bench.c -o /tmp/pb_$a -lm -w
  echo "== -march=$a"
  for t in 1 2; do for M in 1 4; do echo -n "threads $t: "; OMP_NUM_THREADS=$t taskset -c 0,1 /tmp/pb_$a $M; done; done
done
