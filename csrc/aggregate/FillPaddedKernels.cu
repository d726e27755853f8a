// The padded batch copy's index part in one CUDA kernel: every block's edges (the batch's own,
// then the padding edges) and the labels (then -1), so that a graphed step's copy is a memcpy,
// a memset and this one launch instead of a few ATen ops a block.

#include "StepHost.h"

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace torch_direct::aggregate {

namespace {

constexpr int kThreads = 256;

// One block's part: out is the [2, cap] buffer (contiguous), in the batch's [2, k] edges
// (strides in_s0, in_s1), ramp and pad the buffer's column ramp and padding sources.
template <typename Out, typename In>
struct BlockPart {
  Out* out;
  const In* in;
  const Out* ramp;
  const Out* pad;
  int64_t in_s0, in_s1, k, cap, per_row, top;
};

template <typename Out, typename In>
struct FillArgs {
  BlockPart<Out, In> blocks[kMaxFillBlocks];
  int64_t ends[kMaxFillBlocks];   // prefix sums of 2 * cap: where each block's entries end
  int nblocks;
  int64_t* y_out;
  const int64_t* y_in;
  int64_t y_n, y_cap;
};

template <typename Out, typename In>
__global__ void fill_index_kernel(FillArgs<Out, In> a) {
  const int64_t edge_total = a.ends[a.nblocks - 1];
  const int64_t total = edge_total + a.y_cap;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i >= edge_total) {
      const int64_t j = i - edge_total;
      a.y_out[j] = j < a.y_n ? a.y_in[j] : -1;
      continue;
    }
    int b = 0;
    while (i >= a.ends[b]) ++b;
    const BlockPart<Out, In>& p = a.blocks[b];
    const int64_t local = i - (b ? a.ends[b - 1] : 0);
    const int64_t row = local / p.cap;   // 0: sources, 1: targets
    const int64_t col = local - row * p.cap;
    Out v;
    if (col < p.k) {
      v = static_cast<Out>(p.in[row * p.in_s0 + col * p.in_s1]);
    } else if (row == 0) {
      v = p.pad[col];
    } else {   // as the ATen form: top - floor((ramp - k) / per_row)
      const int64_t r = static_cast<int64_t>(p.ramp[col]) - p.k;
      v = static_cast<Out>(p.top - r / p.per_row);
    }
    p.out[row * p.cap + col] = v;
  }
}

template <typename Out, typename In>
void launch(const std::vector<at::Tensor>& edges, const std::vector<at::Tensor>& block_edges,
            const std::vector<at::Tensor>& ramps, const std::vector<at::Tensor>& pad_src,
            const std::vector<int64_t>& block_dsts, const std::vector<int64_t>& dst_caps, at::Tensor& y_buf,
            const at::Tensor& y, cudaStream_t stream) {
  FillArgs<Out, In> a{};
  a.nblocks = static_cast<int>(edges.size());
  int64_t end = 0;
  for (int b = 0; b < a.nblocks; ++b) {
    const int64_t cap = edges[b].size(1), k = block_edges[b].size(1);
    const int64_t rows = dst_caps[b] - block_dsts[b];
    a.blocks[b] = {edges[b].data_ptr<Out>(), block_edges[b].data_ptr<In>(), ramps[b].data_ptr<Out>(),
                   pad_src[b].data_ptr<Out>(), block_edges[b].stride(0), block_edges[b].stride(1), k, cap,
                   std::max<int64_t>(1, (cap - k + rows - 1) / rows), dst_caps[b] - 1};
    end += 2 * cap;
    a.ends[b] = end;
  }
  a.y_out = y_buf.data_ptr<int64_t>();
  a.y_in = y.data_ptr<int64_t>();
  a.y_n = y.size(0);
  a.y_cap = y_buf.size(0);
  const int64_t total = end + a.y_cap;
  const int64_t grid = std::min<int64_t>((total + kThreads - 1) / kThreads, 4096);
  fill_index_kernel<Out, In><<<static_cast<unsigned>(std::max<int64_t>(grid, 1)), kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace

bool fill_padded_cuda_applies(const at::Tensor& x_buf, const at::Tensor& x, const std::vector<at::Tensor>& edges,
                              const std::vector<at::Tensor>& block_edges, const std::vector<at::Tensor>& ramps,
                              const std::vector<at::Tensor>& pad_src, const at::Tensor& y_buf, const at::Tensor& y) {
  if (edges.empty() || edges.size() > static_cast<size_t>(kMaxFillBlocks) || !x_buf.is_cuda() ||
      x.device() != x_buf.device() || x.scalar_type() != x_buf.scalar_type() || !x.is_contiguous() ||
      !x_buf.is_contiguous() || y.scalar_type() != at::kLong || y_buf.scalar_type() != at::kLong ||
      y.device() != x_buf.device() || y_buf.device() != x_buf.device() || !y.is_contiguous() ||
      !y_buf.is_contiguous())
    return false;
  const auto out_t = edges[0].scalar_type(), in_t = block_edges[0].scalar_type();
  if ((out_t != at::kInt && out_t != at::kLong) || (in_t != at::kInt && in_t != at::kLong)) return false;
  for (size_t i = 0; i < edges.size(); ++i) {
    for (const at::Tensor* t : {&edges[i], &ramps[i], &pad_src[i]})
      if (t->scalar_type() != out_t || t->device() != x_buf.device() || !t->is_contiguous()) return false;
    if (block_edges[i].scalar_type() != in_t || block_edges[i].device() != x_buf.device()) return false;
  }
  return true;
}

void fill_padded_cuda(at::Tensor& x_buf, const at::Tensor& x, const std::vector<at::Tensor>& edges,
                      const std::vector<at::Tensor>& block_edges, const std::vector<at::Tensor>& ramps,
                      const std::vector<at::Tensor>& pad_src, const std::vector<int64_t>& block_dsts,
                      const std::vector<int64_t>& dst_caps, at::Tensor& y_buf, const at::Tensor& y) {
  const c10::cuda::CUDAGuard guard(x_buf.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x_buf.device().index()).stream();
  const int64_t row_bytes = x_buf.size(1) * static_cast<int64_t>(x_buf.element_size());
  const int64_t n = x.size(0);
  auto* dst = static_cast<char*>(x_buf.data_ptr());
  if (n > 0)
    C10_CUDA_CHECK(cudaMemcpyAsync(dst, x.data_ptr(), n * row_bytes, cudaMemcpyDeviceToDevice, stream));
  if (x_buf.size(0) > n)
    C10_CUDA_CHECK(cudaMemsetAsync(dst + n * row_bytes, 0, (x_buf.size(0) - n) * row_bytes, stream));
  const bool out32 = edges[0].scalar_type() == at::kInt, in32 = block_edges[0].scalar_type() == at::kInt;
  if (out32 && in32)
    launch<int32_t, int32_t>(edges, block_edges, ramps, pad_src, block_dsts, dst_caps, y_buf, y, stream);
  else if (out32)
    launch<int32_t, int64_t>(edges, block_edges, ramps, pad_src, block_dsts, dst_caps, y_buf, y, stream);
  else if (in32)
    launch<int64_t, int32_t>(edges, block_edges, ramps, pad_src, block_dsts, dst_caps, y_buf, y, stream);
  else
    launch<int64_t, int64_t>(edges, block_edges, ramps, pad_src, block_dsts, dst_caps, y_buf, y, stream);
}

std::tuple<double, double> fill_padded_beside(int64_t fill_stream, int64_t train_stream, const std::vector<int64_t>& waits,
                                              int64_t copied, at::Tensor x_buf, const at::Tensor& x,
                                              const std::vector<at::Tensor>& edges,
                                              const std::vector<at::Tensor>& block_edges,
                                              const std::vector<at::Tensor>& ramps, const std::vector<at::Tensor>& pad_src,
                                              const std::vector<int64_t>& block_dsts,
                                              const std::vector<int64_t>& dst_caps, at::Tensor y_buf, const at::Tensor& y) {
  TORCH_CHECK(x_buf.is_cuda(), "fill_padded_beside: the buffers must be on a CUDA device, not ", x_buf.device());
  // a stream handle of 0 is the device's default stream, which a training loop may run on
  TORCH_CHECK(copied != 0, "fill_padded_beside: the copy's event must be created (recorded once) first");
  const c10::cuda::CUDAGuard guard(x_buf.device());
  const auto fs = reinterpret_cast<cudaStream_t>(fill_stream);
  const auto done = reinterpret_cast<cudaEvent_t>(copied);
  for (const int64_t e : waits)
    if (e != 0) C10_CUDA_CHECK(cudaStreamWaitEvent(fs, reinterpret_cast<cudaEvent_t>(e), 0));
  std::tuple<double, double> spent;
  {
    const c10::cuda::CUDAStreamGuard on_fill(c10::cuda::getStreamFromExternal(fs, x_buf.device().index()));
    spent = fill_padded(x_buf, x, edges, block_edges, ramps, pad_src, block_dsts, dst_caps, y_buf, y, true);
  }
  C10_CUDA_CHECK(cudaEventRecord(done, fs));
  C10_CUDA_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(train_stream), done, 0));
  return spent;
}

} // namespace torch_direct::aggregate
