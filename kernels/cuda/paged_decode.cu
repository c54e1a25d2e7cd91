// The engine's decode attention over a bf16/fp16 paged KV pool [pages, 16, kv_heads, 128]
// (kernels/attention/cuda_decode.py builds and calls it), one CTA per (work item, KV head). A work item is a span of
// one request's keys (span_decode.span_decode_work). Each warp of the CTA takes every
// WARPS-th page of the span and streams it through its own STAGES-deep ring of shared memory with cp.async; the
// products run on the tensor cores (TC: a page's 16 keys by the KV head's query heads padded to 8, MMAs of 16x8x16) or
// on the CUDA cores. At the end the warps' partial softmax states are merged in shared memory: a request in one span
// writes its output, one cut into several writes each span's normalized output and log-sum-exp for the merge kernel.
//
// The engine's build has one shape, 8 warps, 2 stages, cp.async.ca (COPY 2), with the products on the tensor cores,
// and the same on the CUDA cores (the A/B's). On the CUDA cores the arithmetic hid behind the copies only in part: the
// copies alone ran 4% faster at 128-256 rows and 12-15% at 16-64 (-DPAGED_DECODE_MATH=0 below); the MMAs take that
// back, 2.3-2.5% / 6.4-7.7% faster than on the CUDA cores at 128-256 / 16-64 rows of Qwen3-0.6B's heads, and faster
// than FlashInfer's decode at a group of 4 too (docs/gpu.md, sixty-sixth session). `.cg` (COPY 0) asked L2 for every
// sector twice. -DPAGED_DECODE_ALL_SHAPES builds the others the benchmarks compare
// (benchmarks/decode_attention_kernels.py).
//
// -DPAGED_DECODE_MATH=0 or 1 (benchmarks only, wrong outputs by design): the same copies with no arithmetic on the
// pages (0), or with their K and V rows read from shared memory and summed (1), to tell what the kernel's own work on
// a page costs against its copies (benchmarks/decode_attention_kernels.py's `-m0`, `-m1`).
#ifndef PAGED_DECODE_MATH
#define PAGED_DECODE_MATH 2
#endif
//
// Lane layout for a page: lane = t4 * 8 + j; the lane reads tokens t4, t4 + 4, t4 + 8, t4 + 12 of the page and of
// each token the dims [8j, 8j + 8) and [64 + 8j, 64 + 8j + 8), so each quarter warp reads 128 contiguous bytes of one
// row from shared memory (no bank conflicts).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "async_copy.cuh"

namespace {

constexpr int D = 128;
constexpr int PAGE = 16;
constexpr int ROW_BYTES = D * 2;
constexpr int PAGE_BYTES = PAGE * ROW_BYTES;  // one page of K (or V) of one KV head
constexpr int STAGE_BYTES = 2 * PAGE_BYTES;  // K and V

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16_ca(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// COPY 3: a plain 16-byte load and shared store, to tell the L2 traffic of cp.async from that of the addresses
__device__ __forceinline__ void ld_st16(uint32_t dst, const void* src, int src_bytes) {
  uint4 r = make_uint4(0, 0, 0, 0);
  if (src_bytes) r = __ldg(reinterpret_cast<const uint4*>(src));
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr));
  return r;
}

// The tensor-core path's (TC) loads and products: four 8x8 tiles of 16-bit values from shared memory (transposed with
// .trans), a 16x8x16 product accumulated in fp32, two floats packed as the MMA's 16-bit inputs.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
template <typename T>
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, const uint32_t* b) {
  if constexpr (std::is_same<T, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __half>::value) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

template <typename T>
__device__ __forceinline__ void widen8(uint4 raw, float* f);
template <>
__device__ __forceinline__ void widen8<__nv_bfloat16>(uint4 raw, float* f) {
  // bf16 -> fp32 is a shift: the low half of each word moves up, the high half is masked
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
template <>
__device__ __forceinline__ void widen8<__half>(uint4 raw, float* f) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// The 16 dims lane j of a token group holds, [8j, 8j + 8) and [64 + 8j, 64 + 8j + 8), of a row in shared memory
template <typename T>
__device__ __forceinline__ void lane_dims(uint32_t row, int j, float* f) {
  widen8<T>(lds128(row + 16 * j), f);
  widen8<T>(lds128(row + 128 + 16 * j), f + 8);
}

struct Args {
  const void* q;
  const void* k;
  const void* v;
  const int* indptr;   // [rows + 1] into indices
  const int* indices;  // page ids
  const int* work;     // [3, stride_w]: request (-1: no work), first key, end key
  const int* work_ptr; // [rows + 1]: each request's items
  const int* order;    // [items]: the item each CTA (group) takes, longest first; null: in item order
  void* out;           // [rows, heads, D]
  float* part;         // [items, heads, D]
  float* lse;          // [items, heads], base 2
  int* counters;       // [rows, kv_heads], zero between calls: spans done; null: the merge is a kernel of its own
  float qk_scale;      // sm_scale * log2(e)
  long long stride_qb, stride_qh, stride_kp, stride_ks, stride_kh;  // elements
  int stride_w;
  int heads;
  int heads_together;  // the grid: flat, a work item's KV heads in consecutive CTAs; else (items, KV heads)
};

// TC: the products on the tensor cores (16x8x16 MMAs: a page's 16 keys by the KV head's query heads padded to 8, then
// the head dims by the 16 keys' probabilities), the rows in shared memory swizzled for ldmatrix; else the CUDA cores.
template <typename T, int G, int WARPS, int STAGES, int COPY, int TC>
__global__ void __launch_bounds__(WARPS * 32) paged_decode(const Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  // heads_together: a work item's KV heads in consecutive CTAs of a flat grid, so they run at once and read each
  // token's heads (one contiguous run of the pool's row) together (span_decode.CUDA_HEADS_TOGETHER: the engine's)
  const int kv_heads = a.heads_together ? a.heads / G : gridDim.y;
  const int slot = a.heads_together ? blockIdx.x / kv_heads : blockIdx.x;
  const int item = a.order ? a.order[slot] : slot, kvh = a.heads_together ? blockIdx.x % kv_heads : blockIdx.y;
  const int b = a.work[item];
  if (b < 0) return;
  const int start = a.work[a.stride_w + item], end = a.work[2 * a.stride_w + item];
  const bool alone = a.work_ptr[b + 1] - a.work_ptr[b] == 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t4 = lane >> 3, j = lane & 7;
  const int* pages = a.indices + a.indptr[b];
  // Launched with programmatic dependent launch, this CTA may start while the kernel before it (the fused q/k norm,
  // rope and KV store) still runs: its work metadata came by copies queued before that kernel, but q and the KV pool
  // are that kernel's writes, so they are read only after it (a no-op when launched without PDL).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");

  float qf[G][16];
  // TC: lane (g, qd) = (lane / 4, lane % 4) holds q^T as the MMA's B operand, dims 16 kt + 2 qd (+1, +8, +9) of query
  // head g of this KV head (zeros for g >= G)
  const int g = lane >> 2, qd = lane & 3;
  uint32_t qb[8][2];
  if constexpr (TC) {
    const T* qp = static_cast<const T*>(a.q) + b * a.stride_qb + (kvh * G + (g < G ? g : 0)) * a.stride_qh;
#pragma unroll
    for (int kt = 0; kt < 8; ++kt) {
      qb[kt][0] = g < G ? *reinterpret_cast<const uint32_t*>(qp + 16 * kt + 2 * qd) : 0u;
      qb[kt][1] = g < G ? *reinterpret_cast<const uint32_t*>(qp + 16 * kt + 2 * qd + 8) : 0u;
    }
  } else {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const T* qp = static_cast<const T*>(a.q) + b * a.stride_qb + (kvh * G + h) * a.stride_qh;
      widen8<T>(*reinterpret_cast<const uint4*>(qp + 8 * j), qf[h]);
      widen8<T>(*reinterpret_cast<const uint4*>(qp + 64 + 8 * j), qf[h] + 8);
#pragma unroll
      for (int d = 0; d < 16; ++d) qf[h][d] *= a.qk_scale;
    }
  }

  const int first_page = start / PAGE;
  const int npages = (end - 1) / PAGE - first_page + 1;
  const int mine = warp < npages ? (npages - warp + WARPS - 1) / WARPS : 0;  // pages this warp reads
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + warp * STAGES * STAGE_BYTES;
  const char* kbase = static_cast<const char*>(a.k) + kvh * a.stride_kh * 2;
  const char* vbase = static_cast<const char*>(a.v) + kvh * a.stride_kh * 2;
  int pid_reg = 0;  // lane i: the page id of this warp's page 32 * (i / 32) + lane

  // COPY 1: the copy engine brings each row (one lane per K or V row of the page) and signals the stage's mbarrier;
  // else cp.async, 16 bytes a lane, in commit groups.
  const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + WARPS * STAGES * STAGE_BYTES +
                        warp * STAGES * 8;
  if (COPY == 1) {
    if (lane == 0) {
#pragma unroll
      for (int st = 0; st < STAGES; ++st) mbar_init(bars + 8 * st, 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();
  }
  auto issue = [&](int i) {
    if (i < mine) {
      if ((i & 31) == 0) {
        const int at = i + lane;
        pid_reg = at < mine ? pages[first_page + warp + at * WARPS] : 0;
      }
      const int pid = __shfl_sync(0xffffffffu, pid_reg, i & 31);
      const int tok0 = (first_page + warp + i * WARPS) * PAGE;
      const uint32_t dst = ring + (i % STAGES) * STAGE_BYTES;
      const long long page_off = static_cast<long long>(pid) * a.stride_kp * 2;
      if constexpr (COPY == 1) {
        const int lo = max(start - tok0, 0), hi = min(end - tok0, PAGE);  // the page's rows in the span
        const uint32_t bar = bars + 8 * (i % STAGES);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        if (lane == 0) mbar_expect_tx(bar, (hi - lo) * 2 * ROW_BYTES);
        __syncwarp();
        const int row = lane & 15, is_v = lane >> 4;
        const uint32_t to = dst + is_v * PAGE_BYTES + row * ROW_BYTES;
        if (row >= lo && row < hi) {
          bulk_copy(to, (is_v ? vbase : kbase) + page_off + row * a.stride_ks * 2, ROW_BYTES, bar);
        } else {  // a row outside the span: zeros (its score is masked; stale bits could hold a NaN)
          const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
          float4* zp = reinterpret_cast<float4*>(smem + (to - static_cast<uint32_t>(__cvta_generic_to_shared(smem))));
#pragma unroll
          for (int c = 0; c < ROW_BYTES / 16; ++c) zp[c] = z;
        }
      } else {
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const int chunk = lane + 32 * c, tok = chunk >> 4, col = chunk & 15;
          const bool valid = tok0 + tok >= start && tok0 + tok < end;
          const long long off = page_off + (valid ? tok : 0) * a.stride_ks * 2 + col * 16;
          // TC: a row's 16-byte chunks permuted by its token (c ^ tok % 8), so ldmatrix's 8 rows hit 8 bank groups
          const uint32_t kd = dst + tok * ROW_BYTES + (TC ? col ^ (tok & 7) : col) * 16, vd = kd + PAGE_BYTES;
          if constexpr (COPY == 2) {
            cp_async16_ca(kd, kbase + off, valid ? 16 : 0);
            cp_async16_ca(vd, vbase + off, valid ? 16 : 0);
          } else if constexpr (COPY == 3) {
            ld_st16(kd, kbase + off, valid ? 16 : 0);
            ld_st16(vd, vbase + off, valid ? 16 : 0);
          } else {
            cp_async16(kd, kbase + off, valid ? 16 : 0);
            cp_async16(vd, vbase + off, valid ? 16 : 0);
          }
        }
      }
    }
    if (COPY != 1) cp_commit();  // an empty group past the end keeps the wait count uniform
  };

  float m[G], l[G], acc[G][16];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int d = 0; d < 16; ++d) acc[h][d] = 0.f;
  }
  // TC: lane (g, qd)'s softmax state for query heads 2 qd and 2 qd + 1 (tl: its own keys' share, summed at the end)
  // and its MMA accumulators of o^T: dims 16 mt + g (and + 8) of those two heads
  float tm[2] = {-INFINITY, -INFINITY}, tl[2] = {0.f, 0.f}, tacc[8][4];
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) tacc[mt][0] = tacc[mt][1] = tacc[mt][2] = tacc[mt][3] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue(s);
  for (int i = 0; i < mine; ++i) {
    issue(i + STAGES - 1);
    if (COPY == 1) {
      mbar_wait(bars + 8 * (i % STAGES), (i / STAGES) & 1);
    } else {
      cp_wait<STAGES - 1>();
    }
    __syncwarp();
    const uint32_t kst = ring + (i % STAGES) * STAGE_BYTES, vst = kst + PAGE_BYTES;
    const int tok0 = (first_page + warp + i * WARPS) * PAGE;
#if PAGED_DECODE_MATH < 2
    if (PAGED_DECODE_MATH == 1) {  // (the same bytes from shared memory whatever the rows' swizzle)
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        float kf[16], vf[16];
        lane_dims<T>(kst + (4 * p + t4) * ROW_BYTES, j, kf);
        lane_dims<T>(vst + (4 * p + t4) * ROW_BYTES, j, vf);
#pragma unroll
        for (int d = 0; d < 16; ++d) acc[0][d] += kf[d] + vf[d];
      }
    }
    l[0] += 1.f;
    m[0] = 0.f;
#else
    if constexpr (TC) {
      float sc[4] = {0.f, 0.f, 0.f, 0.f};  // s^T: keys g and g + 8 by query heads 2 qd, 2 qd + 1
#pragma unroll
      for (int kt = 0; kt < 8; ++kt) {
        const int row = lane & 15, ch = 2 * kt + (lane >> 4);
        uint32_t af[4];
        ldsm_x4(kst + row * ROW_BYTES + ((ch ^ (row & 7)) << 4), af);
        mma16816<T>(sc, af, qb[kt]);
      }
      const bool v0 = tok0 + g >= start && tok0 + g < end, v1 = tok0 + g + 8 >= start && tok0 + g + 8 < end;
      const float s0 = v0 ? sc[0] * a.qk_scale : -INFINITY, s1 = v0 ? sc[1] * a.qk_scale : -INFINITY;
      const float s2 = v1 ? sc[2] * a.qk_scale : -INFINITY, s3 = v1 ? sc[3] * a.qk_scale : -INFINITY;
      float mx0 = fmaxf(s0, s2), mx1 = fmaxf(s1, s3);
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
      }
      const float mn0 = fmaxf(tm[0], mx0), mn1 = fmaxf(tm[1], mx1);
      const float al0 = exp2f(tm[0] - mn0), al1 = exp2f(tm[1] - mn1);
      const float p0 = exp2f(s0 - mn0), p1 = exp2f(s1 - mn1), p2 = exp2f(s2 - mn0), p3 = exp2f(s3 - mn1);
      tl[0] = tl[0] * al0 + p0 + p2;
      tl[1] = tl[1] * al1 + p1 + p3;
      tm[0] = mn0;
      tm[1] = mn1;
      // p^T as the B operand: lane (g, qd) takes keys 2 qd, 2 qd + 1 (and + 8) of head g, from lanes 8 qd + g / 2 and
      // 8 qd + 4 + g / 2, the half for head g of each
      const uint32_t r01 = pack2<T>(p0, p1), r23 = pack2<T>(p2, p3);
      const int src = 8 * qd + (g >> 1);
      const uint32_t a01 = __shfl_sync(0xffffffffu, r01, src), b01 = __shfl_sync(0xffffffffu, r01, src + 4);
      const uint32_t a23 = __shfl_sync(0xffffffffu, r23, src), b23 = __shfl_sync(0xffffffffu, r23, src + 4);
      const uint32_t sel = (g & 1) ? 0x7632 : 0x5410;
      const uint32_t pb[2] = {__byte_perm(a01, b01, sel), __byte_perm(a23, b23, sel)};
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        tacc[mt][0] *= al0;
        tacc[mt][1] *= al1;
        tacc[mt][2] *= al0;
        tacc[mt][3] *= al1;
        const int row = (lane & 7) + ((lane >> 4) << 3), ch = 2 * mt + ((lane >> 3) & 1);
        uint32_t vf[4];
        ldsm_x4_t(vst + row * ROW_BYTES + ((ch ^ (row & 7)) << 4), vf);
        mma16816<T>(tacc[mt], vf, pb);
      }
      __syncwarp();
      continue;
    }
    float s[4][G];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int tok = 4 * p + t4;
      float kf[16];
      lane_dims<T>(kst + tok * ROW_BYTES, j, kf);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        float x = 0.f;
#pragma unroll
        for (int d = 0; d < 16; ++d) x = fmaf(qf[h][d], kf[d], x);
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        const int n = tok0 + tok;
        s[p][h] = (n >= start && n < end) ? x : -INFINITY;
      }
    }
    float pr[4][G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float mx = fmaxf(fmaxf(s[0][h], s[1][h]), fmaxf(s[2][h], s[3][h]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float m_new = fmaxf(m[h], mx);
      const float alpha = exp2f(m[h] - m_new);
      float sum = 0.f;
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        pr[p][h] = exp2f(s[p][h] - m_new);
        sum += pr[p][h];
      }
      l[h] = l[h] * alpha + sum;
#pragma unroll
      for (int d = 0; d < 16; ++d) acc[h][d] *= alpha;
      m[h] = m_new;
    }
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int tok = 4 * p + t4;
      float vf[16];
      lane_dims<T>(vst + tok * ROW_BYTES, j, vf);
#pragma unroll
      for (int h = 0; h < G; ++h) {
#pragma unroll
        for (int d = 0; d < 16; ++d) acc[h][d] = fmaf(pr[p][h], vf[d], acc[h][d]);
      }
    }
#endif
    __syncwarp();  // the next issue overwrites this stage
  }
  if (COPY != 1) cp_wait<0>();

  if constexpr (TC) {  // the lanes' shares of l (their own keys) into the warp's
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      tl[0] += __shfl_xor_sync(0xffffffffu, tl[0], o);
      tl[1] += __shfl_xor_sync(0xffffffffu, tl[1], o);
    }
  } else {  // the four token groups of the warp (t4) into one state per warp
#pragma unroll
    for (int h = 0; h < G; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 8);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 16);
#pragma unroll
      for (int d = 0; d < 16; ++d) {
        acc[h][d] += __shfl_xor_sync(0xffffffffu, acc[h][d], 8);
        acc[h][d] += __shfl_xor_sync(0xffffffffu, acc[h][d], 16);
      }
    }
  }
  __syncthreads();  // every warp is done with its ring: the merge reuses the shared memory
  float* red_acc = reinterpret_cast<float*>(smem);  // [WARPS][G][D]
  float* red_m = red_acc + WARPS * G * D;            // [WARPS][G]
  float* red_l = red_m + WARPS * G;
  if constexpr (TC) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int h = 2 * qd + c;
      if (h < G) {
        float* row = red_acc + (warp * G + h) * D;
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) {
          row[16 * mt + g] = tacc[mt][c];
          row[16 * mt + g + 8] = tacc[mt][2 + c];
        }
        if (g == 0) {
          red_m[warp * G + h] = tm[c];
          red_l[warp * G + h] = tl[c];
        }
      }
    }
  } else if (t4 == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float* row = red_acc + (warp * G + h) * D;
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        row[8 * j + d] = acc[h][d];
        row[64 + 8 * j + d] = acc[h][8 + d];
      }
      if (j == 0) {
        red_m[warp * G + h] = m[h];
        red_l[warp * G + h] = l[h];
      }
    }
  }
  __syncthreads();
  for (int x = threadIdx.x; x < G * D; x += WARPS * 32) {
    const int h = x / D, d = x % D;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, red_m[w * G + h]);
    float ll = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float scale = exp2f(red_m[w * G + h] - mm);  // a warp without pages: exp2(-inf) = 0
      ll += red_l[w * G + h] * scale;
      o += red_acc[(w * G + h) * D + d] * scale;
    }
    const int head = kvh * G + h;
    if (alone) {
      static_cast<T*>(a.out)[(static_cast<long long>(b) * a.heads + head) * D + d] = static_cast<T>(o / ll);
    } else {
      const long long at = static_cast<long long>(item) * a.heads + head;
      a.part[at * D + d] = o / ll;
      if (d == 0) a.lse[at] = mm + log2f(ll);
    }
  }
  if (alone || a.counters == nullptr) return;
  // The request's last span to finish merges them all, in span order (the result does not depend on which is last).
  __shared__ int last;
  __threadfence();
  __syncthreads();
  const int first = a.work_ptr[b], n = a.work_ptr[b + 1] - first;
  if (threadIdx.x == 0) {
    int* counter = a.counters + b * kv_heads + kvh;
    last = atomicAdd(counter, 1) == n - 1;
    if (last) *counter = 0;  // ready for the next call (a CUDA graph replays this buffer)
    __threadfence();
  }
  __syncthreads();
  if (!last) return;
  for (int x = threadIdx.x; x < G * D; x += WARPS * 32) {
    const int head = kvh * G + x / D, d = x % D;
    float mm = -INFINITY;
    for (int s = 0; s < n; ++s) mm = fmaxf(mm, __ldcg(a.lse + static_cast<long long>(first + s) * a.heads + head));
    float ll = 0.f, o = 0.f;
    for (int s = 0; s < n; ++s) {
      const long long at = static_cast<long long>(first + s) * a.heads + head;
      const float w = exp2f(__ldcg(a.lse + at) - mm);
      ll += w;
      o += w * __ldcg(a.part + at * D + d);
    }
    static_cast<T*>(a.out)[(static_cast<long long>(b) * a.heads + head) * D + d] = static_cast<T>(o / ll);
  }
}

template <typename T, int G, int WARPS, int STAGES, int COPY, int TC>
int launch(const Args& a, int items, int kv_heads, int pdl, cudaStream_t stream) {
  constexpr int ring = WARPS * STAGES * (STAGE_BYTES + 8);  // + the mbarriers
  constexpr int merge = (WARPS * G * D + 2 * WARPS * G) * 4;
  constexpr int bytes = ring > merge ? ring : merge;
  static bool ready = false;
  if (!ready) {
    const cudaError_t e = cudaFuncSetAttribute(paged_decode<T, G, WARPS, STAGES, COPY, TC>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) return e;
    ready = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = a.heads_together ? dim3(items * kv_heads, 1) : dim3(items, kv_heads);
  cfg.blockDim = dim3(WARPS * 32);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, paged_decode<T, G, WARPS, STAGES, COPY, TC>, a);
}

template <typename T, int G>
int by_shape(const Args& a, int items, int kv_heads, int warps, int stages, int hint, int tc, int pdl,
             cudaStream_t s) {
#define SHAPE(W, S, P, C) \
  if (warps == W && stages == S && hint == P && tc == C) return launch<T, G, W, S, P, C>(a, items, kv_heads, pdl, s);
  SHAPE(8, 2, 2, 1) SHAPE(8, 2, 2, 0)
#ifdef PAGED_DECODE_ALL_SHAPES
  SHAPE(4, 3, 0, 0) SHAPE(4, 3, 1, 0) SHAPE(4, 2, 1, 0) SHAPE(4, 4, 1, 0) SHAPE(8, 3, 1, 0) SHAPE(8, 3, 0, 0)
  SHAPE(4, 3, 2, 0) SHAPE(4, 3, 3, 0) SHAPE(4, 2, 2, 0) SHAPE(4, 4, 2, 0) SHAPE(8, 3, 2, 0) SHAPE(4, 2, 2, 1)
  SHAPE(4, 3, 2, 1) SHAPE(8, 3, 2, 1)
#endif
#undef SHAPE
  return -1;
}

template <typename T>
int by_group(const Args& a, int items, int kv_heads, int group, int warps, int stages, int hint, int tc, int pdl,
             cudaStream_t s) {
  switch (group) {
    case 1: return by_shape<T, 1>(a, items, kv_heads, warps, stages, hint, tc, pdl, s);
    case 2: return by_shape<T, 2>(a, items, kv_heads, warps, stages, hint, tc, pdl, s);
    case 4: return by_shape<T, 4>(a, items, kv_heads, warps, stages, hint, tc, pdl, s);
  }
  return -1;
}

}  // namespace

// Whether this library's kernels load on the current device: nullptr, or why not. A toolkit newer than the driver
// builds a library that loads (the runtime is linked statically) and fails at its first launch.
extern "C" const char* paged_decode_probe() {
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, paged_decode<__nv_bfloat16, 2, 8, 2, 2, 1>);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

// Returns a cudaError_t, or -1 for a shape this build has no kernel for. pdl: launched with programmatic dependent
// launch (as FlashInfer's attention is), so the launch overlaps the kernel before it.
extern "C" int paged_decode_launch(const void* q, const void* k, const void* v, const int* indptr, const int* indices,
                                   const int* work, const int* work_ptr, const int* order, void* out, float* part,
                                   float* lse, int* counters, float qk_scale, long long stride_qb, long long stride_qh, long long stride_kp,
                                   long long stride_ks, long long stride_kh, int stride_w, int items, int heads,
                                   int kv_heads, int fp16, int warps, int stages, int hint, int pdl, void* stream,
                                   int heads_together, int tensor_cores) {
  const Args a{q, k, v, indptr, indices, work, work_ptr, order, out, part, lse, counters, qk_scale,
               stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_w, heads, heads_together};
  const int group = heads / kv_heads;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int tc = tensor_cores;
  return fp16 ? by_group<__half>(a, items, kv_heads, group, warps, stages, hint, tc, pdl, s)
              : by_group<__nv_bfloat16>(a, items, kv_heads, group, warps, stages, hint, tc, pdl, s);
}
