// The GPU draw of BlockSampler: one thread per target picks its neighbours
// with Floyd's algorithm over unbiased bounded draws and reads them from its
// CSR row in place (over PCIe when the CSR is in unified memory).

#include "BlockSampler.h"

#include "DrawNeighbours.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace torch_direct::sampler {
namespace {

template <typename col_t>
__global__ void draw_kernel(const col_t* __restrict__ col, const int64_t* __restrict__ begins,
                            const int64_t* __restrict__ degrees, int64_t n, int64_t fanout,
                            const int64_t* __restrict__ offsets, uint64_t seed, uint64_t stream_base,
                            int64_t* __restrict__ slots, int64_t* __restrict__ src,
                            int64_t* __restrict__ dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  draw_target(col, begins[i], degrees[i], i, fanout, offsets[i], seed, stream_base + static_cast<uint64_t>(i),
              slots, src, dst);
}

} // namespace

void draw_neighbours_cuda(const at::Tensor& col, const at::Tensor& begins, const at::Tensor& degrees,
                          int64_t fanout, const at::Tensor& offsets, uint64_t seed, uint64_t stream,
                          at::Tensor& slots, at::Tensor& src, at::Tensor& dst) {
  const int64_t n = begins.numel();
  if (n == 0) {
    return;
  }
  const c10::cuda::CUDAGuard guard(begins.device());
  constexpr int threads = 128;
  const auto blocks = static_cast<unsigned>((n + threads - 1) / threads);
  cudaStream_t cuda_stream = c10::cuda::getCurrentCUDAStream();
  if (col.scalar_type() == at::kLong) {
    draw_kernel<<<blocks, threads, 0, cuda_stream>>>(
        col.const_data_ptr<int64_t>(), begins.const_data_ptr<int64_t>(), degrees.const_data_ptr<int64_t>(),
        n, fanout, offsets.const_data_ptr<int64_t>(), seed, stream, slots.data_ptr<int64_t>(),
        src.data_ptr<int64_t>(), dst.data_ptr<int64_t>());
  } else {
    draw_kernel<<<blocks, threads, 0, cuda_stream>>>(
        col.const_data_ptr<int32_t>(), begins.const_data_ptr<int64_t>(), degrees.const_data_ptr<int64_t>(),
        n, fanout, offsets.const_data_ptr<int64_t>(), seed, stream, slots.data_ptr<int64_t>(),
        src.data_ptr<int64_t>(), dst.data_ptr<int64_t>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace torch_direct::sampler
