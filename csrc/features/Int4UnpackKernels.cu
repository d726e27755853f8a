// The 4-bit rows' unpacking on a GPU (Int4Unpack.h): a grid-stride loop over the packed bytes,
// each thread writing one byte's two values, so that a warp reads 32 adjacent bytes of a row and
// writes 64 adjacent values. Each row's scale is read through the index.

#include "Int4Unpack.h"

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

namespace torch_direct::features {

namespace {

constexpr int kThreads = 256;

template <typename out_t, typename index_t>
__global__ void unpack_kernel(const uint8_t* __restrict__ rows, const float* __restrict__ scale,
                              const index_t* __restrict__ index, out_t* __restrict__ out, int64_t n, int64_t m,
                              int64_t r_max) {
  const int64_t items = n * m;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < items;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / m;
    const int64_t r = static_cast<int64_t>(index[i]);
    if (r < 0 || r >= r_max) {
      out[2 * k] = static_cast<out_t>(0.0f);
      out[2 * k + 1] = static_cast<out_t>(0.0f);
    } else {
      unpack_int4_byte(rows[k], scale[r], out + 2 * k);
    }
  }
}

} // namespace

void unpack_int4_cuda(const at::Tensor& rows, const at::Tensor& scale, const at::Tensor& index, at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(rows.device());
  const int64_t n = rows.size(0), m = rows.size(1);
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rows.device().index()));
  const int64_t want = (n * m + kThreads - 1) / kThreads;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(want, static_cast<int64_t>(sms) * (2048 / kThreads)));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(rows.device().index());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "unpack_int4_cuda", [&] {
    using out_t = scalar_t;
    AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "unpack_int4_cuda", [&] {
      unpack_kernel<out_t, index_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          rows.const_data_ptr<uint8_t>(), scale.const_data_ptr<float>(), index.const_data_ptr<index_t>(),
          out.data_ptr<out_t>(), n, m, scale.size(0));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

} // namespace torch_direct::features
