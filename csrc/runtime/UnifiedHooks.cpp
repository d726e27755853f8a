#include "UnifiedHooks.h"

#include "../aten/UnifiedKernels.h"
#include "../../c10_allocator/Text.h"
#include "../../c10_allocator/UnifiedAllocator.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/CPUGeneratorImpl.h>

namespace at::native::unified {
namespace {
void check_index(c10::DeviceIndex d) {
  TORCH_CHECK(d == 0 || d == -1,
              "the unified device has a single index (unified:0); got index ",
              c10::unified::num(static_cast<int>(d)));
}
} // namespace

bool UnifiedHooks::isBuilt() const { return true; }
bool UnifiedHooks::isAvailable() const { return true; }
bool UnifiedHooks::hasPrimaryContext(c10::DeviceIndex) const { return true; }
void UnifiedHooks::init() const {}
c10::DeviceIndex UnifiedHooks::deviceCount() const { return 1; }
void UnifiedHooks::setCurrentDevice(c10::DeviceIndex device) const { check_index(device); }
c10::DeviceIndex UnifiedHooks::getCurrentDevice() const { return 0; }
c10::DeviceIndex UnifiedHooks::exchangeDevice(c10::DeviceIndex device) const {
  check_index(device);
  return 0;
}
c10::DeviceIndex UnifiedHooks::maybeExchangeDevice(c10::DeviceIndex device) const {
  check_index(device);
  return 0;
}

bool UnifiedHooks::isPinnedPtr(const void* data) const {
  return at::detail::getCUDAHooks().isPinnedPtr(data);
}

c10::Allocator* UnifiedHooks::getPinnedMemoryAllocator() const {
  // pin_memory() with no device names "the accelerator": serve CUDA's pinned
  // memory, as PyTorch did before the unified device was registered.
  return at::detail::getCUDAHooks().getPinnedMemoryAllocator();
}

c10::Device UnifiedHooks::getDeviceFromPtr(void*) const {
  return c10::unified::unified_device();
}

const at::Generator& UnifiedHooks::getDefaultGenerator(c10::DeviceIndex) const {
  // Random ops on unified tensors run on the compute device's generator (R1-R3).
  return at::detail::getDefaultCPUGenerator();
}

void UnifiedHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  resize_storage_bytes(storage, newsize);
}

void register_hooks() {
  static const bool done = [] {
    at::RegisterPrivateUse1HooksInterface(new UnifiedHooks());
    return true;
  }();
  (void)done;
}

} // namespace at::native::unified
