#include "Placement.h"
#include "UnifiedKernels.h"

#include "../../c10_allocator/UnifiedAllocator.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/TensorFactories.h>

namespace at::native {
namespace {
void check_factory(std::optional<c10::Device> device, std::optional<c10::Layout> layout,
                   std::optional<bool> pin_memory) {
  if (device.has_value()) {
    TORCH_CHECK(!device->has_index() || device->index() == 0,
                "the unified device has a single index (unified:0): unified memory is "
                "host memory that every GPU reads; got ", *device);
  }
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided,
              "unified tensors are strided; layout ", *layout, " is not supported");
  TORCH_CHECK(!pin_memory.value_or(false),
              "pin_memory=True makes no sense for a unified tensor: its memory is "
              "already pinned and mapped for every GPU");
}

// As the CPU and CUDA factories: under torch.use_deterministic_algorithms with
// fill_uninitialized_memory, new memory holds NaN (floating, complex) or the
// dtype's maximum, not what the allocator's block held before.
at::Tensor filled_if_deterministic(at::Tensor t) {
  if (C10_UNLIKELY(at::globalContext().deterministicAlgorithms() &&
                   at::globalContext().deterministicFillUninitializedMemory())) {
    at::native::fill_empty_deterministic_(t);
  }
  return t;
}
} // namespace

at::Tensor empty_unified(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory,
                         std::optional<c10::MemoryFormat> memory_format) {
  check_factory(device, layout, pin_memory);
  const c10::DispatchKeySet ks(c10::unified::kUnifiedDispatchKey);
  return filled_if_deterministic(at::detail::empty_generic(size, c10::unified::get_allocator(), ks,
                                                           c10::dtype_or_default(dtype), memory_format));
}

at::Tensor empty_strided_unified(c10::IntArrayRef size, c10::IntArrayRef stride,
                                 std::optional<c10::ScalarType> dtype,
                                 std::optional<c10::Layout> layout,
                                 std::optional<c10::Device> device,
                                 std::optional<bool> pin_memory) {
  check_factory(device, layout, pin_memory);
  const c10::DispatchKeySet ks(c10::unified::kUnifiedDispatchKey);
  return filled_if_deterministic(at::detail::empty_strided_generic(size, stride, c10::unified::get_allocator(),
                                                                   ks, c10::dtype_or_default(dtype)));
}

} // namespace at::native
