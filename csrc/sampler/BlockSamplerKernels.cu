// The GPU draw of BlockSampler: one thread per target picks its neighbours
// with Floyd's algorithm over unbiased bounded draws and reads them from its
// CSR row in place (over PCIe when the CSR is in unified memory). And the
// passes of the hash-table relabel (HashRelabel.h), one thread per position.

#include "BlockSampler.h"

#include "DrawNeighbours.h"
#include "HashRelabel.h"

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

__global__ void insert_kernel(const int64_t* __restrict__ all, int64_t m, int64_t* keys, int64_t* firsts,
                              uint64_t mask, int64_t* __restrict__ slot) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m) {
    return;
  }
  const auto claim = [](int64_t* at, int64_t node) {
    return static_cast<int64_t>(atomicCAS(reinterpret_cast<unsigned long long*>(at),
                                          static_cast<unsigned long long>(kNoNode),
                                          static_cast<unsigned long long>(node)));
  };
  const auto lower = [](int64_t* at, int64_t pos) {
    atomicMin(reinterpret_cast<long long*>(at), static_cast<long long>(pos));
  };
  slot[i] = insert_node(keys, firsts, mask, all[i], i, claim, lower);
}

__global__ void first_kernel(int64_t m, const int64_t* __restrict__ firsts, int64_t* __restrict__ first,
                             int64_t* __restrict__ is_first) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m) {
    return;
  }
  const int64_t f = firsts[first[i]];   // `first` holds the slot from the insert pass
  first[i] = f;
  is_first[i] = f == i ? 1 : 0;
}

__global__ void number_kernel(const int64_t* __restrict__ all, int64_t m, const int64_t* __restrict__ first,
                              const int64_t* __restrict__ scan, int64_t* __restrict__ local,
                              int64_t* __restrict__ nodes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < m) {
    relabel_position(all, first, scan, i, local, nodes);
  }
}

constexpr int kRelabelThreads = 256;

unsigned relabel_blocks(int64_t m) {
  return static_cast<unsigned>((m + kRelabelThreads - 1) / kRelabelThreads);
}

} // namespace

void find_first_occurrences_cuda(const at::Tensor& all, at::Tensor& keys, at::Tensor& firsts, at::Tensor& first,
                                 at::Tensor& is_first) {
  const int64_t m = all.numel();
  if (m == 0) {
    return;
  }
  const c10::cuda::CUDAGuard guard(all.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto mask = static_cast<uint64_t>(keys.numel() - 1);
  insert_kernel<<<relabel_blocks(m), kRelabelThreads, 0, stream>>>(
      all.const_data_ptr<int64_t>(), m, keys.data_ptr<int64_t>(), firsts.data_ptr<int64_t>(), mask,
      first.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  first_kernel<<<relabel_blocks(m), kRelabelThreads, 0, stream>>>(m, firsts.const_data_ptr<int64_t>(),
                                                                  first.data_ptr<int64_t>(),
                                                                  is_first.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void number_positions_cuda(const at::Tensor& all, const at::Tensor& first, const at::Tensor& scan,
                           at::Tensor& local, at::Tensor& nodes) {
  const int64_t m = all.numel();
  if (m == 0) {
    return;
  }
  const c10::cuda::CUDAGuard guard(all.device());
  number_kernel<<<relabel_blocks(m), kRelabelThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      all.const_data_ptr<int64_t>(), m, first.const_data_ptr<int64_t>(), scan.const_data_ptr<int64_t>(),
      local.data_ptr<int64_t>(), nodes.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

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
