// Copies in every direction between unified, CPU and CUDA tensors (rule R5).
// Host<->unified and unified<->unified copies run on the CPU over the same
// pages; unified<->CUDA copies are one DMA when both sides are dense with the
// same layout and dtype, else a CUDA kernel reading/writing the pages in place.

#include "Placement.h"
#include "UnifiedKernels.h"

#include "../../c10_allocator/CudaRuntime.h"
#include "../../c10_allocator/HostRegistration.h"
#include "../../c10_allocator/UnifiedAllocator.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/irange.h>

#include <torch/library.h>

#include <algorithm>

namespace at::native {
namespace {

using unified::alias_as;
using unified::is_unified;
namespace alloc = c10::unified;

bool dma_compatible(const at::Tensor& a, const at::Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.is_non_overlapping_and_dense() &&
         a.is_conj() == b.is_conj() && a.is_neg() == b.is_neg() &&
         // dense with equal strides: both occupy one span of numel elements
         a.numel() > 0;
}

void* span_start(const at::Tensor& t) {
  // The lowest address of a non-overlapping dense tensor (strides may be
  // permuted but are non-negative).
  return static_cast<char*>(t.storage().data_ptr().get()) +
         t.storage_offset() * t.element_size();
}

// One DMA between a unified tensor and a CUDA tensor on the CUDA side's
// current stream.
void dma(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& unified_side,
         c10::Device cuda_device, bool non_blocking) {
  auto* allocator = alloc::get_allocator();
  const auto& dp = unified_side.storage().data_ptr();
  const c10::Stream stream = alloc::cuda::current_stream_of(cuda_device.index());
  if (allocator->owns(dp)) {
    allocator->ensure_mapped(dp);
    allocator->record_stream(dp, stream);
  }
  // In pieces that each stay within one driver registration of the host side.
  char* d = static_cast<char*>(span_start(dst));
  const char* s = static_cast<const char*>(span_start(src));
  const char* host = static_cast<const char*>(span_start(unified_side));
  const size_t total = static_cast<size_t>(src.numel()) * src.element_size();
  for (size_t done = 0; done < total;) {
    const size_t run = alloc::registered_run(host + done);
    const size_t piece = run == 0 ? total - done : std::min(run, total - done);
    alloc::cuda::memcpy_async(d + done, s + done, piece, stream);
    done += piece;
  }
  if (!non_blocking) {
    alloc::cuda::stream_synchronize(stream);
  }
}

} // namespace

at::Tensor _copy_from_unified(const at::Tensor& self, const at::Tensor& dst,
                              bool non_blocking) {
  const at::Tensor& src = self;
  TORCH_CHECK(dst.defined() && src.defined(), "copy_: undefined tensor");
  const bool src_u = is_unified(src);
  const bool dst_u = is_unified(dst);
  TORCH_CHECK(src_u || dst_u, "_copy_from_unified: neither tensor is unified");
  if (src_u) {
    unified::check_no_grad(src, "a copy");
  }

  // The side that is not unified decides where the copy runs: a CUDA side
  // makes it a DMA (or a kernel over a CUDA alias), anything else runs on the
  // CPU over the same host pages.
  const at::Tensor& other = src_u ? dst : src;
  TORCH_CHECK(other.is_cpu() || other.is_cuda() || is_unified(other),
              "copy_: cannot copy between a unified tensor and a ", other.device().type(),
              " tensor (supported: cpu, cuda, unified)");
  const c10::Device where = other.is_cuda() ? other.device() : c10::Device(c10::kCPU);
  if (where.is_cuda() && dma_compatible(src, dst)) {
    dma(src, dst, src_u ? src : dst, where, non_blocking);
    return dst;
  }
  const at::Tensor src_view = src_u ? alias_as(src, where) : src;
  const at::Tensor dst_view = dst_u ? alias_as(dst, where) : dst;
  dst_view.copy_(src_view);
  if (where.is_cuda() && !non_blocking) {
    alloc::cuda::stream_synchronize(alloc::cuda::current_stream_of(where.index()));
  }
  return dst;
}

at::Tensor _copy_from_and_resize_unified(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return _copy_from_unified(self, dst, false);
}

c10::Scalar _local_scalar_dense_unified(const at::Tensor& self) {
  return at::_local_scalar_dense(alias_as(self, c10::kCPU));
}

namespace {

// The Conjugate and Negative keys' fallbacks resolve a conjugated or negated
// input of _copy_from into a copy before calling it, and copying a unified
// tensor is _copy_from again: conj().clone() of a unified complex tensor
// recursed until the stack overflowed. _copy_from_unified keeps the bits
// itself (alias_as carries them to the CPU/CUDA alias, whose copy_ resolves
// them; a DMA needs both sides' bits equal), so for unified operands these keys
// pass straight through. Other tensors are resolved as the keys' fallbacks do.
template <c10::DispatchKey Key>
void copy_from_math_bit(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                        torch::jit::Stack* stack) {
  const auto num_args = op.schema().arguments().size();
  const auto args_begin = stack->size() - num_args;
  bool any_unified = false;
  for (const auto i : c10::irange(num_args)) {
    const auto& v = (*stack)[args_begin + i];
    any_unified = any_unified || (v.isTensor() && is_unified(v.toTensor()));
  }
  if (!any_unified) {
    for (const auto i : c10::irange(num_args)) {
      auto& v = (*stack)[args_begin + i];
      if (v.isTensor()) {
        const at::Tensor t = v.toTensor();
        v = Key == c10::DispatchKey::Conjugate ? t.resolve_conj() : t.resolve_neg();
      }
    }
  }
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, Key), stack);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from",
         torch::CppFunction::makeFromBoxedFunction<&copy_from_math_bit<c10::DispatchKey::Conjugate>>());
  m.impl("_copy_from_and_resize",
         torch::CppFunction::makeFromBoxedFunction<&copy_from_math_bit<c10::DispatchKey::Conjugate>>());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from",
         torch::CppFunction::makeFromBoxedFunction<&copy_from_math_bit<c10::DispatchKey::Negative>>());
  m.impl("_copy_from_and_resize",
         torch::CppFunction::makeFromBoxedFunction<&copy_from_math_bit<c10::DispatchKey::Negative>>());
}

} // namespace at::native
