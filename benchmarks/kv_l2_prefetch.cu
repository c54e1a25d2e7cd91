// Asks L2 for the first pages of a decode attention's KV while the GEMMs before it run (benchmarks/kv_l2_prefetch.py).
// The decode attention reads HBM at its rate; the GEMM phase between two attentions (o, gate_up, down, qkv) is
// latency-bound and leaves most of the bandwidth idle. Pages brought into L2 there are bytes the attention does not
// read from HBM. One thread per page: a bulk prefetch of its K and of its V ([pages, 16, kv_heads, 128] pools, a
// page of all KV heads contiguous), fire and forget.
//   mode 0: plain priority; 1: L2::evict_last (kept ahead of the GEMMs' streaming weights); 2: the lines back to
//   evict_normal (applypriority, one thread per 128-byte line), so that evict_last lines do not outstay their read.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void kv_prefetch(const char* k, const char* v, const int* indices, int n_pages, int page_bytes, int mode) {
  const int stride = gridDim.x * blockDim.x;
  if (mode == 2) {
    const int lines = page_bytes / 128;
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < static_cast<long long>(n_pages) * lines;
         i += stride) {
      const long long off = static_cast<long long>(indices[i / lines]) * page_bytes + (i % lines) * 128;
      asm volatile("applypriority.global.L2::evict_normal [%0], 128;\n" ::"l"(k + off) : "memory");
      asm volatile("applypriority.global.L2::evict_normal [%0], 128;\n" ::"l"(v + off) : "memory");
    }
    return;
  }
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_pages; i += stride) {
    const long long off = static_cast<long long>(indices[i]) * page_bytes;
    if (mode == 1) {
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(k + off), "r"(page_bytes),
                   "l"(pol)
                   : "memory");
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(v + off), "r"(page_bytes),
                   "l"(pol)
                   : "memory");
    } else {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(k + off), "r"(page_bytes) : "memory");
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(v + off), "r"(page_bytes) : "memory");
    }
  }
}

extern "C" int kv_prefetch_launch(const void* k, const void* v, const int* indices, int n_pages, int page_bytes,
                                  int mode, int ctas, int threads, void* stream) {
  kv_prefetch<<<ctas, threads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const char*>(k),
                                                                         static_cast<const char*>(v), indices, n_pages,
                                                                         page_bytes, mode);
  return cudaGetLastError();
}
