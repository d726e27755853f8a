// The cached gather's CUDA pass (CachedGather.h): one kernel reads each entry's row from the
// cache in device memory or, for a miss, from the table in place (mapped host memory), casts
// (and scales) it into out, and counts misses and bad rows on the device. No host wait: the
// loader thread that queues it goes on to the next batch at once.
//
// Work items are (entry, chunk of V elements) pairs, a grid-stride loop with kUnroll items in
// flight per thread (reads of host memory take microseconds: keep many pending), as the
// device's own gather kernel does on tables below 8 GiB; larger tables in host memory take one
// block per entry, as the device's gather does there. A row's chunks go to adjacent lanes, so a row is read in
// one go; with pos (the index sorted, pos[j] the output row of entry j) the misses are read
// in address order, which large tables in host memory need.

#include "CachedGather.h"

#include "csrc/aten/RowGather.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace torch_direct::features {
namespace {

using namespace torch_direct::rows;  // RowGather.cuh

template <typename out_t, int V>
__device__ __forceinline__ Vec<out_t, V> zeros() {
  Vec<out_t, V> z;
#pragma unroll
  for (int k = 0; k < V; ++k) z.v[k] = static_cast<out_t>(0.0f);
  return z;
}

// What one pass reads and writes (CachedGather.h); widths and strides in elements.
template <typename in_t, typename out_t, typename index_t>
struct Args {
  const in_t* table;
  int64_t stride, rows;
  const in_t* cache;
  int64_t cache_rows;
  const int32_t* slot;
  const index_t* index;
  const int64_t* pos;   // null: entry j writes output row j
  int64_t n, chunks;    // entries; chunks of V elements a row
  out_t* out;
  const float* scale;        // null: an unscaled table
  const float* cache_scale;
  unsigned long long* counters;   // misses, bad rows
};

// Where entry j's row comes from. Returns 0 with out_row = -1 when its output position lies
// outside out (nothing written), 1 with src and its scale for a row to read (miss: whether it
// is the table's), 2 for a row outside the table or a slot past the cache (zeros written).
template <typename in_t, typename out_t, typename index_t>
__device__ __forceinline__ int source(const Args<in_t, out_t, index_t>& a, int64_t j, int64_t width,
                                      int64_t& out_row, const in_t*& src, float& f, bool& miss) {
  out_row = a.pos == nullptr ? j : a.pos[j];
  if (out_row < 0 || out_row >= a.n) {
    return 0;
  }
  const int64_t r = static_cast<int64_t>(a.index[j]);
  f = 1.0f;
  miss = false;
  if (r < 0 || r >= a.rows) {
    return 2;
  }
  const int64_t s = a.slot[r];
  if (s < 0) {
    src = a.table + r * a.stride;
    if (a.scale != nullptr) f = a.scale[r];
    miss = true;
    return 1;
  }
  if (s >= a.cache_rows) {
    return 2;
  }
  src = a.cache + s * width;
  if (a.cache_scale != nullptr) f = a.cache_scale[s];
  return 1;
}

template <typename in_t, typename out_t, int V, typename index_t>
__global__ void __launch_bounds__(kThreads) cached_gather_kernel(const Args<in_t, out_t, index_t> a) {
  using InV = Vec<in_t, V>;
  using OutV = Vec<out_t, V>;
  const int64_t width = a.chunks * V;
  const int64_t total = a.n * a.chunks;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  unsigned long long misses = 0, bad = 0;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < total;
       base += step) {
    InV val[kUnroll];
    float f[kUnroll];
    int64_t dst[kUnroll];   // the chunk's first output element
    int state[kUnroll];     // as source() says; 0 also past the batch's end
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t item = base + static_cast<int64_t>(u) * kThreads;
      state[u] = 0;
      if (item >= total) {
        continue;
      }
      const int64_t j = item / a.chunks;
      const int64_t c = item - j * a.chunks;
      int64_t row;
      const in_t* src = nullptr;
      bool miss = false;
      state[u] = source(a, j, width, row, src, f[u], miss);
      misses += c == 0 && miss;
      bad += c == 0 && state[u] != 1;
      if (state[u] == 0) {
        continue;
      }
      dst[u] = row * width + c * V;
      if (state[u] == 1) {
        val[u] = reinterpret_cast<const InV*>(src)[c];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (state[u] != 0) {
        *reinterpret_cast<OutV*>(a.out + dst[u]) =
            state[u] == 1 ? convert<in_t, out_t, V>(val[u], f[u]) : zeros<out_t, V>();
      }
    }
  }
  // one atomic per warp and counter
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    misses += __shfl_down_sync(0xffffffffu, misses, off);
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if ((threadIdx.x & 31) == 0) {
    if (misses) atomicAdd(a.counters, misses);
    if (bad) atomicAdd(a.counters + 1, bad);
  }
}

// One entry (row) per block, the block's threads over its chunks: the geometry the device's own
// gather uses on tables of 8 GiB and more in host memory, where the hardware scheduler's window
// of resident blocks, started in entry order, keeps the reads of a sorted index close together
// in the table, which address translation needs (docs/gather.md); a grid-stride loop over the
// whole batch spreads them out; capped to fewer SMs, each block takes entries gridDim.x apart.
// Only misses and bad rows are counted (one atomic an entry at most).
template <typename in_t, typename out_t, int V, typename index_t>
__global__ void cached_gather_row_per_block_kernel(const Args<in_t, out_t, index_t> a) {
  using InV = Vec<in_t, V>;
  using OutV = Vec<out_t, V>;
  const int64_t width = a.chunks * V;
  for (int64_t j = blockIdx.x; j < a.n; j += gridDim.x) {   // once, unless capped (row_block_grid)
    int64_t row;
    const in_t* src = nullptr;
    float f;
    bool miss = false;
    const int state = source(a, j, width, row, src, f, miss);
    if (threadIdx.x == 0 && (miss || state != 1)) {
      atomicAdd(a.counters + (miss ? 0 : 1), 1ull);
    }
    if (state == 0) {
      continue;
    }
    OutV* dst = reinterpret_cast<OutV*>(a.out + row * width);
    for (int64_t c = threadIdx.x; c < a.chunks; c += blockDim.x) {
      dst[c] = state == 1 ? convert<in_t, out_t, V>(reinterpret_cast<const InV*>(src)[c], f) : zeros<out_t, V>();
    }
  }
}

template <typename in_t, typename out_t, int V, typename index_t>
void launch(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot, const at::Tensor& index,
            const at::Tensor& pos, at::Tensor& out, const at::Tensor& scale, const at::Tensor& cache_scale,
            at::Tensor& counters, int64_t max_sms) {
  const Args<in_t, out_t, index_t> a{
      table.const_data_ptr<in_t>(), table.stride(0), table.size(0), cache.const_data_ptr<in_t>(), cache.size(0),
      slot.const_data_ptr<int32_t>(), index.const_data_ptr<index_t>(),
      pos.defined() ? pos.const_data_ptr<int64_t>() : nullptr, index.size(0), table.size(1) / V,
      out.data_ptr<out_t>(), scale.defined() ? scale.const_data_ptr<float>() : nullptr,
      cache_scale.defined() ? cache_scale.const_data_ptr<float>() : nullptr,
      reinterpret_cast<unsigned long long*>(counters.data_ptr<int64_t>())};
  auto stream = c10::cuda::getCurrentCUDAStream(out.device().index());
  const int64_t table_bytes = table.size(0) * table.stride(0) * table.element_size();
  if (use_row_per_block(table_bytes, max_sms) && a.n <= std::numeric_limits<int32_t>::max()) {
    const int64_t threads = std::min<int64_t>(kThreads, (a.chunks + 31) / 32 * 32);
    const int64_t grid = row_block_grid(a.n, threads, max_sms, out.device().index());
    cached_gather_row_per_block_kernel<in_t, out_t, V, index_t><<<grid, threads, 0, stream>>>(a);
  } else {
    const int64_t grid = grid_for(a.n * a.chunks, kThreads * kUnroll, max_sms, out.device().index());
    cached_gather_kernel<in_t, out_t, V, index_t><<<grid, kThreads, 0, stream>>>(a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The widest V (elements a load) that divides the row and keeps every row of the table, the
// cache and out aligned to it: 16 bytes of the table's elements at most.
template <typename in_t, typename out_t>
int vector_width(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& out) {
  const int64_t width = table.size(1);
  for (int v : {16, 8, 4, 2}) {
    if (static_cast<int64_t>(sizeof(in_t)) * v > 16) {
      continue;
    }
    const int64_t in_bytes = static_cast<int64_t>(sizeof(in_t)) * v;
    const int64_t out_bytes = static_cast<int64_t>(sizeof(out_t)) * v;
    if (width % v == 0 && table.stride(0) % v == 0 && aligned(table.const_data_ptr(), in_bytes) &&
        aligned(cache.const_data_ptr(), in_bytes) && aligned(out.const_data_ptr(), out_bytes)) {
      return v;
    }
  }
  return 1;
}

template <typename in_t, typename out_t, typename index_t>
void launch_widest(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
                   const at::Tensor& index, const at::Tensor& pos, at::Tensor& out, const at::Tensor& scale,
                   const at::Tensor& cache_scale, at::Tensor& counters, int64_t max_sms) {
  const int v = vector_width<in_t, out_t>(table, cache, out);
  auto go = [&](auto width_tag) {
    constexpr int V = decltype(width_tag)::value;
    if constexpr (sizeof(in_t) * V <= 16) {
      launch<in_t, out_t, V, index_t>(table, cache, slot, index, pos, out, scale, cache_scale, counters, max_sms);
    } else {
      TORCH_INTERNAL_ASSERT(false, "cached_gather: a load wider than 16 bytes");
    }
  };
  switch (v) {
    case 16: go(std::integral_constant<int, 16>{}); break;
    case 8: go(std::integral_constant<int, 8>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    default: go(std::integral_constant<int, 1>{}); break;
  }
}

} // namespace

void cached_gather_cuda(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
                        const at::Tensor& index, const at::Tensor& pos, at::Tensor& out,
                        const at::Tensor& scale, const at::Tensor& cache_scale, at::Tensor& counters,
                        int64_t max_sms) {
  if (index.size(0) == 0 || table.size(1) == 0) {
    return;
  }
  c10::cuda::CUDAGuard guard(out.device());
  torch_direct::rows::dispatch_cast(table.scalar_type(), out.scalar_type(), "cached_gather", [&](auto in_tag, auto out_tag) {
    using in_t = decltype(in_tag);
    using out_t = decltype(out_tag);
    if (index.scalar_type() == at::kInt) {
      launch_widest<in_t, out_t, int32_t>(table, cache, slot, index, pos, out, scale, cache_scale, counters, max_sms);
    } else {
      launch_widest<in_t, out_t, int64_t>(table, cache, slot, index, pos, out, scale, cache_scale, counters, max_sms);
    }
  });
}

} // namespace torch_direct::features
