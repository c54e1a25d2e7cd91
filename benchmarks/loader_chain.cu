// The read chain of benchmarks/phase_boundaries.py (Qwen3-0.6B's 112 projection matrices read in turn) as one
// persistent CUDA kernel whose loader runs ahead of the grid barriers; a benchmark, not in the engine
// (benchmarks/loader_chain.py says what it asks).
//
// One CTA per SM. Warp 0's first lane is the loader: it brings the CTA's share of each matrix through a ring of
// shared-memory stages with the copy engine (cp.async.bulk, one mbarrier per stage that the bytes complete). The
// other warps consume: each stage is summed (so every byte is read), then handed back to the loader. Between
// matrices the consumers pass a grid-wide barrier, as a decode megakernel's phases would wait for the previous
// phase's output. The weights depend on no phase, so with `runahead` the loader does not wait for the barrier: it
// keeps the ring full with the next matrix's bytes while the consumers wait. Without it the loader waits until the
// consumers have passed the barrier (a persistent kernel that loads only after its dependency). Launched once per
// matrix (n = 1) it is the same work as separate kernels.
#include <cuda_runtime.h>
#include <stdint.h>

#include "../kernels/cuda/async_copy.cuh"

namespace {

constexpr int MAX_STAGES = 16;
constexpr long long SPIN_LIMIT = 1ll << 26;  // polls before a barrier gives up (sets *flag): CTAs not all resident

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int ld_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void consumers_sync(int threads) {
  asm volatile("bar.sync 1, %0;\n" ::"r"(threads) : "memory");
}

struct Args {
  const char* w;
  const long long* offs;   // [phases] byte offset of each matrix in w
  const long long* sizes;  // [phases] bytes, multiples of 16
  int first, n;            // the phases this launch runs
  float* out;              // [phases * grid] each CTA's sum of its share
  int* counter;            // grid barrier arrivals, zero at the first launch of a chain
  int* flag;               // set when a barrier gave up
  int read;        // 0: no reads, the barriers alone
  int runahead;    // 0: the loader waits for each barrier, 1: it does not, 2: no barriers (the reads alone)
  int chunk;       // bytes per stage, a multiple of 16
  int stages;      // stages in the ring, at most MAX_STAGES
  int interleave;  // 0: each CTA reads an equal contiguous share of a matrix, 1: every grid-th chunk
};

// This CTA's chunks of matrix p: o = start, start + step, ... < end, each min(chunk, limit - o) bytes. Contiguous:
// an equal share (a multiple of 16 bytes) cut into chunks. Interleaved: chunks cta, cta + grid, ... of the matrix, so
// that the CTAs together read one region of it at a time, as the Triton chains' programs do.
struct Chunks {
  long long start, step, end, limit;
};
__device__ __forceinline__ Chunks chunks(const Args& a, int p) {
  const long long size = a.sizes[p];
  if (a.interleave)
    return {static_cast<long long>(blockIdx.x) * a.chunk, static_cast<long long>(gridDim.x) * a.chunk, size, size};
  const long long per = ((size + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
  const long long lo = min(size, per * blockIdx.x), hi = min(size, lo + per);
  return {lo, a.chunk, hi, hi};
}

__global__ void __launch_bounds__(32 * 9, 1) chain(Args a) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[MAX_STAGES], empty[MAX_STAGES];
  __shared__ volatile int released;  // phases whose barrier the consumers have passed (the loader waits without runahead)
  __shared__ float part[8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int consumers = blockDim.x / 32 - 1, nct = consumers * 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < a.stages; ++s) {
      mbar_init(smem(&full[s]), 1);
      mbar_init(smem(&empty[s]), consumers);
    }
    released = a.first;
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp == 0) {  // the loader
    if (lane != 0 || !a.read) return;
    int it = 0;  // chunks issued: stage it % stages, in its (it / stages)-th pass
    for (int p = a.first; p < a.first + a.n; ++p) {
      if (!a.runahead)
        while (released < p) {
        }
      const Chunks c = chunks(a, p);
      for (long long o = c.start; o < c.end; o += c.step, ++it) {
        const int bytes = static_cast<int>(min(static_cast<long long>(a.chunk), c.limit - o));
        const int s = it % a.stages, pass = it / a.stages;
        if (pass > 0) mbar_wait(smem(&empty[s]), (pass - 1) & 1);
        mbar_expect_tx(smem(&full[s]), bytes);
        bulk_copy(smem(ring + static_cast<size_t>(s) * a.chunk), a.w + a.offs[p] + o, bytes, smem(&full[s]));
      }
    }
    return;
  }

  const int ct = threadIdx.x - 32;
  int it = 0;
  for (int p = a.first; p < a.first + a.n; ++p) {
    float acc = 0.f;
    if (a.read) {
      const Chunks c = chunks(a, p);
      for (long long o = c.start; o < c.end; o += c.step, ++it) {
        const int bytes = static_cast<int>(min(static_cast<long long>(a.chunk), c.limit - o));
        const int s = it % a.stages, pass = it / a.stages;
        mbar_wait(smem(&full[s]), pass & 1);
        const uint4* src = reinterpret_cast<const uint4*>(ring + static_cast<size_t>(s) * a.chunk);
        for (int i = ct; i < bytes / 16; i += nct) {
          const uint4 v = src[i];
          const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) acc += __uint_as_float(words[j] << 16) + __uint_as_float(words[j] & 0xffff0000u);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(smem(&empty[s]));
      }
    }
#pragma unroll
    for (int d = 16; d > 0; d /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, d);
    if (lane == 0) part[warp - 1] = acc;
    consumers_sync(nct);
    if (ct == 0) {
      float sum = 0.f;
      for (int i = 0; i < consumers; ++i) sum += part[i];
      a.out[static_cast<size_t>(p) * gridDim.x + blockIdx.x] = sum;
    }
    if (p + 1 < a.first + a.n && a.runahead != 2) {  // the grid barrier (runahead 2: none, the reads alone)
      if (ct == 0) {
        const int target = (p + 1 - a.first) * gridDim.x;
        long long spins = 0;
#ifdef BARRIER_RELEASE
        // a release reduction and acquire polls (benchmarks/grid_barrier.cu's `counter`: 0.97 us on an H200)
        asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(a.counter) : "memory");
        while (ld_acquire(a.counter) < target && ++spins < SPIN_LIMIT) {
        }
#else
        __threadfence();
        atomicAdd(a.counter, 1);
        while (ld_relaxed(a.counter) < target && ++spins < SPIN_LIMIT) {
        }
        __threadfence();
#endif
        if (spins >= SPIN_LIMIT) atomicAdd(a.flag, 1);
        released = p + 1;
      }
      consumers_sync(nct);
    }
  }
}

}  // namespace

extern "C" int loader_chain_launch(const void* w, const void* offs, const void* sizes, int first, int n, void* out,
                                   void* counter, void* flag, int read, int runahead, int chunk, int stages,
                                   int interleave, int consumer_warps, int grid, void* stream) {
  if (stages < 1 || stages > MAX_STAGES || chunk % 16 || consumer_warps < 1 || consumer_warps > 8) return -1;
  const int ring_bytes = chunk * stages;
  cudaError_t err = cudaFuncSetAttribute(chain, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_bytes);
  if (err != cudaSuccess) return static_cast<int>(err);
  Args a{static_cast<const char*>(w), static_cast<const long long*>(offs), static_cast<const long long*>(sizes),
         first, n, static_cast<float*>(out), static_cast<int*>(counter), static_cast<int*>(flag),
         read, runahead, chunk, stages, interleave};
  chain<<<grid, 32 * (1 + consumer_warps), ring_bytes, static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}
