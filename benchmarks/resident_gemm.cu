// A decode GEMM whose weights are in shared memory before it waits for its input (issue #17; benchmarks only).
// y[M, N] = x[M, K] W[N, K]^T in bf16 with fp32 sums. Each CTA owns BN output columns: it copies its [BN, K] slice
// of W into shared memory (cp.async), then `griddepcontrol.wait`s for the kernel before it (which wrote x), then lets
// the next kernel launch, then streams x through shared memory in chunks of KC columns (S stages in flight) and
// multiplies with mma.sync. Its 8 warps split the BN columns WN ways and each chunk's K WK ways; the WK partial sums
// meet in shared memory and are added in a fixed order (deterministic).
// A first version read x straight from global memory in each warp: latency-bound, ~12 us per layer more for every 16
// rows (results/session30).
//
// One mma.m16n8k16 takes, per thread, 4 k-values of A and B each. Which physical column a k-slot holds does not
// matter as long as A and B agree, so each thread reads 8 consecutive columns (16 bytes) of x and of W per 32 k and
// feeds them to two mmas: step s takes columns 8t + 4s .. 8t + 4s + 3 (t = lane % 4).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

namespace {

constexpr int THREADS = 256;
constexpr int PAD = 32;  // bf16 elements after each W row in shared memory: rows g and g + 1 fall on other banks

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

__device__ __forceinline__ void mma_bf16(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int BN, int K, int WN, int BM, int KC, int S, int ROT>
__global__ void __launch_bounds__(THREADS) resident_gemm_kernel(const __nv_bfloat16* __restrict__ x, int ldx,
                                                                const __nv_bfloat16* __restrict__ w,
                                                                __nv_bfloat16* __restrict__ y, int ldy, int M) {
  constexpr int WK = THREADS / 32 / WN;  // warps along K
  constexpr int NT = BN / WN / 8;        // n8 tiles per warp
  constexpr int KW = KC / WK;            // k per warp in each chunk
  constexpr int NC = K / KC;             // chunks of x per pass
  constexpr int KP = K + PAD;
  constexpr int XP = KC + PAD;
  constexpr int MT = BM / 16;
  static_assert(BN % (WN * 8) == 0 && KC % (WK * 32) == 0 && K % KC == 0 && S >= 2, "tile");
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* ws = reinterpret_cast<__nv_bfloat16*>(smem);           // [BN][KP]
  __nv_bfloat16* xs = ws + BN * KP;                                       // [S][BM][XP]
  float* part = reinterpret_cast<float*>(xs + S * BM * XP);              // [WK][BM][BN]
  const int n0 = blockIdx.x * BN;

  for (int i = threadIdx.x; i < BN * K / 8; i += THREADS) {  // the weights: no earlier kernel writes them
    const int r = i / (K / 8), c = (i % (K / 8)) * 8;
    cp_async16(ws + r * KP + c, w + static_cast<size_t>(n0 + r) * K + c, 16);
  }
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // x is complete and visible from here
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // chunks of x: pass p = c / NC covers rows p * BM .. + BM. With ROT each CTA starts its passes at its own chunk:
  // all CTAs read the same x, and asking the same lines at once queues them at the same L2 slices.
  const int total = (M + BM - 1) / BM * NC;
  auto load_chunk = [&](int c) {
    if (c < total) {
      const int m0 = c / NC * BM, k0 = (c + ROT * blockIdx.x) % NC * KC;
      __nv_bfloat16* dst = xs + (c % S) * BM * XP;
      for (int i = threadIdx.x; i < BM * KC / 8; i += THREADS) {
        const int r = i / (KC / 8), col = (i % (KC / 8)) * 8;
        const bool in = m0 + r < M;  // rows past M are zero-filled (source size 0)
        cp_async16(dst + r * XP + col, x + static_cast<size_t>(in ? m0 + r : 0) * ldx + k0 + col, in ? 16 : 0);
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);  // one group per chunk, empty or not: the waits count them
  };
#pragma unroll
  for (int c = 0; c < S - 1; ++c) load_chunk(c);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wn = warp % WN, wk = warp / WN;
  const int g = lane / 4, t = lane % 4;
  float acc[MT][NT][4];
  for (int c = 0; c < total; ++c) {
    if (c % NC == 0) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    }
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2) : "memory");  // W and chunks up to c have landed
    __syncthreads();  // ... for every thread's copies; and chunk c - 1's stage is free again
    load_chunk(c + S - 1);
    const __nv_bfloat16* xc = xs + (c % S) * BM * XP;
    const int kw = (c + ROT * blockIdx.x) % NC * KC + wk * KW;  // this warp's first k in W
#pragma unroll
    for (int kk = 0; kk < KW; kk += 32) {
      uint4 a[MT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          a[i][h] = *reinterpret_cast<const uint4*>(xc + (i * 16 + g + h * 8) * XP + wk * KW + kk + 8 * t);
      uint4 b[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j)
        b[j] = *reinterpret_cast<const uint4*>(ws + ((wn * NT + j) * 8 + g) * KP + kw + kk + 8 * t);
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          mma_bf16(acc[i][j], a[i][0].x, a[i][1].x, a[i][0].y, a[i][1].y, b[j].x, b[j].y);
          mma_bf16(acc[i][j], a[i][0].z, a[i][1].z, a[i][0].w, a[i][1].w, b[j].z, b[j].w);
        }
    }
    if (c % NC == NC - 1) {  // the pass's last chunk: add the warps' K parts, write rows m0 .. m0 + BM
      const int m0 = c / NC * BM;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          float* p = part + (wk * BM + i * 16 + g) * BN + (wn * NT + j) * 8 + 2 * t;
          p[0] = acc[i][j][0];
          p[1] = acc[i][j][1];
          p[8 * BN] = acc[i][j][2];
          p[8 * BN + 1] = acc[i][j][3];
        }
      __syncthreads();
      for (int o = threadIdx.x; o < BM * BN / 2; o += THREADS) {  // two columns per thread, the parts in order
        const int row = (2 * o) / BN, col = (2 * o) % BN;
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int q = 0; q < WK; ++q) {
          s0 += part[(q * BM + row) * BN + col];
          s1 += part[(q * BM + row) * BN + col + 1];
        }
        if (m0 + row < M)
          *reinterpret_cast<__nv_bfloat162*>(y + static_cast<size_t>(m0 + row) * ldy + n0 + col) =
              __floats2bfloat162_rn(s0, s1);
      }
      // the next write of `part` comes after the next iteration's __syncthreads
    }
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // with no rows (M = 0) the W copies are still in flight
}

template <int BN, int K, int WN, int BM, int KC, int S, int ROT>
void launch(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y, bool pdl) {
  constexpr int WK = THREADS / 32 / WN;
  const int smem = BN * (K + PAD) * 2 + S * BM * (KC + PAD) * 2 + WK * BM * BN * 4;
  auto kernel = resident_gemm_kernel<BN, K, WN, BM, KC, S, ROT>;
  static bool configured = false;
  if (!configured) {
    TORCH_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess);
    configured = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(w.size(0) / BN);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = at::cuda::getCurrentCUDAStream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const auto* xp = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const __nv_bfloat16*>(w.data_ptr());
  auto* yp = reinterpret_cast<__nv_bfloat16*>(y.data_ptr());
  TORCH_CHECK(cudaLaunchKernelEx(&cfg, kernel, xp, static_cast<int>(x.stride(0)), wp, yp,
                                 static_cast<int>(y.stride(0)), static_cast<int>(x.size(0))) == cudaSuccess);
}

}  // namespace

// y = x W^T for Qwen3-0.6B's four projections (N, K): qkv (4096, 1024), o (1024, 2048), gate_up (6144, 1024),
// down (1024, 3072). `bm` (16 or 32) rows per pass over the weights, x staged through shared memory in chunks of 128
// (256 for down) columns, `stages` (2 or 3) of them in flight, or 0: a whole pass's x at once (16 rows); `rotate`
// (32 rows, 3 stages) starts each CTA at its own chunk.
torch::Tensor resident_linear(torch::Tensor x, torch::Tensor w, bool pdl, int64_t bm, int64_t stages, bool rotate) {
  TORCH_CHECK(x.dtype() == torch::kBFloat16 && w.dtype() == torch::kBFloat16 && w.is_contiguous());
  TORCH_CHECK(x.stride(1) == 1 && x.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0);
  TORCH_CHECK((bm == 16 && stages == 0) || ((bm == 16 || bm == 32) && (stages == 2 || stages == 3)));
  TORCH_CHECK(!rotate || (bm == 32 && stages == 3), "rotate is built for 32 rows per pass and 3 stages only");
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(x.size(1) == k);
  auto y = torch::empty({x.size(0), n}, x.options());
  if (x.size(0) == 0) return y;
#define CASE(N_, K_, BN_, WN_, KC_)                                                     \
  if (n == N_ && k == K_) {                                                             \
    if (bm == 16 && stages == 0) launch<BN_, K_, WN_, 16, KC_, K_ / KC_ + 1, 0>(x, w, y, pdl); \
    if (bm == 16 && stages == 2) launch<BN_, K_, WN_, 16, KC_, 2, 0>(x, w, y, pdl);     \
    if (bm == 16 && stages == 3) launch<BN_, K_, WN_, 16, KC_, 3, 0>(x, w, y, pdl);     \
    if (bm == 32 && stages == 2) launch<BN_, K_, WN_, 32, KC_, 2, 0>(x, w, y, pdl);     \
    if (bm == 32 && stages == 3 && !rotate) launch<BN_, K_, WN_, 32, KC_, 3, 0>(x, w, y, pdl); \
    if (bm == 32 && stages == 3 && rotate) launch<BN_, K_, WN_, 32, KC_, 3, 1>(x, w, y, pdl);  \
    return y;                                                                           \
  }
  CASE(4096, 1024, 32, 2, 128)
  CASE(1024, 2048, 16, 2, 128)
  CASE(6144, 1024, 48, 2, 128)
  CASE(1024, 3072, 16, 1, 256)
#undef CASE
  TORCH_CHECK(false, "no resident GEMM for N=", n, " K=", k);
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("resident_linear", &resident_linear); }
