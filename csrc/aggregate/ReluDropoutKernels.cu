// The CUDA kernels of ReluDropout.h. Each thread draws four uniforms at a time from a Philox
// stream of its own (subsequence = thread index, offset from the generator), as torch's fused
// dropout does, and handles four consecutive elements with them.

#include "ReluDropout.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/detail/UnpackRaw.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <curand_kernel.h>

#include <algorithm>
#include <mutex>

namespace torch_direct::aggregate {
namespace {

constexpr int kThreads = 256;
constexpr int kPerDraw = 4;   // curand_uniform4

template <typename scalar_t>
__global__ void relu_dropout_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ out, int64_t n,
                                    float keep, at::PhiloxCudaState philox) {
  const auto seeds = at::cuda::philox::unpack(philox);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  curandStatePhilox4_32_10_t state;
  curand_init(std::get<0>(seeds), thread, std::get<1>(seeds), &state);
  const float scale = 1.f / keep;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kPerDraw;
  for (int64_t base = thread * kPerDraw; base < n; base += stride) {
    const float4 r4 = curand_uniform4(&state);   // in (0, 1]
    const float r[kPerDraw] = {r4.x, r4.y, r4.z, r4.w};
#pragma unroll
    for (int k = 0; k < kPerDraw; ++k) {
      const int64_t i = base + k;
      if (i < n) {
        const float v = static_cast<float>(x[i]);
        out[i] = static_cast<scalar_t>(v > 0.f && r[k] <= keep ? v * scale : 0.f);
      }
    }
  }
}

template <typename scalar_t>
__global__ void relu_dropout_backward_kernel(const scalar_t* __restrict__ grad, const scalar_t* __restrict__ out,
                                             scalar_t* __restrict__ grad_x, int64_t n, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    grad_x[i] = static_cast<scalar_t>(static_cast<float>(out[i]) > 0.f ? static_cast<float>(grad[i]) * scale : 0.f);
  }
}

int64_t blocks_for(int64_t work) {
  const int64_t resident = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 8;
  return std::max<int64_t>(1, std::min<int64_t>(resident, (work + kThreads - 1) / kThreads));
}

void check_float_cuda(const at::Tensor& t, const char* name, const char* what) {
  TORCH_CHECK_VALUE(t.is_cuda(), what, ": ", name, " must be a CUDA tensor, got one on ", t.device());
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16, what, ": ", name,
                   " must be float32, float16 or bfloat16, got ", s);
}

} // namespace

at::Tensor relu_dropout_forward(const at::Tensor& x, double p) {
  constexpr const char* what = "relu_dropout";
  check_float_cuda(x, "x", what);
  TORCH_CHECK_VALUE(p >= 0 && p < 1, what, ": p must be in [0, 1), got ", p);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty_like(in);
  const int64_t n = in.numel();
  if (n == 0) {
    return out;
  }
  const int64_t blocks = blocks_for((n + kPerDraw - 1) / kPerDraw);
  // each thread draws once per pass of its grid-stride loop
  const int64_t draws = (n - 1) / (blocks * kThreads * kPerDraw) + 1;
  at::PhiloxCudaState philox;
  {
    auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(std::nullopt,
                                                                    at::cuda::detail::getDefaultCUDAGenerator());
    std::lock_guard<std::mutex> lock(gen->mutex_);
    philox = gen->philox_cuda_state(static_cast<uint64_t>(draws * kPerDraw));
  }
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in.scalar_type(), what, [&] {
    relu_dropout_kernel<scalar_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        in.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n, static_cast<float>(1 - p), philox);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor relu_dropout_backward(const at::Tensor& grad_out, const at::Tensor& out, double p) {
  constexpr const char* what = "relu_dropout backward";
  check_float_cuda(grad_out, "grad_out", what);
  TORCH_CHECK_VALUE(grad_out.sizes() == out.sizes() && grad_out.scalar_type() == out.scalar_type() &&
                        grad_out.device() == out.device(),
                    what, ": grad_out (", grad_out.sizes(), ", ", grad_out.scalar_type(), ") and out (", out.sizes(),
                    ", ", out.scalar_type(), ") must match");
  TORCH_CHECK_VALUE(p >= 0 && p < 1, what, ": p must be in [0, 1), got ", p);
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const at::Tensor g = grad_out.contiguous();
  const at::Tensor o = out.contiguous();
  at::Tensor grad_x = at::empty_like(g);
  const int64_t n = g.numel();
  if (n == 0) {
    return grad_x;
  }
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), what, [&] {
    relu_dropout_backward_kernel<scalar_t><<<static_cast<unsigned>(blocks_for(n)), kThreads, 0, stream>>>(
        g.data_ptr<scalar_t>(), o.data_ptr<scalar_t>(), grad_x.data_ptr<scalar_t>(), n,
        static_cast<float>(1.0 / (1 - p)));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad_x;
}

} // namespace torch_direct::aggregate
