// Issue #17, plan step 2 (docs/gpu.md): a first CUTLASS GEMM for the decode projections, y[M, N] = x[M, K] W[N, K]^T
// in bf16 with fp32 accumulation, from the CUTLASS 4.5 headers FlashInfer's wheel carries (flashinfer/data/cutlass/
// include; the wheel has no tools/util, hence the strides by hand). Built with -DCUTLASS_ENABLE_GDC_FOR_SM90 its kernel
// waits for the kernel before it (`wait_on_dependent_grids`) before its first load, so it may be launched with
// programmatic dependent launch (`pdl`), which cuBLAS's may not (forty-fourth session).
//
// Built and timed by resident_gemm.py (`cutlass_lib`; `--kinds cublas,cutlass,cutlass-pdl,...`): each projection
// against cuBLAS at 1, 37 and 256 rows, then the 28-layer chain with and without PDL, one library per configuration
// below. Results: docs/gpu.md (fifty-eighth session).
#include <cuda_runtime.h>
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>

using namespace cute;
// The configuration, chosen by -D flags so that resident_gemm.py can build several and time them side by side: the
// tile (rows x columns x depth of the GEMM it runs), the cluster, the kernel schedule (0 warp-specialized,
// 1 ping-pong, 2 cooperative, 3 cooperative with the stream-K scheduler, which spreads K across every SM; 2 and 3
// need 128-row tiles), and SWAP: y^T = W x^T, so W's rows take the tensor cores' 64/128-row side and the few tokens
// the narrow one.
#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 128
#endif
#ifndef TK
#define TK 64
#endif
#ifndef CLN
#define CLN 2
#endif
#ifndef SCHED
#define SCHED 0
#endif
#ifndef SWAP
#define SWAP 0
#endif
using T = cutlass::bfloat16_t;
// Unswapped: A = x [M, K] row-major, B = W [N, K] (K x N column-major), C = y [M, N] row-major. Swapped: A = W, B = x,
// C = y^T [N, M] column-major (the same memory as y).
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = std::conditional_t<SWAP != 0, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
constexpr int Align = 8;
using TileShape = Shape<Int<TM>, Int<TN>, Int<TK>>;
using ClusterShape = Shape<_1, Int<CLN>, _1>;
using Schedule = std::conditional_t<
    SCHED == 0, cutlass::gemm::KernelTmaWarpSpecialized,
    std::conditional_t<SCHED == 1, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                       cutlass::gemm::KernelTmaWarpSpecializedCooperative>>;
using Scheduler = std::conditional_t<SCHED == 3, cutlass::gemm::StreamKScheduler, void>;
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, LayoutA, Align, T, LayoutB, Align, float, TileShape,
    ClusterShape, cutlass::gemm::collective::StageCountAuto, Schedule>::CollectiveOp;
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, T, LayoutC, Align, T, LayoutC, Align,
    cutlass::epilogue::NoSmemWarpSpecialized>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

constexpr size_t WORKSPACE_BYTES = size_t(64) << 20;  // stream-K's partial tiles; allocated once, outside any capture
static void* workspace = nullptr;

// y [M, N] (contiguous) = x [M, K] (rows `lda` apart) times W [N, K]^T (contiguous), on `stream`; `pdl`: launched with
// programmatic dependent launch. Returns 0, or where it stopped: 1 a shape it cannot take, 2 its setup, 3 the launch,
// 4 a workspace larger than WORKSPACE_BYTES, 5 a workspace first asked for during a graph capture.
extern "C" int gemm_bf16(const void* x, const void* w, void* y, int M, int N, int K, long long lda, int pdl,
                         cudaStream_t stream) {
#if SWAP
  typename Kernel::StrideA sa = make_stride(int64_t(K), _1{}, int64_t(N) * K);
  typename Kernel::StrideB sb = make_stride(int64_t(lda), _1{}, int64_t(M) * int64_t(lda));
  typename Kernel::StrideC sc = make_stride(_1{}, int64_t(N), int64_t(M) * N);
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {N, M, K, 1},
                                {static_cast<const T*>(w), sa, static_cast<const T*>(x), sb},
                                {{1.0f, 0.0f}, static_cast<const T*>(y), sc, static_cast<T*>(y), sc}};
#else
  typename Kernel::StrideA sa = make_stride(int64_t(lda), _1{}, int64_t(M) * int64_t(lda));
  typename Kernel::StrideB sb = make_stride(int64_t(K), _1{}, int64_t(N) * K);
  typename Kernel::StrideC sc = make_stride(int64_t(N), _1{}, int64_t(M) * N);
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {M, N, K, 1},
                                {static_cast<const T*>(x), sa, static_cast<const T*>(w), sb},
                                {{1.0f, 0.0f}, static_cast<const T*>(y), sc, static_cast<T*>(y), sc}};
#endif
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
  size_t need = Gemm::get_workspace_size(args);
  if (need > WORKSPACE_BYTES) return 4;
  if (need > 0 && workspace == nullptr) {
    cudaStreamCaptureStatus capturing;
    if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone) return 5;
    if (cudaMalloc(&workspace, WORKSPACE_BYTES) != cudaSuccess) return 2;
  }
  if (gemm.initialize(args, need > 0 ? workspace : nullptr, stream) != cutlass::Status::kSuccess) return 2;
  return gemm.run(stream, nullptr, pdl != 0) == cutlass::Status::kSuccess ? 0 : 3;
}
