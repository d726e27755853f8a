#pragma once
// The pieces of a CUDA row gather that the device's gather (GatherCuda.cu) and the GNN stack's
// cached gather (csrc/features/CachedGatherKernels.cu) share: the launch shape, the vector a
// thread loads, the fused cast of a loaded vector, and the choice of read kernel. Header-only,
// with internal linkage (RowGather.h says why).

#include "Experimental.h"
#include "RowGather.h"

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace torch_direct::rows {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // items in flight per thread: PCIe reads are slow, keep many pending

// V elements of T, loaded and stored as one access.
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// A chunk of a row as out_t, times the row's scale `s`. A chunk whose type does not change is
// returned as it is: a scale goes with a float8 table only, which always changes type.
template <typename in_t, typename out_t, int V>
__device__ __forceinline__ Vec<out_t, V> convert(const Vec<in_t, V>& x, float s) {
  if constexpr (std::is_same_v<in_t, out_t>) {
    return x;
  } else {
    Vec<out_t, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      y.v[k] = static_cast<out_t>(static_cast<float>(x.v[k]) * s);
    }
    return y;
  }
}

[[maybe_unused]] bool aligned(const void* p, int64_t a) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(a) == 0;
}

[[maybe_unused]] int sm_count(int device) {
  // (ATen/cuda/CUDAContext.h would pull in cuBLAS/cuSPARSE headers: ask the runtime.)
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// Blocks of a grid-stride kernel over `items` work items, per_block a block, on at most max_sms
// SMs (0: all): no more than are resident at once (2048 threads an SM on sm_80/sm_90).
[[maybe_unused]] int64_t grid_for(int64_t items, int64_t per_block, int64_t max_sms, int device) {
  const int sms = sm_count(device);
  const int use = max_sms > 0 && max_sms < sms ? static_cast<int>(max_sms) : sms;
  const int64_t want = (items + per_block - 1) / per_block;
  return std::max<int64_t>(1, std::min<int64_t>(want, static_cast<int64_t>(use) * (2048 / kThreads)));
}

// Whether a table of table_bytes in host memory (0 for one in GPU memory) is read one block a
// row rather than by the grid-stride kernel. One block per row matched or beat stock
// index_select's read of the sorted index on a large table where the grid-stride kernel did not
// (H200, 32 GB, 400K random indices, ours / naive_uva_sorted at 128 / 256 / 512 / 1024 B: 1.00 /
// 1.01 / 1.05 / 1.06 against 0.95 / 0.92 / 0.86 / 1.05; results/gather_32gb_kernel-*.json), so
// it is the default on tables of kLargeTableBytes and more; the grid-stride kernel keeps smaller
// tables (where it reaches 0.9x memcpy), tables in GPU memory and, by default, any read capped
// to max_sms SMs. The experimental gather_kernel=rowblock or =grid forces either kernel, capped
// or not (row_block_grid: a capped one-block-a-row read loops over its rows).
[[maybe_unused]] bool use_row_per_block(int64_t table_bytes, int64_t max_sms) {
  if (const auto k = torch_direct::experimental::get("gather_kernel")) {
    TORCH_CHECK(*k == "rowblock" || *k == "grid", torch_direct::experimental::kVariable,
                ": gather_kernel must be rowblock or grid, not '", *k, "'");
    return *k == "rowblock";
  }
  return table_bytes >= kLargeTableBytes && max_sms <= 0;
}

// Blocks of a one-block-a-row read of n rows with `threads` threads a block: one a row, or,
// capped to max_sms SMs, as many as that many SMs hold at once (32 blocks an SM at most on
// sm_80/sm_90), each block then taking rows gridDim.x apart. The blocks resident at any moment
// then read neighbouring entries, so a sorted index is still read in address order.
[[maybe_unused]] int64_t row_block_grid(int64_t n, int64_t threads, int64_t max_sms, int device) {
  if (max_sms <= 0) {
    return n;
  }
  const int sms = sm_count(device);
  const int64_t use = max_sms < sms ? max_sms : sms;
  const int64_t per_sm = std::min<int64_t>(32, 2048 / threads);
  return std::max<int64_t>(1, std::min<int64_t>(n, use * per_sm));
}

} // namespace
} // namespace torch_direct::rows
