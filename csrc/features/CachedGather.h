#pragma once
// One pass of a feature store's cached gather: for each entry j of `index`, with r = index[j],
//   out[pos[j]] = (slot[r] >= 0 ? cache[slot[r]] : table[r]) (* that row's scale) as out's dtype
// (pos null: position j). The hot rows live in `cache` (device memory), the rest in `table`
// (read in place: on a GPU, host memory mapped for it). counters (int64, 2 entries, on out's
// device) accumulates the entries that read `table` (misses) and those whose row lies outside
// [0, rows) (written as zeros, never read), so that the caller learns both without waiting for
// the device. The two-pass form it replaces looked the slots up, waited for the device to count
// the misses, gathered every entry from the cache, then the misses from the table (their index
// sorted, a second wait for its bounds check) and scattered them back.

#include "csrc/aten/RowGather.h"

#include <ATen/ATen.h>

namespace torch_direct::features {

// Tables of kLargeTableBytes or more in host memory are read as the device's own gather reads
// them (csrc/aten/RowGather.cuh): the index sorted first (the caller does it, passing pos) and
// one block a row. The module exports the size as large_table_bytes for the caller's choice.
using torch_direct::rows::kLargeTableBytes;

// The checks both paths make (throws c10::Error naming the argument).
void check_cached_gather(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
                         const at::Tensor& index, const at::Tensor& pos, const at::Tensor& out,
                         const at::Tensor& scale, const at::Tensor& cache_scale,
                         const at::Tensor& counters);

// table, cache, slot, index, out, counters on the CPU (pos, scale, cache_scale undefined or
// there too). Runs on ATen's intra-op threads.
void cached_gather_cpu(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
                       const at::Tensor& index, const at::Tensor& pos, at::Tensor& out,
                       const at::Tensor& scale, const at::Tensor& cache_scale, at::Tensor& counters);

#ifdef TORCH_DIRECT_WITH_CUDA
// Every tensor on one CUDA device (`table` may be a CUDA view of mapped host memory); on the
// current stream, at most max_sms SMs (0: all). Returns without waiting for the device.
void cached_gather_cuda(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
                        const at::Tensor& index, const at::Tensor& pos, at::Tensor& out,
                        const at::Tensor& scale, const at::Tensor& cache_scale, at::Tensor& counters,
                        int64_t max_sms);
#endif

// The entry point: checks, then the CPU or CUDA pass by out's device.
void cached_gather(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot,
                   const at::Tensor& index, const at::Tensor& pos, at::Tensor& out,
                   const at::Tensor& scale, const at::Tensor& cache_scale, at::Tensor& counters,
                   int64_t max_sms);

} // namespace torch_direct::features
