// Dedicated unified kernels for the gather family: index_select (and .out),
// index.Tensor with one integer index on dim 0 (`u[idx]`), embedding and
// gather. A row gather whose index is on a GPU runs the locality-ordered CUDA
// kernel (GatherCuda.cu, rule R1); one whose index is on the CPU runs the
// threaded CPU gather (rule R2). Every other form goes to the boxed fallback,
// which applies R1-R6 with stock kernels.

#include "Placement.h"
#include "UnifiedKernels.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/native/Resize.h>

#include <utility>

namespace at::native {
namespace unified {
namespace {

template <typename... Args>
c10::IValue call_fallback(const char* name, const char* overload, Args&&... args) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  torch::jit::Stack stack;
  (torch::jit::push(stack, std::forward<Args>(args)), ...);
  unified_fallback(op, c10::DispatchKeySet(), &stack);  // the key set is unused
  return std::move(stack.back());
}

bool is_index_dtype(c10::ScalarType t) {
  return t == at::kLong || t == at::kInt;
}

// Whether `self[index]` along dim 0 can be done by the row kernels.
bool row_gather_applies(const at::Tensor& self, const at::Tensor& index) {
  if (!is_unified(self) || self.dim() == 0 || self.is_conj() || self.is_neg() ||
      !is_index_dtype(index.scalar_type())) {
    return false;
  }
  if (self.size(0) > 0 && !self.select(0, 0).is_contiguous()) {
    return false;
  }
  if (index.is_cuda()) {
#ifdef TORCH_DIRECT_WITH_CUDA
    return true;
#else
    return false;
#endif
  }
  return index.is_cpu();
}

// Rows of unified `self` picked by `index` (any shape) into `out`, of shape
// (*index.shape, *self.shape[1:]) on the index's device.
// `negative`: whether index values count from the end (index.Tensor) or are
// errors (index_select, embedding), as in the stock ops.
void gather_rows_into(const at::Tensor& self, const at::Tensor& index, at::Tensor& out,
                      const char* op, bool negative) {
  const at::Tensor flat = index.reshape(-1);
  if (index.is_cuda()) {
#ifdef TORCH_DIRECT_WITH_CUDA
    gather_rows_cuda(self, flat, out, GatherOrder::kAuto, 0, op, negative);
    return;
#endif
  }
  gather_rows_cpu(self, flat, out, 0, true, negative);
}

at::Tensor gather_rows(const at::Tensor& self, const at::Tensor& index, const char* op,
                       bool negative) {
  std::vector<int64_t> shape(index.sizes().begin(), index.sizes().end());
  shape.insert(shape.end(), self.sizes().begin() + 1, self.sizes().end());
  at::Tensor out = at::empty(shape, self.options().device(index.device()));
  gather_rows_into(self, index, out, op, negative);
  return out;
}

} // namespace
} // namespace unified

using unified::call_fallback;
using unified::row_gather_applies;

at::Tensor index_select_unified(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  if (self.dim() > 0 && c10::maybe_wrap_dim(dim, self.dim()) == 0 && index.dim() <= 1 &&
      row_gather_applies(self, index)) {
    unified::check_no_grad(self, "aten::index_select");
    return unified::gather_rows(self, index.reshape(-1), "index_select", false);
  }
  return call_fallback("aten::index_select", "", self, dim, index).toTensor();
}

at::Tensor& index_select_out_unified(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                                     at::Tensor& out) {
  if (self.dim() > 0 && c10::maybe_wrap_dim(dim, self.dim()) == 0 && index.dim() <= 1 &&
      row_gather_applies(self, index) && out.device() == index.device() &&
      !unified::is_unified(out)) {
    unified::check_no_grad(self, "aten::index_select");
    std::vector<int64_t> shape{index.numel()};
    shape.insert(shape.end(), self.sizes().begin() + 1, self.sizes().end());
    TORCH_CHECK(out.scalar_type() == self.scalar_type(), "index_select(): self and out have "
                "different dtypes: ", self.scalar_type(), " and ", out.scalar_type());
    at::native::resize_output(out, shape);
    if (out.is_contiguous()) {
      unified::gather_rows_into(self, index, out, "index_select", false);
    } else {
      out.copy_(unified::gather_rows(self, index.reshape(-1), "index_select", false));
    }
    return out;
  }
  call_fallback("aten::index_select", "out", self, dim, index, out);
  return out;
}

at::Tensor index_Tensor_unified(const at::Tensor& self,
                                const c10::List<std::optional<at::Tensor>>& indices) {
  if (indices.size() == 1) {
    const std::optional<at::Tensor> first = indices.get(0);
    if (first.has_value() && first->defined() && row_gather_applies(self, *first)) {
      unified::check_no_grad(self, "aten::index");
      return unified::gather_rows(self, *first, "index", true);
    }
  }
  return call_fallback("aten::index", "Tensor", self, indices).toTensor();
}

at::Tensor embedding_unified(const at::Tensor& weight, const at::Tensor& indices,
                             int64_t padding_idx, bool scale_grad_by_freq, bool sparse) {
  if (weight.dim() == 2 && row_gather_applies(weight, indices)) {
    unified::check_no_grad(weight, "aten::embedding");
    return unified::gather_rows(weight, indices, "embedding", false);
  }
  return call_fallback("aten::embedding", "", weight, indices, padding_idx, scale_grad_by_freq,
                       sparse)
      .toTensor();
}

at::Tensor gather_unified(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                          bool sparse_grad) {
  // torch.gather picks single elements: no rows to order. The CUDA path checks
  // the index with one pass and one sync, then the stock kernel reads the
  // table in place; everything else is the fallback's.
#ifdef TORCH_DIRECT_WITH_CUDA
  if (unified::is_unified(self) && index.is_cuda() && self.dim() > 0 && index.dim() == self.dim() &&
      index.scalar_type() == at::kLong) {
    unified::check_no_grad(self, "aten::gather");
    const int64_t d = c10::maybe_wrap_dim(dim, self.dim());
    if (index.numel() > 0) {
      const auto s = unified::index_stats_cuda(index.reshape(-1).contiguous(), self.size(d));
      unified::check_index_bounds(s.min, s.max, self.size(d), "gather", /*allow_negative=*/false);
    }
    return at::gather(unified::alias_as(self, index.device()), d, index, sparse_grad);
  }
#endif
  return call_fallback("aten::gather", "", self, dim, index, sparse_grad).toTensor();
}

} // namespace at::native
