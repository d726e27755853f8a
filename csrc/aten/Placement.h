#pragma once
// The placement rules R1-R6 (docs/placement.md), in one unit: which device an
// op on unified operands runs on, and how a unified tensor is presented to the
// CPU or CUDA kernel that does the work (an alias over the same bytes).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

#include "Export.h"

namespace at::native::unified {

TORCH_DIRECT_ATEN_API bool is_unified(const at::Tensor& t);

// R1: the first CUDA operand's device. R2: else CPU if any operand is a CPU
// tensor with at least one dimension. R3: else the current CUDA device, or
// the CPU when no GPU is usable. (R4 is the caller's: count destinations.)
TORCH_DIRECT_ATEN_API c10::Device compute_device(const std::vector<at::Tensor>& operands);

// The current CUDA device if a GPU is usable, else the CPU (rule R3).
TORCH_DIRECT_ATEN_API c10::Device default_compute_device();

// A CPU or CUDA tensor over the same bytes as unified tensor `u` (same sizes,
// strides, storage offset, dtype, conj/neg bits). Keeps u's storage alive.
// For a sparse COO `u`: a sparse tensor over aliases of its indices and
// values, the indices checked against u's size when `target` is a GPU.
// A CUDA alias maps u's pages for GPUs and records the current stream as a
// user of them; a CPU alias first waits for GPU work that uses them.
// `resizable`: a kernel may resize the alias (out= arguments); see
// write_back().
TORCH_DIRECT_ATEN_API at::Tensor alias_as(const at::Tensor& u, c10::Device target, bool resizable = false);

// After a kernel wrote into `alias` (from alias_as(u, ..., true)): carry any
// resize it made over to u, so u is what the kernel's output would be (for a
// sparse u: the alias's indices and values, copied into unified memory when
// the kernel replaced them).
TORCH_DIRECT_ATEN_API void write_back(const at::Tensor& u, const at::Tensor& alias);

// A sparse COO tensor on the unified device with copies of sparse tensor `t`'s
// indices and values.
TORCH_DIRECT_ATEN_API at::Tensor sparse_to_unified(const at::Tensor& t);

// R6: `view` is a CPU/CUDA view of alias_as(base, ...); return the unified
// tensor with the same geometry and dtype over base's storage.
TORCH_DIRECT_ATEN_API at::Tensor rewrap_view(const at::Tensor& base, const at::Tensor& view);

// Whether unified tensors may record autograd history: true once
// claim_autograd_ops (Autograd.cpp) has given the ops that compute through
// aliases their autograd kernel for unified operands.
TORCH_DIRECT_ATEN_API bool autograd_through_unified();
TORCH_DIRECT_ATEN_API void set_autograd_through_unified(bool on);
// Without those kernels unified tensors are data sources, not autograd
// inputs: raise a clear error when one that requires grad is used while grad
// mode is on (its gradient would be computed on a CPU/CUDA device and
// rejected by the engine). A no-op once autograd_through_unified().
TORCH_DIRECT_ATEN_API void check_no_grad(const at::Tensor& u, const char* what);

// Raises IndexError unless every index in [lo, hi] (the smallest and largest
// index asked for) is valid for `size` rows. With `allow_negative`, negative
// indices count from the end (indexing, take); without, they are errors
// (index_select, embedding, gather), as in the stock ops. `op` names the
// caller in the message.
TORCH_DIRECT_ATEN_API void check_index_bounds(int64_t lo, int64_t hi, int64_t size, const char* op,
                        bool allow_negative = true);

// Waits for GPU work that may touch u's pages (before a host access).
TORCH_DIRECT_ATEN_API void synchronize_for_host(const at::Tensor& u);

} // namespace at::native::unified
