// Views and storage manipulation (rule R6): a view of a unified tensor is a
// unified tensor over the same storage.

#include "Placement.h"
#include "UnifiedKernels.h"

#include "../../c10_allocator/Text.h"
#include "../../c10_allocator/UnifiedAllocator.h"

#include <ATen/ATen.h>
#include <ATen/NativeFunctions.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <torch/library.h>

#include <cstring>

namespace at::native {

at::Tensor as_strided_unified(const at::Tensor& self, c10::IntArrayRef size,
                              c10::IntArrayRef stride,
                              std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view_unified(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor _reshape_alias_unified(const at::Tensor& self, c10::IntArrayRef size,
                                  c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

namespace unified {
void resize_storage_bytes(const c10::Storage& storage, size_t new_nbytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  auto* allocator = c10::unified::get_allocator();
  c10::DataPtr fresh = allocator->allocate(new_nbytes);
  const size_t keep = std::min(new_nbytes, storage.nbytes());
  if (keep > 0) {
    allocator->synchronize_users(storage.data_ptr());
    std::memcpy(fresh.get(), storage.data_ptr().get(), keep);
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(new_nbytes);
}
} // namespace unified

const at::Tensor& resize_unified_(const at::Tensor& self, c10::IntArrayRef size,
                                  std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  const auto format = memory_format.value_or(c10::MemoryFormat::Contiguous);
  TORCH_CHECK(format != c10::MemoryFormat::Preserve,
              "resize_: unsupported memory format ", format);
  impl->set_sizes_contiguous(size);
  if (format != c10::MemoryFormat::Contiguous) {
    impl->empty_tensor_restride(format);
  }
  const size_t needed =
      at::detail::computeStorageNbytes(size, impl->strides(), self.dtype().itemsize(),
                                       impl->storage_offset());
  const auto old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  if (needed > self.storage().nbytes() && self.numel() > 0) {
    unified::resize_storage_bytes(self.storage(), needed);
    // New elements as the CPU and CUDA resize_ leave them in deterministic mode.
    if (C10_UNLIKELY(at::globalContext().deterministicAlgorithms() &&
                     at::globalContext().deterministicFillUninitializedMemory())) {
      at::native::fill_resize_deterministic_(self, old_nbytes);
    }
  }
  return self;
}

at::Tensor& set_unified_(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, c10::unified::get_allocator(),
                       /*resizable=*/true);
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(storage));
  self.unsafeGetTensorImpl()->set_sizes_contiguous({0});
  return self;
}

at::Tensor& set_source_storage_offset_unified_(at::Tensor& self, c10::Storage source,
                                               int64_t storage_offset,
                                               c10::IntArrayRef size,
                                               c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::unified::kUnifiedDeviceType,
              "set_: a unified tensor can only take unified storage, got storage on ",
              source.device());
  TORCH_CHECK(storage_offset >= 0, "set_: storage offset must be non-negative, got ",
              c10::unified::num(storage_offset));
  at::native::checkSetStorage(self, source, storage_offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_offset(storage_offset);
  self.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride);
  return self;
}

at::Tensor& set_source_storage_unified_(at::Tensor& self, c10::Storage source) {
  const auto itemsize = self.dtype().itemsize();
  TORCH_CHECK(source.nbytes() % itemsize == 0, "set_: storage of ",
              c10::unified::num(source.nbytes()),
              " bytes is not a multiple of the element size ", c10::unified::num(itemsize));
  const int64_t numel = static_cast<int64_t>(source.nbytes() / itemsize);
  return set_source_storage_offset_unified_(self, std::move(source), 0, {numel}, {1});
}

at::Tensor& set_source_tensor_unified_(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() != source.unsafeGetTensorImpl()) {
    return set_source_storage_offset_unified_(self, source.storage(), source.storage_offset(),
                                              source.sizes(), source.strides());
  }
  return self;
}

} // namespace at::native

// is_set_to (the same storage, offset, sizes and strides) is PyTorch's own
// check, which reads no data; through the fallback it would compare the
// storages of two fresh aliases. Registered here rather than in
// native_functions_additions.yaml: the same kernel, without regenerating
// ATen's operator headers in the fork.
TORCH_LIBRARY_IMPL(aten, UNIFIED_DENSE_KEY, m) {
  m.impl("is_set_to", TORCH_FN(at::native::is_set_to));
}
