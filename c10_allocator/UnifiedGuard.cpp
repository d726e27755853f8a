#include "UnifiedGuard.h"

#include "CudaRuntime.h"
#include "UnifiedAllocator.h"

#include <c10/util/Exception.h>

namespace c10::unified {
namespace {
void check_index(c10::Device d) {
  TORCH_CHECK(d.type() == kUnifiedDeviceType, "expected a unified device, got ", d);
  TORCH_CHECK(!d.has_index() || d.index() == 0,
              "the unified device has a single index (unified:0): unified memory is "
              "host memory that every GPU reads; got ", d);
}
} // namespace

c10::DeviceType UnifiedGuardImpl::type() const { return kUnifiedDeviceType; }

c10::Device UnifiedGuardImpl::exchangeDevice(c10::Device d) const {
  check_index(d);
  return unified_device();
}

c10::Device UnifiedGuardImpl::getDevice() const { return unified_device(); }

void UnifiedGuardImpl::setDevice(c10::Device d) const { check_index(d); }

void UnifiedGuardImpl::uncheckedSetDevice(c10::Device) const noexcept {}

c10::Stream UnifiedGuardImpl::getStream(c10::Device) const noexcept {
  return c10::Stream(c10::Stream::DEFAULT, unified_device());
}

c10::Stream UnifiedGuardImpl::exchangeStream(c10::Stream) const noexcept {
  return c10::Stream(c10::Stream::DEFAULT, unified_device());
}

c10::DeviceIndex UnifiedGuardImpl::deviceCount() const noexcept { return 1; }

bool UnifiedGuardImpl::queryStream(const c10::Stream&) const { return true; }

void UnifiedGuardImpl::synchronizeStream(const c10::Stream&) const {}

void UnifiedGuardImpl::synchronizeDevice(const c10::DeviceIndex) const {
  // Unified memory is written by host code synchronously and by GPU kernels
  // on CUDA streams: synchronizing "the unified device" waits for the GPU.
  if (cuda::available() && cuda::context_initialized()) {
    cuda::device_synchronize();
  }
}

void UnifiedGuardImpl::record(void**, const c10::Stream&, const c10::DeviceIndex,
                              const c10::EventFlag) const {
  TORCH_CHECK(false, "the unified device has no events of its own: record CUDA "
              "events on the CUDA stream that runs the work (torch.cuda.Event)");
}

void UnifiedGuardImpl::block(void*, const c10::Stream&) const {}

bool UnifiedGuardImpl::queryEvent(void*) const { return true; }

void UnifiedGuardImpl::destroyEvent(void*, const c10::DeviceIndex) const noexcept {}

namespace {
c10::impl::DeviceGuardImplRegistrar g_unified_guard(kUnifiedDeviceType, new UnifiedGuardImpl());
} // namespace

} // namespace c10::unified
