// Issue #17: asks L2 to fetch a range of global memory (a GEMM's weights, ahead of the GEMM), with Hopper's bulk L2
// prefetch: one thread per CTA issues `cp.async.bulk.prefetch.L2` for its chunks and the CTA exits at once (the
// prefetch has no completion to wait for). Built by kernels/cuda_build.py; used by resident_gemm.py's `cublaspf`.
#include <cuda_runtime.h>
#include <cstdint>

constexpr unsigned CHUNK = 1u << 16;  // bytes per prefetch instruction

__global__ void prefetch_kernel(const char* base, unsigned long long bytes) {
  if (threadIdx.x != 0) return;
  for (unsigned long long off = (unsigned long long)blockIdx.x * CHUNK; off < bytes;
       off += (unsigned long long)gridDim.x * CHUNK) {
    unsigned size = (unsigned)min((unsigned long long)CHUNK, bytes - off) & ~15u;
    if (size) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off), "r"(size) : "memory");
  }
}

// `bytes` from `ptr` (16-byte aligned) requested into L2 by `ctas` CTAs on `stream`; returns the launch's error code.
extern "C" int prefetch_l2(const void* ptr, unsigned long long bytes, int ctas, cudaStream_t stream) {
  prefetch_kernel<<<ctas, 32, 0, stream>>>(static_cast<const char*>(ptr), bytes);
  return (int)cudaGetLastError();
}
