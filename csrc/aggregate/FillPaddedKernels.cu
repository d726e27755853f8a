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
void launch(const FillArgs<Out, In>& a, cudaStream_t stream) {
  const int64_t total = a.ends[a.nblocks - 1] + a.y_cap;
  const int64_t grid = std::min<int64_t>((total + kThreads - 1) / kThreads, 4096);
  fill_index_kernel<Out, In><<<static_cast<unsigned>(std::max<int64_t>(grid, 1)), kThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool is_index(at::ScalarType t) { return t == at::kInt || t == at::kLong; }

} // namespace

bool PaddedBuffers::buffers_take_kernel() const {
  if (edges_.size() > static_cast<size_t>(kMaxFillBlocks) || !x_buf_.is_cuda() || !x_buf_.is_contiguous() ||
      y_buf_.scalar_type() != at::kLong || y_buf_.device() != x_buf_.device() || !y_buf_.is_contiguous())
    return false;
  const auto out_t = edges_[0].scalar_type();
  if (!is_index(out_t)) return false;
  for (size_t i = 0; i < edges_.size(); ++i)
    for (const at::Tensor* t : {&edges_[i], &ramps_[i], &pad_src_[i]})
      if (t->scalar_type() != out_t || t->device() != x_buf_.device() || !t->is_contiguous()) return false;
  return true;
}

bool PaddedBuffers::kernel_takes(const at::Tensor& x, const std::vector<at::Tensor>& block_edges,
                                 const at::Tensor& y) const {
  if (!buffers_take_kernel_ || x.device() != x_buf_.device() || x.scalar_type() != x_buf_.scalar_type() ||
      !x.is_contiguous() || y.scalar_type() != at::kLong || y.device() != x_buf_.device() || !y.is_contiguous())
    return false;
  const auto in_t = block_edges[0].scalar_type();
  if (!is_index(in_t)) return false;
  for (const at::Tensor& ei : block_edges)
    if (ei.scalar_type() != in_t || ei.device() != x_buf_.device()) return false;
  return true;
}

void PaddedBuffers::fill_cuda(const at::Tensor& x, const std::vector<at::Tensor>& block_edges,
                              const std::vector<int64_t>& block_dsts, const at::Tensor& y) {
  const c10::cuda::CUDAGuard guard(x_buf_.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x_buf_.device().index()).stream();
  const int64_t row_bytes = x_buf_.size(1) * static_cast<int64_t>(x_buf_.element_size());
  const int64_t n = x.size(0);
  auto* dst = static_cast<char*>(x_buf_.data_ptr());
  if (n > 0)
    C10_CUDA_CHECK(cudaMemcpyAsync(dst, x.const_data_ptr(), n * row_bytes, cudaMemcpyDeviceToDevice, stream));
  if (x_buf_.size(0) > n)
    C10_CUDA_CHECK(cudaMemsetAsync(dst + n * row_bytes, 0, (x_buf_.size(0) - n) * row_bytes, stream));
  const bool out32 = edges_[0].scalar_type() == at::kInt, in32 = block_edges[0].scalar_type() == at::kInt;
  const auto go = [&](auto out_tag, auto in_tag) {
    using Out = decltype(out_tag);
    using In = decltype(in_tag);
    FillArgs<Out, In> a{};
    a.nblocks = static_cast<int>(edges_.size());
    int64_t end = 0;
    for (int b = 0; b < a.nblocks; ++b) {
      const at::Tensor& ei = block_edges[b];
      const int64_t cap = edges_[b].size(1), k = ei.size(1);
      const int64_t rows = dst_caps_[b] - block_dsts[b];
      a.blocks[b] = {edges_[b].data_ptr<Out>(), ei.const_data_ptr<In>(), ramps_[b].const_data_ptr<Out>(),
                     pad_src_[b].const_data_ptr<Out>(), ei.stride(0), ei.stride(1), k, cap,
                     padding_per_row(cap - k, rows), dst_caps_[b] - 1};
      end += 2 * cap;
      a.ends[b] = end;
    }
    a.y_out = y_buf_.data_ptr<int64_t>();
    a.y_in = y.const_data_ptr<int64_t>();
    a.y_n = y.size(0);
    a.y_cap = y_buf_.size(0);
    launch(a, stream);
  };
  if (out32 && in32)
    go(int32_t{}, int32_t{});
  else if (out32)
    go(int32_t{}, int64_t{});
  else if (in32)
    go(int64_t{}, int32_t{});
  else
    go(int64_t{}, int64_t{});
}

std::tuple<double, double> PaddedBuffers::fill_beside(int64_t fill_stream, int64_t train_stream,
                                                      const std::vector<int64_t>& waits, int64_t copied,
                                                      const at::Tensor& x, const std::vector<at::Tensor>& block_edges,
                                                      const std::vector<int64_t>& block_dsts, const at::Tensor& y) {
  TORCH_CHECK(x_buf_.is_cuda(), "PaddedBuffers.fill_beside: the buffers must be on a CUDA device, not ", x_buf_.device());
  // a stream handle of 0 is the device's default stream, which a training loop may run on
  TORCH_CHECK(copied != 0, "PaddedBuffers.fill_beside: the copy's event must be created (recorded once) first");
  const c10::cuda::CUDAGuard guard(x_buf_.device());
  const auto fs = reinterpret_cast<cudaStream_t>(fill_stream);
  const auto done = reinterpret_cast<cudaEvent_t>(copied);
  for (const int64_t e : waits)
    if (e != 0) C10_CUDA_CHECK(cudaStreamWaitEvent(fs, reinterpret_cast<cudaEvent_t>(e), 0));
  std::tuple<double, double> spent;
  {
    const c10::cuda::CUDAStreamGuard on_fill(c10::cuda::getStreamFromExternal(fs, x_buf_.device().index()));
    spent = fill(x, block_edges, block_dsts, y, true);
  }
  C10_CUDA_CHECK(cudaEventRecord(done, fs));
  C10_CUDA_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(train_stream), done, 0));
  return spent;
}

} // namespace torch_direct::aggregate
