#pragma once
// Page-locking and GPU-mapping of host ranges, shared by every unified block.
//
// Ranges are kept as disjoint, reference-counted intervals so that the same
// pages can be asked for twice (two pin_inplace calls on one tensor, a view
// and its base, an import of memory this process already maps) without a
// driver error, and are unregistered exactly once, when the last holder goes.
// A request larger than the driver's per-call limit is split into chunks.

#include "Export.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace c10::unified {

class TORCH_DIRECT_ALLOCATOR_API HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();

  // Bytes this handle keeps registered (whole pages, shared ones included).
  size_t bytes() const { return bytes_; }

 private:
  friend TORCH_DIRECT_ALLOCATOR_API std::unique_ptr<HostRegistration> register_host_range(void*, size_t);
  std::vector<uintptr_t> intervals_;
  size_t bytes_ = 0;
  uint64_t generation_ = 0;
};

// Incremented in a fork()ed child: registrations made by the parent mean
// nothing to the child's CUDA context, so blocks map their pages again.
TORCH_DIRECT_ALLOCATOR_API uint64_t fork_generation();

// Registers [ptr, ptr + size) (rounded out to whole pages). Returns nullptr
// when there is no usable GPU (nothing to map for). Throws c10::Error naming
// the size and the driver's reason when the pages cannot be locked.
TORCH_DIRECT_ALLOCATOR_API std::unique_ptr<HostRegistration> register_host_range(void* ptr, size_t size);

// Bytes currently page-locked by this process through this registry, and the
// number of driver registrations behind them.
TORCH_DIRECT_ALLOCATOR_API size_t registered_bytes();
TORCH_DIRECT_ALLOCATOR_API size_t registration_count();

// Largest single cudaHostRegister call (env TORCH_DIRECT_REGISTER_CHUNK_MB,
// default 1024 MiB).
TORCH_DIRECT_ALLOCATOR_API size_t register_chunk_bytes();

// Bytes from `ptr` to the end of the driver registration that holds it (0 if
// none does). One cudaMemcpy may not span two registrations: the driver
// rejects it ("invalid argument"), so copies of large blocks are split here.
TORCH_DIRECT_ALLOCATOR_API size_t registered_run(const void* ptr);

TORCH_DIRECT_ALLOCATOR_API size_t host_page_size();

} // namespace c10::unified
