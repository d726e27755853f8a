#include "Placement.h"

#include "../../c10_allocator/CudaRuntime.h"
#include "../../c10_allocator/Text.h"
#include "../../c10_allocator/UnifiedAllocator.h"

#include <ATen/ATen.h>
#include <ATen/SparseTensorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/irange.h>

#include <atomic>

namespace at::native::unified {

namespace alloc = c10::unified;

bool is_unified(const at::Tensor& t) {
  return t.defined() && t.device().type() == alloc::kUnifiedDeviceType;
}

c10::Device default_compute_device() {
  if (alloc::cuda::available()) {
    return c10::Device(c10::kCUDA, alloc::cuda::current_device());
  }
  return c10::Device(c10::kCPU);
}

c10::Device compute_device(const std::vector<at::Tensor>& operands) {
  for (const auto& t : operands) {
    if (t.defined() && t.is_cuda()) {
      return t.device(); // R1
    }
  }
  for (const auto& t : operands) {
    if (t.defined() && t.is_cpu() && t.dim() > 0) {
      return c10::Device(c10::kCPU); // R2
    }
  }
  return default_compute_device(); // R3
}

namespace {
void drop_storage_ref(void* ctx) {
  delete static_cast<c10::Storage*>(ctx);
}

// A tensor built over another's bytes keeps its lazy conj/neg views.
at::Tensor with_math_bits(at::Tensor t, const at::Tensor& like) {
  if (like.is_conj()) {
    t._set_conj(true);
  }
  if (like.is_neg()) {
    t._set_neg(true);
  }
  return t;
}
} // namespace

namespace {
std::atomic<bool> g_autograd_through_unified{false};
} // namespace

bool autograd_through_unified() { return g_autograd_through_unified.load(std::memory_order_relaxed); }

void set_autograd_through_unified(bool on) { g_autograd_through_unified.store(on); }

void check_no_grad(const at::Tensor& u, const char* what) {
  if (autograd_through_unified()) {
    return;
  }
  TORCH_CHECK(!(u.requires_grad() && at::GradMode::is_enabled()),
              "torch_direct: ", what, " would record autograd history through a unified tensor "
              "that requires grad. Unified tensors are data sources: their gradients would be "
              "computed on the CPU or a GPU and cannot be accumulated into host memory. Use the "
              "table without requires_grad (u.requires_grad_(False) or torch.no_grad()), or "
              "gather rows first and make those require grad (rows = u[idx].requires_grad_()).");
}

void check_index_bounds(int64_t lo, int64_t hi, int64_t size, const char* op,
                        bool allow_negative) {
  using c10::unified::num;
  // No index is valid for an empty dimension: the stock ops' words for it.
  TORCH_CHECK_INDEX(size > 0, op, ": index ", num(hi), " is out of bounds for dimension with size 0");
  const int64_t first = allow_negative ? -size : 0;
  TORCH_CHECK_INDEX(lo >= first && hi < size, op, ": index ", num(lo < first ? lo : hi),
                    " is out of bounds for a unified table of size ", num(size),
                    " (valid: ", num(first), " to ", num(size - 1), ")");
}

void synchronize_for_host(const at::Tensor& u) {
  if (u.storage().data_ptr().get() != nullptr) {
    alloc::get_allocator()->synchronize_users(u.storage().data_ptr());
  }
}

namespace {

at::SparseTensorImpl* sparse_impl(const at::Tensor& t) {
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}

// A sparse COO unified tensor (the sparse gradient of a unified embedding
// table) holds unified indices and values: its alias on `target` is a sparse
// tensor over their aliases. A GPU kernel given it writes or reads the dense
// operand through those indices, so they are checked against its size first.
at::Tensor alias_sparse_as(const at::Tensor& u, c10::Device target) {
  auto* impl = sparse_impl(u);
  // Its parts are unified when built here (sparse_to_unified); one built
  // from parts elsewhere is copied.
  auto part = [&](const at::Tensor& p) { return is_unified(p) ? alias_as(p, target) : p.to(target); };
  at::Tensor indices = part(impl->indices());
  at::Tensor values = part(impl->values());
  const int64_t sparse_dim = impl->sparse_dim();
  if (target.is_cuda() && indices.numel() > 0) {
    auto [lo, hi] = at::aminmax(indices, /*dim=*/1);
    lo = lo.cpu();
    hi = hi.cpu();
    for (const auto d : c10::irange(sparse_dim)) {
      check_index_bounds(lo[d].item<int64_t>(), hi[d].item<int64_t>(), u.size(d), "sparse tensor", false);
    }
  }
  return at::_sparse_coo_tensor_unsafe(indices, values, u.sizes(), values.options().layout(at::kSparse),
                                       impl->coalesced());
}

} // namespace

at::Tensor sparse_to_unified(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.layout() == at::kSparse);
  const c10::Device u = c10::unified::unified_device();
  return at::_sparse_coo_tensor_unsafe(t._indices().to(u), t._values().to(u), t.sizes(),
                                       t._values().options().device(u).layout(at::kSparse),
                                       t.is_coalesced());
}

at::Tensor alias_as(const at::Tensor& u, c10::Device target, bool resizable) {
  TORCH_INTERNAL_ASSERT(is_unified(u));
  TORCH_CHECK(target.is_cpu() || target.is_cuda(),
              "unified tensors run on CPU or CUDA devices, not ", target);
  if (u.layout() == at::kSparse) {
    return alias_sparse_as(u, target);
  }
  TORCH_CHECK(u.layout() == at::kStrided, "torch_direct: unified tensors are strided or sparse COO, not ",
              u.layout());
  const c10::Storage& storage = u.storage();
  const auto& dp = storage.data_ptr();
  void* base = dp.get();
  if (base != nullptr) {
    alloc::get_allocator()->check_alive(dp);
    if (target.is_cuda()) {
      auto* allocator = alloc::get_allocator();
      if (allocator->owns(dp)) {
        allocator->ensure_mapped(dp);
        allocator->record_stream(dp, alloc::cuda::current_stream_of(target.index()));
      }
    } else {
      synchronize_for_host(u);
    }
  }
  c10::DataPtr alias_ptr(base, new c10::Storage(storage), &drop_storage_ref, target);
  c10::Allocator* resize_allocator = nullptr;
  if (resizable) {
    resize_allocator = target.is_cuda() ? alloc::cuda::device_allocator()
                                        : c10::GetCPUAllocator();
  }
  c10::Storage alias_storage(c10::Storage::use_byte_size_t(), storage.nbytes(),
                             std::move(alias_ptr), resize_allocator,
                             /*resizable=*/resize_allocator != nullptr);
  auto key = target.is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(alias_storage), c10::DispatchKeySet(key), u.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(u.sizes(), u.strides(),
                                                 u.storage_offset());
  return with_math_bits(std::move(t), u);
}

void write_back(const at::Tensor& u, const at::Tensor& alias) {
  if (u.layout() == at::kSparse) {
    // An in-place op on the alias (coalesce_, add_ of another sparse tensor)
    // may have replaced its indices and values: the unified tensor takes
    // theirs, in unified memory.
    TORCH_INTERNAL_ASSERT(alias.layout() == at::kSparse);
    auto* to = sparse_impl(u);
    auto* from = sparse_impl(alias);
    const bool same = from->indices().data_ptr() == to->indices().data_ptr() &&
                      from->values().data_ptr() == to->values().data_ptr() &&
                      from->indices().sizes() == to->indices().sizes() &&
                      from->values().sizes() == to->values().sizes() && alias.sizes() == u.sizes();
    if (!same) {
      const c10::Device dev = c10::unified::unified_device();
      to->raw_resize_(from->sparse_dim(), from->dense_dim(), alias.sizes());
      to->set_indices_and_values_unsafe(from->indices().to(dev), from->values().to(dev));
    }
    to->set_coalesced(from->coalesced());
    return;
  }
  const bool same_bytes =
      alias.storage().data_ptr().get() == u.storage().data_ptr().get();
  if (same_bytes) {
    if (alias.sizes() != u.sizes() || alias.strides() != u.strides() ||
        alias.storage_offset() != u.storage_offset()) {
      u.unsafeGetTensorImpl()->set_sizes_and_strides(
          alias.sizes(), alias.strides(), alias.storage_offset());
    }
    return;
  }
  // The kernel resized its output beyond u's storage: grow u and copy.
  u.resize_(alias.sizes());
  u.copy_(alias);
}

at::Tensor rewrap_view(const at::Tensor& base, const at::Tensor& view) {
  TORCH_INTERNAL_ASSERT(is_unified(base));
  if (base.layout() != at::kStrided || view.layout() != at::kStrided) {
    // A sparse tensor's aliasing results (a transpose) share its values, not
    // its bytes as a view: a unified result holds unified copies.
    return view.layout() == at::kSparse ? sparse_to_unified(view) : view.to(c10::unified::unified_device());
  }
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), view.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(view.sizes(), view.strides(),
                                                 view.storage_offset());
  return with_math_bits(std::move(t), view);
}

} // namespace at::native::unified
