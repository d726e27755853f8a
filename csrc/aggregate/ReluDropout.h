#pragma once
// ReLU then dropout in one pass over a CUDA tensor, for the hidden layers of the built-in GNN:
//   forward:  out = x > 0 and kept ? x / (1 - p) : 0   (each element kept with probability 1 - p)
//   backward: grad_x = out > 0 ? grad_out / (1 - p) : 0
// The pair F.relu + F.dropout reads and writes the activation twice each way and keeps a mask;
// here the output itself says which elements passed. The random numbers come from the default
// CUDA generator's Philox stream, as torch's dropout takes them, so a step captured in a CUDA
// graph draws fresh ones on every replay.

#include <ATen/ATen.h>

namespace torch_direct::aggregate {

#ifdef TORCH_DIRECT_WITH_CUDA
// x: a CUDA float32, float16 or bfloat16 tensor; 0 <= p < 1.
at::Tensor relu_dropout_forward(const at::Tensor& x, double p);
// grad_out and out: the same shape, dtype and device.
at::Tensor relu_dropout_backward(const at::Tensor& grad_out, const at::Tensor& out, double p);
#endif

} // namespace torch_direct::aggregate
