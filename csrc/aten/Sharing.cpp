#include "Sharing.h"

#include "Placement.h"

#include "../../c10_allocator/UnifiedAllocator.h"

#include <ATen/core/TensorBase.h>
#include <c10/core/TensorImpl.h>

namespace at::native::unified {
namespace {

namespace alloc = c10::unified;

at::Tensor unified_over(c10::Storage storage, const at::Tensor& like_geometry,
                        caffe2::TypeMeta dtype) {
  at::Tensor u = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(alloc::kUnifiedDispatchKey), dtype);
  u.unsafeGetTensorImpl()->set_sizes_and_strides(
      like_geometry.sizes(), like_geometry.strides(), like_geometry.storage_offset());
  return u;
}

} // namespace

at::Tensor pin_inplace(const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "pin_inplace: tensor is undefined");
  if (is_unified(t)) {
    return t;
  }
  TORCH_CHECK(t.is_cpu(), "pin_inplace: expected a CPU tensor, got a tensor on ", t.device().str(),
              " (use .to('unified') to copy a ", c10::DeviceTypeName(t.device().type(), true),
              " tensor into unified memory)");
  TORCH_CHECK(t.layout() == c10::kStrided, "pin_inplace: expected a strided tensor, got layout ",
              t.layout());
  const c10::Storage& s = t.storage();
  TORCH_CHECK(s.data_ptr().get() != nullptr || s.nbytes() == 0,
              "pin_inplace: the tensor's storage has no data (was it freed or is it a meta/fake tensor?)");
  c10::DataPtr dp = alloc::get_allocator()->alias_foreign(s.data_ptr().get(), s.nbytes(), s);
  c10::Storage us(c10::Storage::use_byte_size_t(), s.nbytes(), std::move(dp), nullptr, false);
  return unified_over(std::move(us), t, t.dtype());
}

at::Tensor driver_mapped_empty(at::IntArrayRef sizes, const at::Tensor& like) {
  TORCH_CHECK(like.defined(), "driver_mapped_empty: the dtype template is undefined");
  int64_t numel = 1;
  for (int64_t n : sizes) {
    TORCH_CHECK(n >= 0, "driver_mapped_empty: sizes must be non-negative, got ", sizes);
    numel *= n;
  }
  const size_t nbytes = static_cast<size_t>(numel) * like.element_size();
  c10::DataPtr dp = alloc::get_allocator()->allocate_driver_mapped(nbytes);
  c10::Storage us(c10::Storage::use_byte_size_t(), nbytes, std::move(dp), nullptr, false);
  at::Tensor u = at::detail::make_tensor<c10::TensorImpl>(
      std::move(us), c10::DispatchKeySet(alloc::kUnifiedDispatchKey), like.dtype());
  u.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return u;
}

at::Tensor pinned_owner(const at::Tensor& u) {
  TORCH_CHECK(is_unified(u), "expected a unified tensor");
  c10::Storage owner = alloc::get_allocator()->foreign_owner(u.storage().data_ptr());
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(owner), c10::DispatchKeySet(c10::DispatchKey::CPU), u.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(u.sizes(), u.strides(), u.storage_offset());
  return t;
}

SharedHandle share(const at::Tensor& u) {
  TORCH_CHECK(is_unified(u), "expected a unified tensor");
  auto [fd, size] = alloc::get_allocator()->share(u.storage().unsafeGetStorageImpl());
  return SharedHandle{fd, size, u.storage().nbytes()};
}

at::Tensor from_shared(int fd, size_t storage_nbytes, const at::Tensor& like) {
  c10::DataPtr dp = fd >= 0 ? alloc::get_allocator()->import_shared(fd, storage_nbytes)
                            : c10::DataPtr(nullptr, alloc::unified_device());
  c10::Storage us(c10::Storage::use_byte_size_t(), storage_nbytes, std::move(dp),
                  alloc::get_allocator(), true);
  return unified_over(std::move(us), like, like.dtype());
}

std::string block_kind(const at::Tensor& u) {
  TORCH_CHECK(is_unified(u), "expected a unified tensor");
  return alloc::get_allocator()->kind_of(u.storage().data_ptr());
}

bool is_mapped(const at::Tensor& u) {
  TORCH_CHECK(is_unified(u), "expected a unified tensor");
  return alloc::get_allocator()->is_mapped(u.storage().data_ptr());
}

void map_for_gpu(const at::Tensor& u) {
  TORCH_CHECK(is_unified(u), "expected a unified tensor");
  if (u.storage().data_ptr().get() != nullptr) {
    alloc::get_allocator()->ensure_mapped(u.storage().data_ptr());
  }
}

at::Tensor as_cuda_alias(const at::Tensor& u, int64_t device) {
  TORCH_CHECK(is_unified(u), "expected a unified tensor");
  return alias_as(u, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
}

at::Tensor as_cpu_alias(const at::Tensor& u) {
  TORCH_CHECK(is_unified(u), "expected a unified tensor");
  return alias_as(u, c10::Device(c10::kCPU));
}

} // namespace at::native::unified
