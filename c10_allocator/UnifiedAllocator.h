#pragma once
// The unified allocator: host memory that every GPU of the machine can read
// in place (page-locked, mapped, portable), handed to tensors of the unified
// device.
//
// * Large blocks (> 1 MiB) are sized exactly (whole pages) and backed by a
//   memfd, so that another process can map the same pages (one host copy for
//   every GPU process) and a fork()ed child shares them.
// * Small blocks come from power-of-two size classes and are cached.
// * Pages are registered with CUDA when a GPU first needs them (or at once if
//   this process already uses CUDA), so building a table does not create a
//   CUDA context and a fork()ed child can still use its GPU.
// * A block used by work on a CUDA stream is not reused or released until
//   that work has finished (events recorded when the block is freed).

#include "Export.h"

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <map>
#include <string>

namespace c10::unified {

// The forked PyTorch (patches/) has a Unified device type and dispatch key of
// its own and says so with C10_HAS_UNIFIED_DEVICE; on stock PyTorch the
// extension takes PrivateUse1 and renames it "unified".
#ifdef C10_HAS_UNIFIED_DEVICE
constexpr c10::DeviceType kUnifiedDeviceType = c10::DeviceType::Unified;
constexpr c10::DispatchKey kUnifiedDispatchKey = c10::DispatchKey::Unified;
#else
constexpr c10::DeviceType kUnifiedDeviceType = c10::DeviceType::PrivateUse1;
constexpr c10::DispatchKey kUnifiedDispatchKey = c10::DispatchKey::PrivateUse1;
#endif
inline c10::Device unified_device() {
  return c10::Device(kUnifiedDeviceType, 0);
}

struct Block;

class TORCH_DIRECT_ALLOCATOR_API UnifiedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // A unified DataPtr over pages this allocator did not allocate: `keep`
  // holds them alive; they are registered now and unregistered when the
  // last alias dies.
  c10::DataPtr alias_foreign(void* ptr, size_t nbytes, c10::Storage keep);

  // A unified block the CUDA driver allocates and maps itself, for the CPU
  // and every GPU, at its own granularity (DriverHostMemory.h): far fewer
  // address translations for random reads of a large table. Never cached,
  // shared or inherited by a fork()ed child. Throws saying why the driver
  // cannot make one.
  c10::DataPtr allocate_driver_mapped(size_t nbytes);

  // A unified DataPtr over a shared-memory file received from another
  // process (the fd is duplicated; the caller keeps its own).
  c10::DataPtr import_shared(int fd, size_t nbytes);

  // Make `storage` shareable across processes and return (fd, mapped bytes).
  // Small cached blocks move into a shared block first (one copy, the
  // storage keeps its identity). Throws for foreign (pin_inplace) blocks.
  std::pair<int, size_t> share(c10::StorageImpl* storage);

  // Ensure the block behind `ptr` is mapped for GPUs; returns the device
  // address of `ptr`. No-op without CUDA.
  void* ensure_mapped(const c10::DataPtr& ptr);

  // Throws if the block's pages are gone: a pin_inplace alias whose CPU
  // tensor was resized or moved (its storage now points elsewhere).
  void check_alive(const c10::DataPtr& ptr) const;

  // Whether the block's pages are registered with CUDA in this process.
  bool is_mapped(const c10::DataPtr& ptr) const;

  // Work on `stream` may read or write the block until it completes.
  void record_stream(const c10::DataPtr& ptr, c10::Stream stream);

  // Wait for every stream that used the block (before a CPU access).
  void synchronize_users(const c10::DataPtr& ptr);

  // The CPU storage whose pages a foreign block aliases.
  c10::Storage foreign_owner(const c10::DataPtr& ptr) const;

  // "cached", "exact", "foreign", "driver" or "" if `ptr` is not ours.
  std::string kind_of(const c10::DataPtr& ptr) const;
  bool owns(const c10::DataPtr& ptr) const;

  std::map<std::string, int64_t> stats();
  void empty_cache();
  void reset_peak();

  static void raw_delete(void* ctx);
};

TORCH_DIRECT_ALLOCATOR_API UnifiedAllocator* get_allocator();

// Sizes at or below this come from cached power-of-two classes.
constexpr size_t kSmallBlockLimit = size_t(1) << 20;

} // namespace c10::unified
