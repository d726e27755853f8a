#include "StepHost.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <ctime>

namespace torch_direct::aggregate {

namespace {

// This thread's CPU seconds so far.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

} // namespace

std::tuple<double, double> fill_padded(at::Tensor x_buf, const at::Tensor& x, const std::vector<at::Tensor>& edges,
                 const std::vector<at::Tensor>& block_edges, const std::vector<at::Tensor>& ramps,
                 const std::vector<at::Tensor>& pad_src, const std::vector<int64_t>& block_dsts,
                 const std::vector<int64_t>& dst_caps, at::Tensor y_buf, const at::Tensor& y, bool kernel) {
  const auto wall0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_seconds();
  const auto spent = [&]() -> std::tuple<double, double> {
    const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - wall0;
    return {wall.count(), thread_cpu_seconds() - cpu0};
  };
  const char* op = "fill_padded";
  const size_t blocks = edges.size();
  TORCH_CHECK(block_edges.size() == blocks && ramps.size() == blocks && pad_src.size() == blocks &&
                  block_dsts.size() == blocks && dst_caps.size() == blocks,
              op, ": one entry per block in each list, got ", blocks, " buffers, ", block_edges.size(),
              " edge indices, ", ramps.size(), " ramps, ", pad_src.size(), " padding sources, ",
              block_dsts.size(), " target counts and ", dst_caps.size(), " target capacities");
  TORCH_CHECK(x_buf.dim() == 2 && x.dim() == 2 && x.size(1) == x_buf.size(1) && x.size(0) <= x_buf.size(0), op,
              ": the batch's features ", x.sizes(), " do not fit the buffer ", x_buf.sizes());
  TORCH_CHECK(y.dim() == 1 && y_buf.dim() == 1 && y.size(0) <= y_buf.size(0), op, ": the batch's ",
              y.size(0), " labels do not fit the buffer's ", y_buf.size(0));
  // every block checked before anything is written
  for (size_t i = 0; i < blocks; ++i) {
    const at::Tensor& e = edges[i];
    const at::Tensor& ei = block_edges[i];
    TORCH_CHECK(e.dim() == 2 && e.size(0) == 2 && ei.dim() == 2 && ei.size(0) == 2 && ei.size(1) <= e.size(1), op,
                ": block ", i, "'s edges ", ei.sizes(), " do not fit the buffer ", e.sizes());
    TORCH_CHECK(ramps[i].dim() == 1 && ramps[i].size(0) == e.size(1) && pad_src[i].dim() == 1 &&
                    pad_src[i].size(0) == e.size(1),
                op, ": block ", i, "'s ramp and padding sources must have the buffer's ", e.size(1), " entries");
    TORCH_CHECK(block_dsts[i] >= 0 && block_dsts[i] < dst_caps[i], op, ": block ", i, " has ", block_dsts[i],
                " targets, which leaves no padding row below its capacity ", dst_caps[i]);
  }
  c10::NoGradGuard no_grad;
#ifdef TORCH_DIRECT_WITH_CUDA
  if (kernel && fill_padded_cuda_applies(x_buf, x, edges, block_edges, ramps, pad_src, y_buf, y)) {
    fill_padded_cuda(x_buf, x, edges, block_edges, ramps, pad_src, block_dsts, dst_caps, y_buf, y);
    return spent();
  }
#else
  (void)kernel;
#endif
  const int64_t n = x.size(0);
  x_buf.narrow(0, 0, n).copy_(x);
  x_buf.narrow(0, n, x_buf.size(0) - n).zero_();
  for (size_t i = 0; i < blocks; ++i) {
    at::Tensor e = edges[i];
    const int64_t k = block_edges[i].size(1);
    const int64_t cap = e.size(1);
    const int64_t pad = cap - k;
    e.narrow(1, 0, k).copy_(block_edges[i]);
    e[0].narrow(0, k, pad).copy_(pad_src[i].narrow(0, k, pad));
    // the padding edges' targets, from row dst_caps - 1 down, in runs of at most
    // ceil(pad / padding rows) edges: grouped by target as the sampler's own edges are
    const int64_t rows = dst_caps[i] - block_dsts[i];
    const int64_t per_row = std::max<int64_t>(1, (pad + rows - 1) / rows);
    at::Tensor t = e[1].narrow(0, k, pad);
    at::sub_out(t, ramps[i].narrow(0, k, pad), k);
    t.div_(per_row, "floor").neg_().add_(dst_caps[i] - 1);
  }
  const int64_t s = y.size(0);
  y_buf.narrow(0, 0, s).copy_(y);
  y_buf.narrow(0, s, y_buf.size(0) - s).fill_(-1);
  return spent();
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
