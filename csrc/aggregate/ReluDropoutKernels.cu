// The CUDA kernels of ReluDropout.h. Each thread takes four uniforms at a time from
// Philox4x32-10 (Salmon et al., SC'11), keyed by the generator's seed, its counter the
// generator's offset plus the draw's index and the thread's index, and handles four
// consecutive elements with them. (The round function is written out here: the toolkit's
// curand headers are not everywhere this builds.)

#include "ReluDropout.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/detail/UnpackRaw.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace torch_direct::aggregate {
namespace {

constexpr int kThreads = 256;
constexpr int kPerDraw = 4;   // one Philox block: four 32-bit numbers

// Ten rounds of Philox4x32 on counter c with key k.
__device__ inline uint4 philox4x32_10(uint4 c, uint2 k) {
  constexpr unsigned kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const unsigned hi0 = __umulhi(kM0, c.x), lo0 = kM0 * c.x;
    const unsigned hi1 = __umulhi(kM1, c.z), lo1 = kM1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += kW0;
    k.y += kW1;
  }
  return c;
}

// [0, 1) from the top 24 bits
__device__ inline float unit_float(unsigned v) {
  return static_cast<float>(v >> 8) * (1.0f / 16777216.0f);
}

// Four consecutive elements, loaded and stored as one access where the pointers allow.
template <typename scalar_t>
struct alignas(sizeof(scalar_t) * kPerDraw) Four {
  scalar_t v[kPerDraw];
};

template <typename scalar_t>
bool aligned_for_four(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Four<scalar_t>) == 0;
}

// Elements [base, base + 4) of p (those below n), as floats; vector: one access (base + 4 <= n).
template <bool vector, typename scalar_t>
__device__ inline void load_four(const scalar_t* p, int64_t base, int64_t n, float (&f)[kPerDraw]) {
  if (vector && base + kPerDraw <= n) {
    const Four<scalar_t> four = *reinterpret_cast<const Four<scalar_t>*>(p + base);
#pragma unroll
    for (int k = 0; k < kPerDraw; ++k) {
      f[k] = static_cast<float>(four.v[k]);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kPerDraw; ++k) {
    f[k] = base + k < n ? static_cast<float>(p[base + k]) : 0.f;
  }
}

template <bool vector, typename scalar_t>
__device__ inline void store_four(scalar_t* p, int64_t base, int64_t n, const float (&f)[kPerDraw]) {
  if (vector && base + kPerDraw <= n) {
    Four<scalar_t> four;
#pragma unroll
    for (int k = 0; k < kPerDraw; ++k) {
      four.v[k] = static_cast<scalar_t>(f[k]);
    }
    *reinterpret_cast<Four<scalar_t>*>(p + base) = four;
    return;
  }
#pragma unroll
  for (int k = 0; k < kPerDraw; ++k) {
    if (base + k < n) {
      p[base + k] = static_cast<scalar_t>(f[k]);
    }
  }
}

template <bool vector, typename scalar_t>
__global__ void relu_dropout_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ out, int64_t n,
                                    float keep, at::PhiloxCudaState philox) {
  const auto seeds = at::cuda::philox::unpack(philox);
  const uint64_t seed = std::get<0>(seeds);
  const uint64_t offset = std::get<1>(seeds) / kPerDraw;   // the generator counts numbers, a block is four
  const uint64_t thread = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint2 key = make_uint2(static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32));
  const float scale = 1.f / keep;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kPerDraw;
  uint64_t draw = offset;
  for (int64_t base = static_cast<int64_t>(thread) * kPerDraw; base < n; base += stride, ++draw) {
    const uint4 bits = philox4x32_10(make_uint4(static_cast<unsigned>(draw), static_cast<unsigned>(draw >> 32),
                                                static_cast<unsigned>(thread), static_cast<unsigned>(thread >> 32)),
                                     key);
    const float r[kPerDraw] = {unit_float(bits.x), unit_float(bits.y), unit_float(bits.z), unit_float(bits.w)};
    float v[kPerDraw];
    load_four<vector>(x, base, n, v);
#pragma unroll
    for (int k = 0; k < kPerDraw; ++k) {
      v[k] = v[k] > 0.f && r[k] < keep ? v[k] * scale : 0.f;
    }
    store_four<vector>(out, base, n, v);
  }
}

template <bool vector, typename scalar_t>
__global__ void relu_dropout_backward_kernel(const scalar_t* __restrict__ grad, const scalar_t* __restrict__ out,
                                             scalar_t* __restrict__ grad_x, int64_t n, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kPerDraw;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPerDraw; base < n;
       base += stride) {
    float g[kPerDraw], o[kPerDraw];
    load_four<vector>(grad, base, n, g);
    load_four<vector>(out, base, n, o);
#pragma unroll
    for (int k = 0; k < kPerDraw; ++k) {
      g[k] = o[k] > 0.f ? g[k] * scale : 0.f;
    }
    store_four<vector>(grad_x, base, n, g);
  }
}

int64_t blocks_for(int64_t work) {
  int device = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t resident = static_cast<int64_t>(sms) * 8;
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
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in.scalar_type(), what, [&] {
    const scalar_t* src = in.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const float keep = static_cast<float>(1 - p);
    const auto kernel = aligned_for_four<scalar_t>(src) && aligned_for_four<scalar_t>(dst)
                            ? relu_dropout_kernel<true, scalar_t> : relu_dropout_kernel<false, scalar_t>;
    kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, dst, n, keep, philox);
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
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), what, [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* op = o.data_ptr<scalar_t>();
    scalar_t* xp = grad_x.data_ptr<scalar_t>();
    const auto kernel = aligned_for_four<scalar_t>(gp) && aligned_for_four<scalar_t>(op) &&
                                aligned_for_four<scalar_t>(xp)
                            ? relu_dropout_backward_kernel<true, scalar_t>
                            : relu_dropout_backward_kernel<false, scalar_t>;
    kernel<<<static_cast<unsigned>(blocks_for((n + kPerDraw - 1) / kPerDraw)), kThreads, 0, stream>>>(
        gp, op, xp, n, static_cast<float>(1.0 / (1 - p)));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad_x;
}

} // namespace torch_direct::aggregate
