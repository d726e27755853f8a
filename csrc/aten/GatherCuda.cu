// Row gather from a host-resident (unified) or device table into a CUDA tensor
// (rule R1): the kernel behind torch_direct.gather, index_select, index and
// embedding on unified tables.
//
// Why it is shaped this way (docs/gather.md has the measurements): on tables
// of many GB, GPU reads of mapped host memory are limited by how fast their
// addresses are translated, not by PCIe bandwidth, and reads in address order
// translate far faster than random ones. So:
//   1. one pass over the index computes min, max and "already sorted", and the
//      host raises IndexError on a bad value before any row is read;
//   2. unless the caller says otherwise or the index is already sorted, the
//      (row, position) pairs are radix-sorted on the row (only the bits a row
//      number can have);
//   3. the gather reads rows in that order, each distinct row once (equal rows
//      are adjacent after sorting), and writes it to every position asking for
//      it; loads are the widest aligned vector the row allows; a dtype cast
//      between floating types is fused into the store, and so is the per-row
//      scale of a float8 table (gather_rows_scaled_cuda: row * scale[row]);
//   4. it runs on the current stream, optionally on fewer SMs than the GPU has.
// The kernel re-checks each row number and never reads outside the table.

#include "Experimental.h"
#include "HybridSplit.h"
#include "Placement.h"
#include "RowGather.cuh"
#include "UnifiedKernels.h"

#include "c10_allocator/Text.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>
#include <torch/version.h>

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <tuple>
#include <mutex>
#include <string>
#include <type_traits>

// PyTorch's own CUDA build wraps cub in a namespace
// (-DCUB_WRAPPED_NAMESPACE=at_cuda_detail); the extension's build does not.
#ifdef CUB_WRAPPED_NAMESPACE
namespace td_cub = ::CUB_WRAPPED_NAMESPACE::cub;
#else
namespace td_cub = ::cub;
#endif

namespace at::native::unified {
namespace {

using namespace torch_direct::rows;  // RowGather.cuh

template <int N>
struct alignas(N) Bytes {
  unsigned char b[N];
};

template <typename key_t>
__device__ __forceinline__ int64_t to_row(key_t k, int64_t rows) {
  if constexpr (std::is_signed_v<key_t>) {
    return k < 0 ? static_cast<int64_t>(k) + rows : static_cast<int64_t>(k);
  } else {
    return static_cast<int64_t>(k);
  }
}

// ---------------------------------------------------------------------------
// 1. min / max / sortedness of the index, one pass.

template <typename index_t>
__global__ void index_stats_kernel(const index_t* __restrict__ idx, int64_t n, int64_t rows,
                                   long long* __restrict__ stats) {
  long long lo = std::numeric_limits<long long>::max();
  long long hi = std::numeric_limits<long long>::min();
  int unsorted = 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const long long v = static_cast<long long>(idx[i]);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    if (i > 0) {
      unsorted |= to_row(idx[i - 1], rows) > to_row(idx[i], rows);
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const long long olo = __shfl_xor_sync(0xffffffffu, lo, off);
    const long long ohi = __shfl_xor_sync(0xffffffffu, hi, off);
    lo = olo < lo ? olo : lo;
    hi = ohi > hi ? ohi : hi;
    unsorted |= __shfl_xor_sync(0xffffffffu, unsorted, off);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMin(&stats[0], lo);
    atomicMax(&stats[1], hi);
    if (unsorted) {
      atomicOr(reinterpret_cast<unsigned long long*>(&stats[2]), 1ull);
    }
  }
}

__global__ void stats_init_kernel(long long* stats) {
  stats[0] = std::numeric_limits<long long>::max();
  stats[1] = std::numeric_limits<long long>::min();
  stats[2] = 0;
}

// ---------------------------------------------------------------------------
// 2. (row, position) pairs for sorting.

template <typename index_t, typename key_t>
__global__ void make_pairs_kernel(const index_t* __restrict__ idx, int64_t n, int64_t rows,
                                  key_t* __restrict__ keys, int32_t* __restrict__ pos) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    keys[i] = static_cast<key_t>(to_row(idx[i], rows));
    pos[i] = static_cast<int32_t>(i);
  }
}

// ---------------------------------------------------------------------------
// 3. The gather. Work item = (entry j, chunk c of its row); consecutive threads
// take consecutive chunks, so a row is read by adjacent lanes in one go. Entry
// j reads row to_row(keys[j]) and writes output row pos[j] (j itself when pos
// is null). With `dedupe`, an entry whose key equals the previous one is
// skipped, and the first of a run of equal keys writes every position of the
// run.

// The scale of row r (null `scale`: an unscaled table).
__device__ __forceinline__ float row_scale(const float* __restrict__ scale, int64_t r) {
  return scale == nullptr ? 1.0f : scale[r];
}

// The table row entry j reads, or -1 when it reads none: with `dedupe`, j repeats the key
// before it (the first entry of the run writes for all of it); or the row lies outside the
// table, which the host check before every launch makes unreachable (never read outside it;
// such an entry's output row would be left unwritten).
template <typename key_t>
__device__ __forceinline__ int64_t row_to_read(const key_t* __restrict__ keys, int64_t j,
                                               int64_t rows, bool dedupe) {
  const key_t k = keys[j];
  if (dedupe && j > 0 && keys[j - 1] == k) {
    return -1;
  }
  const int64_t r = to_row(k, rows);
  return r >= 0 && r < rows ? r : -1;
}

// Store chunk c of entry j's row at its output position and, with `dedupe`, at those of the
// entries after it that repeat its key.
template <typename OutV, typename key_t>
__device__ __forceinline__ void write_run(const OutV& o, char* __restrict__ out, int64_t out_row_bytes,
                                          const key_t* __restrict__ keys,
                                          const int32_t* __restrict__ pos, int64_t n, int64_t j,
                                          int64_t c, bool dedupe) {
  const key_t k = keys[j];
  for (int64_t e = j;;) {
    const int64_t p = pos == nullptr ? e : static_cast<int64_t>(pos[e]);
    reinterpret_cast<OutV*>(out + p * out_row_bytes)[c] = o;
    if (!dedupe || ++e >= n || keys[e] != k) {
      break;
    }
  }
}

template <typename in_t, typename out_t, int V, typename key_t>
__global__ void __launch_bounds__(kThreads)
gather_kernel(const char* __restrict__ table, int64_t row_stride_bytes, int64_t rows,
              const key_t* __restrict__ keys, const int32_t* __restrict__ pos, int64_t n,
              int64_t chunks, char* __restrict__ out, int64_t out_row_bytes, bool dedupe,
              const float* __restrict__ scale) {
  using InV = Vec<in_t, V>;
  const int64_t total = n * chunks;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
       base < total; base += step) {
    InV val[kUnroll];
    float sc[kUnroll];
    int64_t entry[kUnroll];
    int64_t chunk[kUnroll];
    bool live[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t item = base + static_cast<int64_t>(u) * kThreads;
      live[u] = false;
      if (item < total) {
        const int64_t j = item / chunks;
        entry[u] = j;
        chunk[u] = item - j * chunks;
        const int64_t r = row_to_read(keys, j, rows, dedupe);
        if (r >= 0) {
          live[u] = true;
          val[u] = reinterpret_cast<const InV*>(table + r * row_stride_bytes)[chunk[u]];
          sc[u] = row_scale(scale, r);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (live[u]) {
        write_run(convert<in_t, out_t, V>(val[u], sc[u]), out, out_row_bytes, keys, pos, n, entry[u],
                  chunk[u], dedupe);
      }
    }
  }
}

// One entry (row) per block (or, capped to fewer SMs, a block's rows gridDim.x apart), the
// block's threads over the row's chunks: the launch geometry of
// stock `u[idx]` (one block per index, 16-byte loads, a warp or more a row). The hardware
// scheduler then keeps at most its resident blocks' rows in flight (32 blocks an SM on
// sm_90), started in entry order as earlier ones finish: on a sorted index a window that
// slides through the table in address order, without the lockstep of a grid-stride loop.
// For copies and fused casts alike; chosen by use_row_per_block (RowGather.cuh).
template <typename in_t, typename out_t, int V, typename key_t>
__global__ void gather_row_per_block_kernel(const char* __restrict__ table, int64_t row_stride_bytes,
                                            int64_t rows, const key_t* __restrict__ keys,
                                            const int32_t* __restrict__ pos, int64_t n, int64_t chunks,
                                            char* __restrict__ out, int64_t out_row_bytes, bool dedupe,
                                            const float* __restrict__ scale) {
  using InV = Vec<in_t, V>;
  for (int64_t j = blockIdx.x; j < n; j += gridDim.x) {   // once, unless capped (row_block_grid)
    const int64_t r = row_to_read(keys, j, rows, dedupe);
    if (r < 0) {
      continue;
    }
    const float s = row_scale(scale, r);
    const InV* src = reinterpret_cast<const InV*>(table + r * row_stride_bytes);
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      write_run(convert<in_t, out_t, V>(src[c], s), out, out_row_bytes, keys, pos, n, j, c, dedupe);
    }
  }
}

// Distinct table rows the whole grid has in flight at once (0: no cap). On a
// large table each row read is a translation of its own page, and reads spread
// over too many pages at a time thrash the GPU's address translation: on the
// H200 machine, 400K random rows of a 32 GB table (read sorted) came 1.4x
// faster with 2048 rows of 128 B in flight than with a full grid, while a 1 GB
// table lost 40% with it (results/gather_window.json). The cap counts rows,
// not bytes: a byte cap starves wide rows (1 KiB rows with 256 KiB in flight
// reached 27 GB/s where stock index_select reached 47). The experimental
// gather_window_rows overrides the choice.
constexpr int64_t kLargeTableWindowRows = 2048;

int64_t window_rows(int64_t table_bytes) {
  return torch_direct::experimental::get_int("gather_window_rows",
                                              table_bytes >= kLargeTableBytes ? kLargeTableWindowRows : 0, 0);
}

// Blocks for `items` work items of which `chunks` make one row.
int64_t gather_grid(int64_t items, int64_t chunks, int max_sms, c10::DeviceIndex device,
                    int64_t table_bytes) {
  int64_t grid = grid_for(items, kThreads * kUnroll, max_sms, device);
  const int64_t window = window_rows(table_bytes);
  if (window > 0) {
    const int64_t per_block = kThreads * kUnroll;
    grid = std::min(grid, std::max<int64_t>(1, (window * chunks + per_block - 1) / per_block));
  }
  return grid;
}

// The widest of 16/8/4/2/1 bytes dividing the row, the row stride and both
// base addresses. The experimental gather_max_unit (bytes) caps it, for
// experiments on the width of each load (experiments/gather_phase_probe.py).
int copy_unit(int64_t row_bytes, int64_t stride_bytes, const void* in, const void* out) {
  const int64_t cap = torch_direct::experimental::get_int("gather_max_unit", 16, 1);
  for (int u : {16, 8, 4, 2}) {
    if (u <= cap && row_bytes % u == 0 && stride_bytes % u == 0 && aligned(in, u) && aligned(out, u)) {
      return u;
    }
  }
  return 1;
}

// Either read kernel over n entries of `chunks` chunks (of V elements) each.
// `host`: the table lies in host memory (unified), read over PCIe. Only there do a large table's
// reads hit the address-translation limit that the one-block-per-row kernel and the window of
// rows in flight are for; a table in GPU memory always takes the grid-stride kernel, unwindowed.
template <typename in_t, typename out_t, int V, typename key_t>
void launch_rows(const char* table, int64_t stride_bytes, int64_t rows, const key_t* keys,
                 const int32_t* pos, int64_t n, int64_t chunks, char* out, int64_t out_row_bytes,
                 bool dedupe, int max_sms, c10::DeviceIndex device, cudaStream_t stream, bool host,
                 const float* scale = nullptr) {
  const int64_t table_bytes = host ? rows * stride_bytes : 0;
  if (use_row_per_block(table_bytes, max_sms) && n <= std::numeric_limits<int32_t>::max()) {
    const int64_t threads = std::min<int64_t>(kThreads, (chunks + 31) / 32 * 32);
    const int64_t grid = row_block_grid(n, threads, max_sms, device);
    gather_row_per_block_kernel<in_t, out_t, V, key_t><<<grid, threads, 0, stream>>>(
        table, stride_bytes, rows, keys, pos, n, chunks, out, out_row_bytes, dedupe, scale);
  } else {
    const int64_t grid = gather_grid(n * chunks, chunks, max_sms, device, table_bytes);
    gather_kernel<in_t, out_t, V, key_t><<<grid, kThreads, 0, stream>>>(
        table, stride_bytes, rows, keys, pos, n, chunks, out, out_row_bytes, dedupe, scale);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// f(Bytes<unit>{}) for a copy unit of 16/8/4/2/1 bytes.
template <typename F>
void with_unit(int unit, F&& f) {
  switch (unit) {
    case 16: f(Bytes<16>{}); break;
    case 8: f(Bytes<8>{}); break;
    case 4: f(Bytes<4>{}); break;
    case 2: f(Bytes<2>{}); break;
    case 1: f(Bytes<1>{}); break;
    default: TORCH_INTERNAL_ASSERT(false, "bad copy unit");
  }
}

template <typename key_t>
void launch_copy(int unit, const char* table, int64_t stride_bytes, int64_t rows,
                 const key_t* keys, const int32_t* pos, int64_t n, int64_t row_bytes, char* out,
                 bool dedupe, int max_sms, c10::DeviceIndex device, cudaStream_t stream, bool host) {
  with_unit(unit, [&](auto unit_tag) {
    using U = decltype(unit_tag);
    launch_rows<U, U, 1, key_t>(table, stride_bytes, rows, keys, pos, n, row_bytes / unit, out,
                                row_bytes, dedupe, max_sms, device, stream, host);
  });
}

template <typename in_t, typename out_t, typename key_t>
void launch_cast(const char* table, int64_t stride_bytes, int64_t rows, const key_t* keys,
                 const int32_t* pos, int64_t n, int64_t width, char* out, bool dedupe,
                 int max_sms, c10::DeviceIndex device, cudaStream_t stream, bool host,
                 const float* scale) {
  // 16-byte loads of a float8 row (16 elements), 4 elements of a wider one
  constexpr int kWide = sizeof(in_t) == 1 ? 16 : 4;
  auto fits = [&](int v) {
    return width % v == 0 && stride_bytes % (static_cast<int64_t>(sizeof(in_t)) * v) == 0 &&
           aligned(table, sizeof(in_t) * v) && aligned(out, sizeof(out_t) * v);
  };
  const int64_t out_row_bytes = width * static_cast<int64_t>(sizeof(out_t));
  if (fits(kWide)) {
    launch_rows<in_t, out_t, kWide, key_t>(table, stride_bytes, rows, keys, pos, n, width / kWide, out,
                                           out_row_bytes, dedupe, max_sms, device, stream, host, scale);
  } else if (kWide != 4 && fits(4)) {
    launch_rows<in_t, out_t, 4, key_t>(table, stride_bytes, rows, keys, pos, n, width / 4, out,
                                       out_row_bytes, dedupe, max_sms, device, stream, host, scale);
  } else {
    launch_rows<in_t, out_t, 1, key_t>(table, stride_bytes, rows, keys, pos, n, width, out,
                                       out_row_bytes, dedupe, max_sms, device, stream, host, scale);
  }
}

template <typename key_t>
void launch(const at::Tensor& table, const char* base, int64_t rows, const key_t* keys,
            const int32_t* pos, int64_t n, at::Tensor& out, bool dedupe, int max_sms,
            cudaStream_t stream, const float* scale) {
  const int64_t width = row_width(table);
  const int64_t stride_bytes = table.stride(0) * table.element_size();
  const auto device = out.device().index();
  const bool host = is_unified(table);
  char* dst = static_cast<char*>(out.data_ptr());
  if (out.scalar_type() == table.scalar_type()) {
    TORCH_INTERNAL_ASSERT(scale == nullptr, "a scaled gather casts");
    const int64_t row_bytes = width * table.element_size();
    launch_copy<key_t>(copy_unit(row_bytes, stride_bytes, base, dst), base, stride_bytes, rows,
                       keys, pos, n, row_bytes, dst, dedupe, max_sms, device, stream, host);
    return;
  }
  // (equal types with a scale cannot come here: a scale goes with a float8 table only)
  torch_direct::rows::dispatch_cast(table.scalar_type(), out.scalar_type(), "gather", [&](auto in_tag, auto out_tag) {
    launch_cast<decltype(in_tag), decltype(out_tag), key_t>(base, stride_bytes, rows, keys, pos, n, width, dst,
                                                            dedupe, max_sms, device, stream, host, scale);
  });
}

} // namespace

bool gather_cuda_can_cast(c10::ScalarType from, c10::ScalarType to) {
  return from == to || (torch_direct::rows::is_cast_input(from) && torch_direct::rows::is_cast_output(to));
}

IndexStats index_stats_cuda(const at::Tensor& index, int64_t rows) {
  IndexStats r{0, 0, true};
  if (index.numel() == 0) {
    return r;
  }
  TORCH_CHECK(index.is_cuda() && index.dim() == 1 && index.is_contiguous(),
              "index_stats_cuda: expected a contiguous 1-D CUDA index");
  c10::cuda::CUDAGuard guard(index.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor stats = at::empty({3}, index.options().dtype(at::kLong));
  stats_init_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<long long*>(stats.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t n = index.numel();
  const int64_t grid = std::max<int64_t>(
      1, std::min<int64_t>((n + kThreads - 1) / kThreads, sm_count(index.device().index()) * 4));
  AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "index_stats_cuda", [&] {
    index_stats_kernel<index_t><<<grid, kThreads, 0, stream>>>(
        index.const_data_ptr<index_t>(), n, rows,
        reinterpret_cast<long long*>(stats.data_ptr<int64_t>()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  at::Tensor host = at::empty({3}, at::TensorOptions(at::kLong).pinned_memory(true));
  host.copy_(stats, /*non_blocking=*/true);
  // Wait without spinning: the stream may still be busy with earlier work (a
  // previous gather), and a spinning wait would cost a CPU core all along.
  cudaEvent_t done = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventBlockingSync | cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(done, stream));
  const cudaError_t waited = cudaEventSynchronize(done);
  C10_CUDA_CHECK(cudaEventDestroy(done));
  C10_CUDA_CHECK(waited);
  const int64_t* h = host.const_data_ptr<int64_t>();
  r.min = h[0];
  r.max = h[1];
  r.sorted = h[2] == 0;
  return r;
}

namespace {

void check_gather_args(const at::Tensor& table, const at::Tensor& index, const at::Tensor& out,
                       const char* op) {
  TORCH_CHECK(table.dim() >= 1, op, ": the table needs at least one dimension");
  TORCH_CHECK(index.is_cuda() && index.dim() == 1 &&
                  (index.scalar_type() == at::kLong || index.scalar_type() == at::kInt),
              op, ": expected a 1-D int32/int64 CUDA index");
  TORCH_CHECK(out.is_cuda() && out.is_contiguous() && out.device() == index.device(), op,
              ": expected a contiguous out on the index's device");
  TORCH_CHECK(table.size(0) == 0 || table.select(0, 0).is_contiguous(), op,
              ": each row of the table must be contiguous");
  TORCH_CHECK(is_unified(table) || (table.is_cuda() && table.device() == index.device()), op,
              ": the table must be unified or on the index's CUDA device");
  TORCH_CHECK(gather_cuda_can_cast(table.scalar_type(), out.scalar_type()), op,
              ": no fused cast from ", table.scalar_type(), " to ", out.scalar_type());
  TORCH_CHECK(out.numel() == index.numel() * row_width(table), op,
              ": out has the wrong number of elements");
}

// The gather proper, after the checks: `idx` contiguous, every value valid
// (`s` describes the index the caller checked, of which idx may be a part).
void launch_gather(const at::Tensor& table, const at::Tensor& idx, at::Tensor& out,
                   GatherOrder order, int64_t max_sms, const IndexStats& s,
                   const float* scale = nullptr) {
  const int64_t rows = table.size(0);
  const int64_t n = idx.numel();
  if (n == 0 || out.numel() == 0) {
    return;
  }
  // The CUDA view of the table's bytes (records the stream, maps on first use).
  const at::Tensor dev_table = is_unified(table) ? alias_as(table, idx.device()) : table;
  const char* base = static_cast<const char*>(dev_table.const_data_ptr());
  auto stream = c10::cuda::getCurrentCUDAStream();

  const bool sort = order == GatherOrder::kSort ||
                    (order == GatherOrder::kAuto && !s.sorted && n >= kSortThreshold);
  if (!sort || s.sorted || n > std::numeric_limits<int32_t>::max()) {
    // In index order; an index already sorted has its repeats adjacent: read them once.
    AT_DISPATCH_INDEX_TYPES(idx.scalar_type(), "gather_rows_cuda", [&] {
      launch<index_t>(table, base, rows, idx.const_data_ptr<index_t>(), nullptr, n, out,
                      /*dedupe=*/s.sorted, static_cast<int>(max_sms), stream, scale);
    });
    return;
  }
  const int end_bit = rows <= 1 ? 1 : 64 - __builtin_clzll(static_cast<unsigned long long>(rows - 1));
  auto run_sorted = [&](auto key_zero) {
    using key_t = decltype(key_zero);
    const auto key_dtype = sizeof(key_t) == 4 ? at::kInt : at::kLong;
    at::Tensor keys = at::empty({2, n}, idx.options().dtype(key_dtype));
    at::Tensor pos = at::empty({2, n}, idx.options().dtype(at::kInt));
    auto* k_in = reinterpret_cast<key_t*>(keys[0].data_ptr());
    auto* k_out = reinterpret_cast<key_t*>(keys[1].data_ptr());
    auto* p_in = pos[0].data_ptr<int32_t>();
    auto* p_out = pos[1].data_ptr<int32_t>();
    const int64_t grid = grid_for(n, kThreads, 0, idx.device().index());
    AT_DISPATCH_INDEX_TYPES(idx.scalar_type(), "gather_make_pairs", [&] {
      make_pairs_kernel<index_t, key_t><<<grid, kThreads, 0, stream>>>(
          idx.const_data_ptr<index_t>(), n, rows, k_in, p_in);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    size_t temp_bytes = 0;
    C10_CUDA_CHECK(td_cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, p_in, p_out,
                                                   static_cast<int>(n), 0, end_bit, stream));
    at::Tensor temp = at::empty({static_cast<int64_t>(temp_bytes)}, idx.options().dtype(at::kByte));
    C10_CUDA_CHECK(td_cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, k_in, k_out, p_in,
                                                   p_out, static_cast<int>(n), 0, end_bit, stream));
    launch<key_t>(table, base, rows, k_out, p_out, n, out, /*dedupe=*/true,
                  static_cast<int>(max_sms), stream, scale);
  };
  if (rows <= (int64_t(1) << 32)) {
    run_sorted(uint32_t{0});
  } else {
    run_sorted(uint64_t{0});
  }
}

// The hybrid gather's measured rates per (device, row bytes, table of kLargeTableBytes or more);
// see HybridSplit.h. The GPU path's rate depends on the table's size as much as on the row's
// (H200, 400K random 128 B rows: 43 GB/s from a 1 GB table, 7 from a 32 GB one), so rates
// measured on a small table would misplace the split on a large one. (A max_sms cap, which
// also changes the kernel on large tables, is not part of the key: callers keep one cap.)
std::mutex& rates_mutex() {
  static std::mutex m;
  return m;
}
// The CPU part gathered by index_select goes in up to kHybridPieces pieces of
// at least kHybridPieceBytes (fewer: less of the copy overlapped; smaller:
// more of each piece's start-up).
constexpr int64_t kHybridPieces = 8;
constexpr int64_t kHybridPieceBytes = int64_t(4) << 20;
using RateKey = std::tuple<int, int64_t, bool>;
RateKey rate_key(c10::DeviceIndex device, int64_t row_bytes, int64_t table_bytes) {
  return {static_cast<int>(device), row_bytes, table_bytes >= kLargeTableBytes};
}
std::map<RateKey, HybridRates>& rates() {
  static std::map<RateKey, HybridRates> r;
  return r;
}
HybridParts& parts_so_far() {  // under rates_mutex()
  static HybridParts p;
  return p;
}
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
double fraction_for(const RateKey& key) {
  std::lock_guard<std::mutex> g(rates_mutex());
  const auto it = rates().find(key);
  return choose_hybrid_fraction(it == rates().end() ? HybridRates{} : it->second);
}

} // namespace

// The index's stats: those the caller guarantees (no pass, no wait), or measured.
IndexStats stats_for(const at::Tensor& idx, int64_t rows, const IndexStats* known, const char* op) {
  if (known == nullptr) {
    return index_stats_cuda(idx, rows);
  }
  TORCH_CHECK(known->min >= 0 && known->min <= known->max, op, ": index bounds must satisfy 0 <= lo <= hi, got (",
              known->min, ", ", known->max, ")");
  return IndexStats{known->min, known->max, /*sorted=*/false};
}

at::Tensor& gather_rows_cuda(const at::Tensor& table, const at::Tensor& index, at::Tensor& out,
                             GatherOrder order, int64_t max_sms, const char* op,
                             bool allow_negative, const IndexStats* known) {
  check_gather_settings();
  check_gather_args(table, index, out, op);
  if (index.numel() == 0) {
    return out;
  }
  c10::cuda::CUDAGuard guard(index.device());
  const at::Tensor idx = index.contiguous();
  const IndexStats s = stats_for(idx, table.size(0), known, op);
  check_index_bounds(s.min, s.max, table.size(0), op, allow_negative);  // before any read
  launch_gather(table, idx, out, order, max_sms, s);
  return out;
}

at::Tensor& gather_rows_scaled_cuda(const at::Tensor& table, const at::Tensor& index, at::Tensor& out,
                                    const at::Tensor& scale, GatherOrder order, int64_t max_sms,
                                    const char* op, const IndexStats* known) {
  check_gather_settings();
  check_gather_args(table, index, out, op);
  TORCH_CHECK(table.scalar_type() == at::kFloat8_e4m3fn, op,
              ": a scaled gather reads a float8_e4m3fn table, got ", table.scalar_type());
  TORCH_CHECK(torch_direct::rows::is_cast_output(out.scalar_type()), op,
              ": a scaled gather writes float32, float16 or bfloat16, got ",
              out.scalar_type());
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.dim() == 1 && scale.is_contiguous() &&
                  scale.size(0) == table.size(0),
              op, ": scale must be a contiguous 1-D float32 tensor with one entry per table row (",
              table.size(0), "), got ", scale.scalar_type(), " of shape ", scale.sizes());
  TORCH_CHECK(is_unified(scale) || (scale.is_cuda() && scale.device() == index.device()), op,
              ": scale must be unified or on the index's CUDA device, got ", scale.device());
  if (index.numel() == 0) {
    return out;
  }
  c10::cuda::CUDAGuard guard(index.device());
  const at::Tensor idx = index.contiguous();
  const IndexStats s = stats_for(idx, table.size(0), known, op);
  check_index_bounds(s.min, s.max, table.size(0), op, /*allow_negative=*/true);  // before any read
  const at::Tensor dev_scale = is_unified(scale) ? alias_as(scale, idx.device()) : scale;
  launch_gather(table, idx, out, order, max_sms, s, dev_scale.const_data_ptr<float>());
  return out;
}

namespace {
// Tells the CUDA host allocator that `held` (a pinned block of its own) is read by work queued on
// `stream`: it hands the block out again only once that work is done. False where the block is
// not the allocator's. Newer torch renamed the call and deprecated the old name: the new one
// from torch 2.11 on, the old one before (the fork's 2.6).
bool record_host_copies(const at::DataPtr& held, c10::cuda::CUDAStream stream) {
#if defined(TORCH_VERSION_MINOR) && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 11)
  return at::getHostAllocator(at::kCUDA)->record_event(held.get(), held.get_context(), stream.unwrap());
#else
  return at::cuda::CachingHostAllocator_recordEvent(held.get(), held.get_context(), stream);
#endif
}
}  // namespace

double gather_rows_hybrid(const at::Tensor& table, const at::Tensor& index, at::Tensor& out,
                          int64_t cpu_threads, double cpu_fraction, GatherOrder order,
                          int64_t max_sms, const char* op) {
  check_gather_settings();   // before the CPU share starts on its threads
  check_gather_args(table, index, out, op);
  TORCH_CHECK(is_unified(table), op, ": the hybrid gather reads a unified table");
  TORCH_CHECK(cpu_threads > 0, op, ": the hybrid gather needs cpu_threads > 0");
  const int64_t n = index.numel();
  const int64_t rows = table.size(0);
  if (n == 0 || out.numel() == 0 || rows == 0) {
    gather_rows_cuda(table, index, out, order, max_sms, op);
    return 0.0;
  }
  c10::cuda::CUDAGuard guard(index.device());
  const at::Tensor idx = index.contiguous();
  const int64_t width = row_width(table);
  const int64_t row_bytes = width * static_cast<int64_t>(table.element_size());
  const int64_t table_bytes = rows * table.stride(0) * static_cast<int64_t>(table.element_size());
  const RateKey key = rate_key(idx.device().index(), row_bytes, table_bytes);
  double f = cpu_fraction < 0 ? fraction_for(key) : cpu_fraction;
  f = std::min(1.0, std::max(0.0, f));
  const int64_t k = static_cast<int64_t>(std::llround(f * static_cast<double>(n)));
  const bool ordered_copies = hybrid_copies_ordered();

  // The CPU part's indices come to the host under the same sync as the check.
  auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor idx_host = at::empty({k}, idx.options().device(c10::kCPU).pinned_memory(true));
  if (k > 0) {
    idx_host.copy_(idx.narrow(0, 0, k), /*non_blocking=*/true);
  }
  // Stream order, as for the GPU part: the CPU threads read the table once the work queued
  // before this gather on the current stream is done, which the bounds check's wait covers.
  // Writers on other streams are ordered by the caller (wait_stream), as for any CUDA op: waiting
  // here for every stream that ever used the table would wait for unrelated work (a training
  // step on the default stream after a cache was filled there) before each gather.
  const auto tb = std::chrono::steady_clock::now();
  const IndexStats s = index_stats_cuda(idx, rows);
  check_index_bounds(s.min, s.max, rows, op);
  const double bounds_wait = seconds_since(tb);

  at::Tensor out2d = out.view({n, width});
  cudaEvent_t g0 = nullptr, g1 = nullptr, c1 = nullptr;
  C10_CUDA_CHECK(cudaEventCreate(&g0));
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&g1, cudaEventBlockingSync));
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&c1, cudaEventBlockingSync | cudaEventDisableTiming));
  // GPU part: entries [k, n), launched first so that it runs while the CPU works.
  C10_CUDA_CHECK(cudaEventRecord(g0, stream));
  if (k < n) {
    at::Tensor gpu_out = out2d.narrow(0, k, n - k);
    launch_gather(table, idx.narrow(0, k, n - k), gpu_out, order, max_sms, s);
  }
  C10_CUDA_CHECK(cudaEventRecord(g1, stream));

  // CPU part: entries [0, k) into pinned staging, copied to the GPU on a side
  // stream piece by piece while the next pieces are gathered.
  const auto t0 = std::chrono::steady_clock::now();
  double copy_wait = 0.0;
  if (k > 0) {
    // sized for the whole index whatever the split, so that the host allocator's cached block
    // serves every later call of this size (a new split would otherwise often mean a new block)
    at::Tensor staging =
        at::empty({n, width}, out.options().device(c10::kCPU).pinned_memory(true)).narrow(0, 0, k);
    const c10::DeviceIndex dev = idx.device().index();
    auto side = c10::cuda::getStreamFromPool(false, dev);
    C10_CUDA_CHECK(cudaStreamWaitEvent(side.stream(), g0, 0));  // out is ready on `stream`
    const int64_t row_out = width * static_cast<int64_t>(out.element_size());
    char* dst = static_cast<char*>(out2d.data_ptr());
    const char* src = static_cast<const char*>(staging.const_data_ptr());
    auto copy_rows = [&](int64_t b, int64_t e) {
      c10::cuda::CUDAGuard g(dev);  // a pool thread's current device may be another
      C10_CUDA_CHECK(cudaMemcpyAsync(dst + b * row_out, src + b * row_out, (e - b) * row_out,
                                     cudaMemcpyHostToDevice, side.stream()));
    };
    try {
      // The GPU's check above covered the whole index.
      if (s.min >= 0 && out.scalar_type() == table.scalar_type() && cpu_gather_on_torch_threads(cpu_threads)) {
        // gather_rows_cpu hands these to index_select on torch's threads (its
        // fastest way): a piece at a time, each copied while the next is gathered
        const int64_t pieces =
            std::min<int64_t>(kHybridPieces, std::max<int64_t>(1, k * row_out / kHybridPieceBytes));
        const int64_t per = (k + pieces - 1) / pieces;
        for (int64_t b = 0; b < k; b += per) {
          const int64_t len = std::min(per, k - b);
          at::Tensor piece = staging.narrow(0, b, len);
          gather_rows_cpu(table, idx_host.narrow(0, b, len), piece, cpu_threads, /*wait_for_gpu=*/false,
                          /*allow_negative=*/true, /*indices_checked=*/true);
          copy_rows(b, b + len);
        }
      } else {
        // our threads, each starting the copy of every piece it has written
        gather_rows_cpu(table, idx_host, staging, cpu_threads, /*wait_for_gpu=*/false,
                        /*allow_negative=*/true, /*indices_checked=*/true, copy_rows);
      }
    } catch (...) {
      cudaStreamSynchronize(side.stream());  // no copy may still read staging once it is released
      throw;
    }
    c10::cuda::CUDACachingAllocator::recordStream(out.storage().data_ptr(), side);
    C10_CUDA_CHECK(cudaEventRecord(c1, side.stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), c1, 0));
    // ordered: staging goes back to the host allocator at the end of this block, which hands it
    // out again only once the side stream's copies are done, and the caller's stream waits for
    // them; otherwise (or where staging is not the allocator's) the copies are waited for here
    const at::DataPtr& held = staging.storage().data_ptr();
    if (!ordered_copies || !record_host_copies(held, side)) {
      const auto tc = std::chrono::steady_clock::now();
      C10_CUDA_CHECK(cudaEventSynchronize(c1));
      copy_wait = seconds_since(tc);
    }
  }
  const double t_cpu = seconds_since(t0);
  const auto tg = std::chrono::steady_clock::now();
  C10_CUDA_CHECK(cudaEventSynchronize(g1));
  const double gpu_wait = seconds_since(tg);
  float gpu_ms = 0;
  C10_CUDA_CHECK(cudaEventElapsedTime(&gpu_ms, g0, g1));
  C10_CUDA_CHECK(cudaEventDestroy(g0));
  C10_CUDA_CHECK(cudaEventDestroy(g1));
  C10_CUDA_CHECK(cudaEventDestroy(c1));
  {
    std::lock_guard<std::mutex> g(rates_mutex());
    record_hybrid_call(rates()[key], n, k, t_cpu, k < n ? gpu_ms * 1e-3 : 0.0);
    HybridParts& p = parts_so_far();
    p.calls += 1;
    p.bounds_wait_s += bounds_wait;
    p.cpu_rows_s += t_cpu - copy_wait;
    p.copy_wait_s += copy_wait;
    p.gpu_wait_s += gpu_wait;
  }
  return f;
}

HybridParts hybrid_parts() {
  std::lock_guard<std::mutex> g(rates_mutex());
  return parts_so_far();
}

double hybrid_cpu_fraction(c10::DeviceIndex device, int64_t row_bytes, int64_t table_bytes) {
  return fraction_for(rate_key(device, row_bytes, table_bytes));
}

} // namespace at::native::unified
