#pragma once
// Device guard for the unified device. Unified memory belongs to no GPU: there
// is one unified device (index 0) and its "stream" is the default stream;
// GPU work that reads unified tensors is ordered on the CUDA streams of the
// operands' CUDA device (placement rule R1/R3), not here.

#include "Export.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace c10::unified {

struct TORCH_DIRECT_ALLOCATOR_API UnifiedGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  UnifiedGuardImpl() = default;
  c10::DeviceType type() const override;
  c10::Device exchangeDevice(c10::Device d) const override;
  c10::Device getDevice() const override;
  void setDevice(c10::Device d) const override;
  void uncheckedSetDevice(c10::Device d) const noexcept override;
  // noexcept: PyTorch 2.6's interface (the fork's) requires it; newer ones
  // dropped it, and a stricter override is valid for both.
  c10::Stream getStream(c10::Device d) const noexcept override;
  c10::Stream exchangeStream(c10::Stream s) const noexcept override;
  c10::DeviceIndex deviceCount() const noexcept override;
  bool queryStream(const c10::Stream& stream) const override;
  void synchronizeStream(const c10::Stream& stream) const override;
  void synchronizeDevice(const c10::DeviceIndex device_index) const override;
  void record(void** event, const c10::Stream& stream,
              const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override;
  void block(void* event, const c10::Stream& stream) const override;
  bool queryEvent(void* event) const override;
  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override;
};

} // namespace c10::unified
