#pragma once
// Pinned host memory that the CUDA driver allocates and maps itself.
//
// A unified block is ordinary host memory (a memfd) that the driver registers
// page by page: a GPU reading it at random pays an address translation for
// nearly every row of a large table, one 4 KiB page at a time. Here the driver
// allocates the memory itself (cuMemCreate on the host's NUMA node, in pieces
// of its allocation granularity, 2 MiB where it says so) and maps it at one
// address for the CPU and every GPU (cuMemMap, cuMemSetAccess), so the same
// table spans 512 times fewer translations.
//
// Such memory cannot be shared with another process nor inherited by a
// fork()ed child, and it needs a GPU whose driver supports host NUMA
// allocations through its virtual memory management calls (CUDA 12.2+).
// Built without CUDA, or with no usable GPU, allocation returns the reason.

#include "Export.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace c10::unified::cuda {

struct DriverHostMapping {
  void* ptr = nullptr;      // the address the CPU and every GPU use
  size_t size = 0;          // bytes mapped: the request rounded up to `granularity`
  uint64_t handle = 0;      // the driver's allocation handle
  size_t granularity = 0;   // the driver's recommended allocation granularity
};

// Allocates and maps at least `nbytes`. Returns "" and fills `out`, or the
// reason the driver gave (nothing is left allocated then).
TORCH_DIRECT_ALLOCATOR_API std::string driver_host_alloc(size_t nbytes, DriverHostMapping* out);

// Unmaps and releases a mapping driver_host_alloc made. Never throws.
TORCH_DIRECT_ALLOCATOR_API void driver_host_free(const DriverHostMapping& m);

} // namespace c10::unified::cuda
