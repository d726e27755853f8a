// The CUDA loops of mean aggregation (MeanAggregate.h). A warp takes 32 edges,
// one per lane, and hands their (src, dst) to every lane by shuffles; each lane
// then owns features lane, lane + 32, ... of a 32 * kPerLane column tile (the
// grid's y dimension covers wider rows). Rows are loaded kUnroll edges at a time
// so that several are in flight before the run bookkeeping uses them.

#include "MeanAggregate.h"

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>

namespace torch_direct::aggregate {
namespace {

constexpr int kPerLane = 4;    // features per lane in a tile: 128-wide tiles
constexpr int kUnroll = 4;     // edges whose rows are loaded before they are summed
constexpr int kThreads = 256;
constexpr unsigned kAll = 0xffffffffu;
static_assert(kChunkEdges == 32, "one edge per lane");

template <typename index_t>
__device__ inline int load_edges(const index_t* src, const index_t* dst, int64_t edges, int64_t n_src,
                                 int64_t n_dst, int64_t first, int lane, index_t& s, index_t& d) {
  const int64_t e = first + lane;
  s = 0;
  d = 0;
  if (e < edges) {
    s = src[e];
    d = dst[e];
    CUDA_KERNEL_ASSERT(s >= 0 && s < n_src && "mean_aggregate: src out of range");
    CUDA_KERNEL_ASSERT(d >= 0 && d < n_dst && "mean_aggregate: dst out of range");
  }
  const int64_t left = edges - first;
  return left < kChunkEdges ? static_cast<int>(left) : kChunkEdges;
}

// row[tile + lane + 32 k] += v[k], within the row's F features
__device__ inline void add_to_row(float* row, const float (&v)[kPerLane], int64_t tile, int lane, int64_t F) {
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t f = tile + lane + 32 * k;
    if (f < F) {
      atomicAdd(row + f, v[k]);
    }
  }
}

template <typename scalar_t, typename index_t>
__global__ void sum_rows_kernel(const scalar_t* __restrict__ x, int64_t n_src, int64_t F,
                                const index_t* __restrict__ src, const index_t* __restrict__ dst, int64_t edges,
                                int64_t n_dst, float* __restrict__ sums, float* __restrict__ degree) {
  const int lane = threadIdx.x & 31;
  const int64_t first = ((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5) * kChunkEdges;
  if (first >= edges) {
    return;   // the whole warp
  }
  index_t my_s, my_d;
  const int n = load_edges(src, dst, edges, n_src, n_dst, first, lane, my_s, my_d);
  const int64_t tile = static_cast<int64_t>(blockIdx.y) * 32 * kPerLane;
  float acc[kPerLane] = {};
  index_t cur = __shfl_sync(kAll, my_d, 0);
  int run = 0;
  const auto flush = [&]() {
    add_to_row(sums + static_cast<int64_t>(cur) * F, acc, tile, lane, F);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      acc[k] = 0.f;
    }
    if (lane == 0 && blockIdx.y == 0) {
      atomicAdd(degree + cur, static_cast<float>(run));
    }
    run = 0;
  };
  for (int i0 = 0; i0 < n; i0 += kUnroll) {
    float v[kUnroll][kPerLane];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const index_t s = __shfl_sync(kAll, my_s, (i0 + u) & 31);
      const scalar_t* row = x + static_cast<int64_t>(s) * F;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t f = tile + lane + 32 * k;
        v[u][k] = (i0 + u < n && f < F) ? static_cast<float>(row[f]) : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const index_t d = __shfl_sync(kAll, my_d, (i0 + u) & 31);
      if (i0 + u < n) {
        if (d != cur) {
          flush();
          cur = d;
        }
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) {
          acc[k] += v[u][k];
        }
        ++run;
      }
    }
  }
  flush();
}

template <typename index_t>
__global__ void scatter_rows_kernel(const float* __restrict__ scaled, int64_t n_src, int64_t F,
                                    const index_t* __restrict__ src, const index_t* __restrict__ dst, int64_t edges,
                                    int64_t n_dst, float* __restrict__ grad_x) {
  const int lane = threadIdx.x & 31;
  const int64_t first = ((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5) * kChunkEdges;
  if (first >= edges) {
    return;
  }
  index_t my_s, my_d;
  const int n = load_edges(src, dst, edges, n_src, n_dst, first, lane, my_s, my_d);
  const int64_t tile = static_cast<int64_t>(blockIdx.y) * 32 * kPerLane;
  float g[kPerLane] = {};
  index_t cur = -1;
  for (int i = 0; i < n; ++i) {
    const index_t s = __shfl_sync(kAll, my_s, i);
    const index_t d = __shfl_sync(kAll, my_d, i);
    if (d != cur) {   // the target's row, read once per run
      const float* row = scaled + static_cast<int64_t>(d) * F;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t f = tile + lane + 32 * k;
        g[k] = f < F ? row[f] : 0.f;
      }
      cur = d;
    }
    add_to_row(grad_x + static_cast<int64_t>(s) * F, g, tile, lane, F);
  }
}

dim3 grid_for(int64_t edges, int64_t F) {
  const int64_t warps = (edges + kChunkEdges - 1) / kChunkEdges;
  const int64_t blocks = (warps * 32 + kThreads - 1) / kThreads;
  const int64_t tiles = (F + 32 * kPerLane - 1) / (32 * kPerLane);
  TORCH_CHECK(blocks < (int64_t{1} << 31) && tiles < 65536, "mean_aggregate: ", edges, " edges of ", F,
              " features is beyond one launch");
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles));
}

} // namespace

void sum_rows_cuda(const at::Tensor& x, const at::Tensor& src, const at::Tensor& dst, at::Tensor& sums,
                   at::Tensor& degree) {
  const c10::cuda::CUDAGuard guard(x.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid = grid_for(src.numel(), x.size(1));
  AT_DISPATCH_INDEX_TYPES(src.scalar_type(), "mean_aggregate", [&] {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "mean_aggregate", [&] {
      sum_rows_kernel<scalar_t, index_t><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<scalar_t>(), x.size(0), x.size(1), src.data_ptr<index_t>(), dst.data_ptr<index_t>(),
          src.numel(), sums.size(0), sums.data_ptr<float>(), degree.data_ptr<float>());
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void scatter_rows_cuda(const at::Tensor& scaled, const at::Tensor& src, const at::Tensor& dst, at::Tensor& grad_x) {
  const c10::cuda::CUDAGuard guard(scaled.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid = grid_for(src.numel(), scaled.size(1));
  AT_DISPATCH_INDEX_TYPES(src.scalar_type(), "mean_aggregate_backward", [&] {
    scatter_rows_kernel<index_t><<<grid, kThreads, 0, stream>>>(
        scaled.data_ptr<float>(), grad_x.size(0), scaled.size(1), src.data_ptr<index_t>(), dst.data_ptr<index_t>(),
        src.numel(), scaled.size(0), grad_x.data_ptr<float>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace torch_direct::aggregate
