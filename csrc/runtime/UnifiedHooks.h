#pragma once
// PrivateUse1 hooks for the unified device. Naming PrivateUse1 makes PyTorch
// treat it as "the accelerator" (torch.accelerator, pin_memory()'s default
// device, is_pinned()). Unified memory is host memory served to CUDA, so the
// pinned-memory questions are answered by CUDA's own hooks: code that never
// makes a unified tensor sees CUDA exactly as before.

#include <ATen/detail/PrivateUse1HooksInterface.h>

namespace at::native::unified {

struct UnifiedHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override;
  bool isAvailable() const override;
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override;
  void init() const override;
  c10::DeviceIndex deviceCount() const override;
  void setCurrentDevice(c10::DeviceIndex device) const override;
  c10::DeviceIndex getCurrentDevice() const override;
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override;
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override;
  bool isPinnedPtr(const void* data) const override;
  c10::Allocator* getPinnedMemoryAllocator() const override;
  c10::Device getDeviceFromPtr(void* data) const override;
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override;
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

// Registers the hooks once (idempotent).
void register_hooks();

} // namespace at::native::unified
