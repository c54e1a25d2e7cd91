// Issue #17, plan step 2 (docs/gpu.md): a first CUTLASS GEMM for the decode projections, y[M, N] = x[M, K] W[N, K]^T
// in bf16 with fp32 accumulation, from the CUTLASS 4.5 headers FlashInfer's wheel carries (flashinfer/data/cutlass/
// include; the wheel has no tools/util, hence the strides by hand). Built with -DCUTLASS_ENABLE_GDC_FOR_SM90 its kernel
// waits for the kernel before it (`wait_on_dependent_grids`) before its first load, so it may be launched with
// programmatic dependent launch (`pdl`), which cuBLAS's may not (forty-fourth session).
//
// STATE: compile-tested only (fifty-seventh session: nvcc 13.0, sm_90a, 35-65 s on the 2-core CPU machine, a 1 MB
// library, built and loaded by kernels/cuda_build.py there); never run on a GPU, no result checked yet.
// Built and timed by resident_gemm.py (`cutlass_lib`, `--kinds cublas,cutlass,cutlass-pdl`): each projection against
// cuBLAS at 1, 37 and 256 rows, then the 28-layer chain with and without PDL. Next: the weights requested into L2
// before the wait (a kernel layer of our own around CUTLASS's collectives).
#include <cuda_runtime.h>
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>

using namespace cute;
using T = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // x [M, K]
using LayoutB = cutlass::layout::ColumnMajor;  // W [N, K] read as K x N column-major
using LayoutC = cutlass::layout::RowMajor;     // y [M, N]
constexpr int Align = 8;
using TileShape = Shape<_64, _128, _64>;
using ClusterShape = Shape<_1, _2, _1>;
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, LayoutA, Align, T, LayoutB, Align, float, TileShape,
    ClusterShape, cutlass::gemm::collective::StageCountAuto,
    cutlass::gemm::KernelTmaWarpSpecialized>::CollectiveOp;
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, T, LayoutC, Align, T, LayoutC, Align,
    cutlass::epilogue::NoSmemWarpSpecialized>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

// y [M, N] (contiguous) = x [M, K] (rows `lda` apart) times W [N, K]^T (contiguous), on `stream`; `pdl`: launched with
// programmatic dependent launch. Returns 0, or where it stopped: 1 a shape it cannot take, 2 its setup, 3 the launch,
// 4 a shape that would need a workspace (none is passed).
extern "C" int gemm_bf16(const void* x, const void* w, void* y, int M, int N, int K, long long lda, int pdl,
                         cudaStream_t stream) {
  typename Kernel::StrideA sa = make_stride(int64_t(lda), _1{}, int64_t(M) * int64_t(lda));
  typename Kernel::StrideB sb = make_stride(int64_t(K), _1{}, int64_t(N) * K);
  typename Kernel::StrideC sc = make_stride(int64_t(N), _1{}, int64_t(M) * N);
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {M, N, K, 1},
                                {static_cast<const T*>(x), sa, static_cast<const T*>(w), sb},
                                {{1.0f, 0.0f}, static_cast<const T*>(y), sc, static_cast<T*>(y), sc}};
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (Gemm::get_workspace_size(args) > 0) return 4;
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return 2;
  return gemm.run(stream, nullptr, pdl != 0) == cutlass::Status::kSuccess ? 0 : 3;
}
