#pragma once
// The host side of one training step, as single calls that run without the GIL: the copy of a
// sampled batch into a graphed step's padded buffers, and the loop's running loss and accuracy
// tally. Each is the same ATen ops the Python code would issue one call at a time, so that the
// training loop takes the GIL once for them instead of once an op, beside the loader's Python
// threads that want it too.

#include <ATen/ATen.h>

#include <algorithm>
#include <tuple>
#include <vector>

namespace torch_direct::aggregate {

// Padding edges a padding target takes: `pad` edges over `rows` padding targets, in runs of at
// most ceil(pad / rows) each (at least 1), counted down from the last target. Both forms of
// the copy (ATen and the kernel) place the padding edges by it.
inline int64_t padding_per_row(int64_t pad, int64_t rows) {
  return std::max<int64_t>(1, (pad + rows - 1) / rows);
}

// A graphed step's padded buffers, kept with what does not change from batch to batch, and the
// copy of one sampled batch into them. The buffers: x_buf (features), edges[i] (block i's [2, cap]
// edge index), y_buf (labels); ramps[i] is arange over edges[i]'s columns, pad_src[i] the
// padding edges' sources, dst_caps[i] block i's target capacity.
class PaddedBuffers {
 public:
  PaddedBuffers(at::Tensor x_buf, std::vector<at::Tensor> edges, std::vector<at::Tensor> ramps,
                std::vector<at::Tensor> pad_src, std::vector<int64_t> dst_caps, at::Tensor y_buf);

  // Copies x into x_buf's first rows (the rest zeroed), each block's edges block_edges[i] (its
  // [2, k] edge index, block_dsts[i] its target count) into edges[i]'s first columns (padding
  // edges after them: sources pad_src[i][k:], targets counted down from row dst_caps[i] - 1,
  // grouped by target) and y into y_buf's first entries (the rest -1). A batch that does not fit
  // is refused before anything is written. With kernel (and CUDA tensors: contiguous buffers,
  // the features' dtype the buffer's, int64 labels), the copy is a memcpy, a memset and one
  // kernel for every block's edges and the labels instead of a few ATen ops a block.
  // Returns the call's own wall and thread-CPU seconds, timed inside it (without the GIL): beside
  // the caller's timing of the call, what it waited for the GIL on its way back, and beside each
  // other, what its launches waited off the CPU (a CUDA driver lock, say).
  std::tuple<double, double> fill(const at::Tensor& x, const std::vector<at::Tensor>& block_edges,
                                  const std::vector<int64_t>& block_dsts, const at::Tensor& y, bool kernel);

#ifdef TORCH_DIRECT_WITH_CUDA
  // fill with the kernel, with two sets of buffers, in one call: the fill stream waits for each
  // event of waits (raw cudaEvent_t handles; 0, an event never recorded, is skipped), the copy
  // runs there, copied (a created event) is recorded after it and the training stream waits for
  // that. Streams as raw cudaStream_t handles (0: the default stream). Returns fill's seconds.
  std::tuple<double, double> fill_beside(int64_t fill_stream, int64_t train_stream, const std::vector<int64_t>& waits,
                                         int64_t copied, const at::Tensor& x,
                                         const std::vector<at::Tensor>& block_edges,
                                         const std::vector<int64_t>& block_dsts, const at::Tensor& y);
#endif

 private:
  void check(const at::Tensor& x, const std::vector<at::Tensor>& block_edges, const std::vector<int64_t>& block_dsts,
             const at::Tensor& y) const;
  void fill_aten(const at::Tensor& x, const std::vector<at::Tensor>& block_edges,
                 const std::vector<int64_t>& block_dsts, const at::Tensor& y);
#ifdef TORCH_DIRECT_WITH_CUDA
  // whether the kernel takes this batch (else fill issues ATen ops); the buffers' part is fixed
  bool kernel_takes(const at::Tensor& x, const std::vector<at::Tensor>& block_edges, const at::Tensor& y) const;
  bool buffers_take_kernel() const;
  void fill_cuda(const at::Tensor& x, const std::vector<at::Tensor>& block_edges,
                 const std::vector<int64_t>& block_dsts, const at::Tensor& y);
#endif

  at::Tensor x_buf_, y_buf_;
  std::vector<at::Tensor> edges_, ramps_, pad_src_;
  std::vector<int64_t> dst_caps_;
  bool buffers_take_kernel_ = false;
};

#ifdef TORCH_DIRECT_WITH_CUDA
constexpr int kMaxFillBlocks = 16;   // the most blocks (layers) the one-kernel copy takes
#endif

// loss_sum += loss * batch_size; correct += how many labelled entries of y (y >= 0) have their
// label as the top logit of their row (logits: [len(y), classes]).
void tally_step(at::Tensor loss_sum, at::Tensor correct, const at::Tensor& loss, const at::Tensor& logits,
                const at::Tensor& y, int64_t batch_size);

} // namespace torch_direct::aggregate
