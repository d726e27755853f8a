#pragma once
// Unified tensors over pages that are not the allocator's own, and across
// processes: pinning a CPU tensor in place, the shared-memory handle a
// unified tensor travels as, and the runtime's view of a unified block
// (its kind, whether GPUs have it mapped, CPU/CUDA aliases). Python-free, so both vehicles compile it (the
// extension binds it in csrc/extension/Module.cpp, the fork in
// torch/csrc/Unified.cpp); pickling and the fd's transport are Python's
// (torch_direct/_reductions.py, torch/unified/_reductions.py).

#include <ATen/core/Tensor.h>

#include "Export.h"

#include <cstddef>
#include <string>

namespace at::native::unified {

// A unified tensor over t's own pages, no copy (t: a strided CPU tensor; a
// unified tensor is returned as is). The pages are registered for every GPU
// now and unregistered when the last alias dies; t keeps them alive.
TORCH_DIRECT_ATEN_API at::Tensor pin_inplace(const at::Tensor& t);

// An uninitialized contiguous unified tensor of `sizes` and like's dtype in
// memory the CUDA driver allocates and maps itself (c10_allocator/
// DriverHostMemory.h): fewer address translations for a GPU's random reads.
// Throws saying why where the driver cannot (no GPU, no host NUMA support).
TORCH_DIRECT_ATEN_API at::Tensor driver_mapped_empty(at::IntArrayRef sizes, const at::Tensor& like);

// The CPU tensor whose pages a pin_inplace() alias `u` maps, with u's geometry.
TORCH_DIRECT_ATEN_API at::Tensor pinned_owner(const at::Tensor& u);

struct SharedHandle {
  int fd;                     // -1 for an empty storage
  size_t mapped_bytes;        // bytes of the shared mapping
  size_t storage_nbytes;      // bytes of u's storage
};

// Moves u's storage into shared memory if needed and returns its handle; the
// fd stays owned by the allocator (duplicate it to send it).
TORCH_DIRECT_ATEN_API SharedHandle share(const at::Tensor& u);

// A unified tensor over the storage another process shared (fd: -1 for an
// empty storage; duplicated, the caller keeps its own), with like's geometry
// and dtype.
TORCH_DIRECT_ATEN_API at::Tensor from_shared(int fd, size_t storage_nbytes, const at::Tensor& like);

// "foreign" (pin_inplace), "shared", or the kind of block the allocator made.
TORCH_DIRECT_ATEN_API std::string block_kind(const at::Tensor& u);

// Whether u's pages are registered (mapped) for GPUs; map them now.
TORCH_DIRECT_ATEN_API bool is_mapped(const at::Tensor& u);
TORCH_DIRECT_ATEN_API void map_for_gpu(const at::Tensor& u);

// alias_as() (Placement.h) for callers outside ATen, u checked to be unified.
TORCH_DIRECT_ATEN_API at::Tensor as_cuda_alias(const at::Tensor& u, int64_t device);
TORCH_DIRECT_ATEN_API at::Tensor as_cpu_alias(const at::Tensor& u);

} // namespace at::native::unified
