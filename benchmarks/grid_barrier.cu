// What a grid-wide barrier costs on one persistent CTA per SM, four ways (benchmarks/grid_barrier.py; issue #17's
// step 3). The thirty-second session's loader chain paid 1.8 us per barrier on an H100 (one counter, every CTA adding
// to it and polling it), as much as most of a decode layer's matrices take to read, which closed the megakernel route
// at that cost. The modes:
//   0 counter:  each CTA's thread 0 adds one to a single counter (release) and polls it (acquire) until every CTA of
//               this round has arrived (the thirty-second session's);
//   1 flags:    each CTA's thread 0 writes the round into its own flag (release); the CTA's threads then poll all the
//               flags, one each (no atomic, no single address every CTA queues on);
//   2 cluster:  the CTAs of a thread-block cluster meet at the hardware cluster barrier, one CTA per cluster then adds
//               to the counter and polls it, and the cluster meets again (the counter takes ctas / cluster arrivals);
//   3 cg:       cooperative groups' grid.sync() (a cooperative launch).
// Every mode runs `rounds` barriers back to back in one launch; the host divides the launch's time by the rounds.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace cg = cooperative_groups;

__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__global__ void barrier_rounds(int mode, int rounds, unsigned* counter, unsigned* flags, int arrivals) {
  const unsigned n = gridDim.x;
  for (int r = 1; r <= rounds; ++r) {
    if (mode == 0) {
      __syncthreads();
      if (threadIdx.x == 0) {
        red_release_add(counter, 1);
        while (ld_acquire(counter) < r * n) {
        }
      }
      __syncthreads();
    } else if (mode == 1) {
      __syncthreads();
      if (threadIdx.x == 0) st_release(flags + blockIdx.x, r);
      for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
        while (ld_acquire(flags + i) < static_cast<unsigned>(r)) {
        }
      }
      __syncthreads();
    } else if (mode == 2) {
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();
      if (cluster.block_rank() == 0 && threadIdx.x == 0) {
        red_release_add(counter, 1);
        while (ld_acquire(counter) < static_cast<unsigned>(r * arrivals)) {
        }
      }
      cluster.sync();
    } else {
      cg::this_grid().sync();
    }
  }
}

// Returns a cudaError_t. cluster > 1: launched in clusters of that many CTAs (mode 2); mode 3: a cooperative launch.
extern "C" int barrier_launch(int mode, int ctas, int cluster, int threads, int rounds, unsigned* counter,
                              unsigned* flags, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int arrivals = cluster > 1 ? ctas / cluster : ctas;
  if (mode == 3) {
    void* args[] = {&mode, &rounds, &counter, &flags, const_cast<int*>(&arrivals)};
    return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(barrier_rounds), dim3(ctas), dim3(threads), args, 0, s);
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(threads);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster > 1 ? cluster : 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, barrier_rounds, mode, rounds, counter, flags, arrivals);
}

// How many clusters of `cluster` CTAs of `threads` threads can be resident at once (all of a mode-2 grid must be).
extern "C" int max_active_clusters(int cluster, int threads) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster * 64);
  cfg.blockDim = dim3(threads);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, barrier_rounds, &cfg) != cudaSuccess) return -1;
  return n;
}

// The alternative to a barrier: a kernel boundary. An empty kernel of `ctas` CTAs, which the host captures in a CUDA
// graph many times over (the time per launch in a graph is what a boundary costs a decode step).
__global__ void empty_kernel() {}

extern "C" int empty_launch(int ctas, int threads, void* stream) {
  empty_kernel<<<ctas, threads, 0, static_cast<cudaStream_t>(stream)>>>();
  return cudaGetLastError();
}
