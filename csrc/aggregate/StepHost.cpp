#include "StepHost.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <utility>

namespace torch_direct::aggregate {

namespace {

// This thread's CPU seconds so far.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

} // namespace

PaddedBuffers::PaddedBuffers(at::Tensor x_buf, std::vector<at::Tensor> edges, std::vector<at::Tensor> ramps,
                             std::vector<at::Tensor> pad_src, std::vector<int64_t> dst_caps, at::Tensor y_buf)
    : x_buf_(std::move(x_buf)),
      y_buf_(std::move(y_buf)),
      edges_(std::move(edges)),
      ramps_(std::move(ramps)),
      pad_src_(std::move(pad_src)),
      dst_caps_(std::move(dst_caps)) {
  const char* op = "PaddedBuffers";
  const size_t blocks = edges_.size();
  TORCH_CHECK(blocks > 0 && ramps_.size() == blocks && pad_src_.size() == blocks && dst_caps_.size() == blocks, op,
              ": one entry per block in each list, got ", blocks, " edge buffers, ", ramps_.size(), " ramps, ",
              pad_src_.size(), " padding sources and ", dst_caps_.size(), " target capacities");
  TORCH_CHECK(x_buf_.dim() == 2 && y_buf_.dim() == 1, op, ": the feature buffer must be 2-D and the label buffer 1-D, got ",
              x_buf_.sizes(), " and ", y_buf_.sizes());
  for (size_t i = 0; i < blocks; ++i) {
    const at::Tensor& e = edges_[i];
    TORCH_CHECK(e.dim() == 2 && e.size(0) == 2, op, ": block ", i, "'s edge buffer must be [2, capacity], got ",
                e.sizes());
    TORCH_CHECK(ramps_[i].dim() == 1 && ramps_[i].size(0) == e.size(1) && pad_src_[i].dim() == 1 &&
                    pad_src_[i].size(0) == e.size(1),
                op, ": block ", i, "'s ramp and padding sources must have the buffer's ", e.size(1), " entries");
    TORCH_CHECK(dst_caps_[i] > 0, op, ": block ", i, "'s target capacity must be positive, got ", dst_caps_[i]);
  }
#ifdef TORCH_DIRECT_WITH_CUDA
  buffers_take_kernel_ = buffers_take_kernel();
#endif
}

void PaddedBuffers::check(const at::Tensor& x, const std::vector<at::Tensor>& block_edges,
                          const std::vector<int64_t>& block_dsts, const at::Tensor& y) const {
  const char* op = "PaddedBuffers.fill";
  const size_t blocks = edges_.size();
  TORCH_CHECK(block_edges.size() == blocks && block_dsts.size() == blocks, op,
              ": one entry per block in each list, got ", blocks, " buffers, ", block_edges.size(),
              " edge indices and ", block_dsts.size(), " target counts");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == x_buf_.size(1) && x.size(0) <= x_buf_.size(0), op,
              ": the batch's features ", x.sizes(), " do not fit the buffer ", x_buf_.sizes());
  TORCH_CHECK(y.dim() == 1 && y.size(0) <= y_buf_.size(0), op, ": the batch's ", y.sizes(),
              " labels do not fit the buffer's ", y_buf_.size(0));
  // every block checked before anything is written
  for (size_t i = 0; i < blocks; ++i) {
    const at::Tensor& ei = block_edges[i];
    TORCH_CHECK(ei.dim() == 2 && ei.size(0) == 2 && ei.size(1) <= edges_[i].size(1), op, ": block ", i, "'s edges ",
                ei.sizes(), " do not fit the buffer ", edges_[i].sizes());
    TORCH_CHECK(block_dsts[i] >= 0 && block_dsts[i] < dst_caps_[i], op, ": block ", i, " has ", block_dsts[i],
                " targets, which leaves no padding row below its capacity ", dst_caps_[i]);
  }
}

std::tuple<double, double> PaddedBuffers::fill(const at::Tensor& x, const std::vector<at::Tensor>& block_edges,
                                               const std::vector<int64_t>& block_dsts, const at::Tensor& y,
                                               bool kernel) {
  const auto wall0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_seconds();
  check(x, block_edges, block_dsts, y);
  c10::NoGradGuard no_grad;
#ifdef TORCH_DIRECT_WITH_CUDA
  if (kernel && kernel_takes(x, block_edges, y)) {
    fill_cuda(x, block_edges, block_dsts, y);
  } else {
    fill_aten(x, block_edges, block_dsts, y);
  }
#else
  (void)kernel;
  fill_aten(x, block_edges, block_dsts, y);
#endif
  const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - wall0;
  return {wall.count(), thread_cpu_seconds() - cpu0};
}

void PaddedBuffers::fill_aten(const at::Tensor& x, const std::vector<at::Tensor>& block_edges,
                              const std::vector<int64_t>& block_dsts, const at::Tensor& y) {
  const int64_t n = x.size(0);
  x_buf_.narrow(0, 0, n).copy_(x);
  x_buf_.narrow(0, n, x_buf_.size(0) - n).zero_();
  for (size_t i = 0; i < edges_.size(); ++i) {
    at::Tensor e = edges_[i];
    const int64_t k = block_edges[i].size(1);
    const int64_t pad = e.size(1) - k;
    e.narrow(1, 0, k).copy_(block_edges[i]);
    e[0].narrow(0, k, pad).copy_(pad_src_[i].narrow(0, k, pad));
    // the padding edges' targets, from row dst_caps - 1 down, in runs of at most
    // ceil(pad / padding rows) edges: grouped by target as the sampler's own edges are
    const int64_t rows = dst_caps_[i] - block_dsts[i];
    const int64_t per_row = padding_per_row(pad, rows);
    at::Tensor t = e[1].narrow(0, k, pad);
    at::sub_out(t, ramps_[i].narrow(0, k, pad), k);
    t.div_(per_row, "floor").neg_().add_(dst_caps_[i] - 1);
  }
  const int64_t s = y.size(0);
  y_buf_.narrow(0, 0, s).copy_(y);
  y_buf_.narrow(0, s, y_buf_.size(0) - s).fill_(-1);
}

void tally_step(at::Tensor loss_sum, at::Tensor correct, const at::Tensor& loss, const at::Tensor& logits,
                const at::Tensor& y, int64_t batch_size) {
  TORCH_CHECK(logits.dim() == 2 && y.dim() == 1 && logits.size(0) == y.size(0), "tally_step: logits ",
              logits.sizes(), " need one row per label of ", y.sizes());
  TORCH_CHECK(loss.numel() == 1 && loss_sum.numel() == 1 && correct.numel() == 1,
              "tally_step: loss, loss_sum and correct must each hold one value");
  c10::NoGradGuard no_grad;
  loss_sum.add_(loss * batch_size);
  correct.add_(logits.argmax(1).eq(y).logical_and_(y.ge(0)).sum());
}

} // namespace torch_direct::aggregate
