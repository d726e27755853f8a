// Whole-batch neighbour sampling by tensor steps (see BlockSampler.h).

#include "c10_allocator/Text.h"
#include "csrc/aten/ParallelChunks.h"
#include "BlockSampler.h"

#include "DrawNeighbours.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <limits>

namespace torch_direct::sampler {
namespace {

void draw(const at::Tensor& col, const at::Tensor& begins, const at::Tensor& degrees, int64_t fanout,
          const at::Tensor& offsets, uint64_t seed, uint64_t stream, at::Tensor& slots,
          at::Tensor& src, at::Tensor& dst) {
  if (begins.is_cuda()) {
#ifdef TORCH_DIRECT_WITH_CUDA
    draw_neighbours_cuda(col, begins, degrees, fanout, offsets, seed, stream, slots, src, dst);
    return;
#else
    TORCH_CHECK(false, "this torch_direct was built without CUDA: the GPU sampler is not available");
#endif
  }
  draw_neighbours_cpu(col, begins, degrees, fanout, offsets, seed, stream, slots, src, dst);
}

} // namespace

void draw_neighbours_cpu(const at::Tensor& col, const at::Tensor& begins, const at::Tensor& degrees,
                         int64_t fanout, const at::Tensor& offsets, uint64_t seed, uint64_t stream,
                         at::Tensor& slots, at::Tensor& src, at::Tensor& dst) {
  const int64_t* bg = begins.const_data_ptr<int64_t>();
  const int64_t* dg = degrees.const_data_ptr<int64_t>();
  const int64_t* off = offsets.const_data_ptr<int64_t>();
  int64_t* sl = slots.data_ptr<int64_t>();
  int64_t* s = src.data_ptr<int64_t>();
  int64_t* d = dst.data_ptr<int64_t>();
  at::native::unified::parallel_chunks(begins.numel(), 256, 0, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint64_t st = stream + static_cast<uint64_t>(i);
      if (col.scalar_type() == at::kLong) {
        draw_target(col.const_data_ptr<int64_t>(), bg[i], dg[i], i, fanout, off[i], seed, st, sl, s, d);
      } else {
        draw_target(col.const_data_ptr<int32_t>(), bg[i], dg[i], i, fanout, off[i], seed, st, sl, s, d);
      }
    }
  });
}

SampledBatch sample_blocks(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& seeds,
                           const std::vector<int64_t>& fanouts, uint64_t seed, int64_t stream,
                           bool return_slots) {
  TORCH_CHECK(rowptr.device() == col.device() && seeds.device() == rowptr.device(),
              "sample_blocks: rowptr, col and seeds must be on one device, got ", rowptr.device(),
              ", ", col.device(), " and ", seeds.device());
  TORCH_CHECK(rowptr.dim() == 1 && rowptr.scalar_type() == at::kLong && rowptr.is_contiguous(),
              "sample_blocks: rowptr must be a contiguous 1-D int64 tensor");
  TORCH_CHECK(col.dim() == 1 && col.is_contiguous() &&
                  (col.scalar_type() == at::kLong || col.scalar_type() == at::kInt),
              "sample_blocks: col must be a contiguous 1-D int32/int64 tensor");
  TORCH_CHECK(seeds.dim() == 1 && seeds.scalar_type() == at::kLong,
              "sample_blocks: seeds must be a 1-D int64 tensor");
  const int64_t num_nodes = rowptr.numel() - 1;
  at::Tensor nodes = seeds.contiguous();
  if (nodes.numel() > 0) {
    // One wait for the host instead of three: the sorted distinct seeds give the
    // duplicate check (their count) and the range check (their ends) together.
    const at::Tensor distinct = std::get<0>(at::_unique2(nodes, true, false, false));
    const at::Tensor ends =
        at::stack({distinct[0], distinct[-1]}).to(c10::kCPU);  // one copy of two values
    const int64_t lo = ends[0].item<int64_t>();
    const int64_t hi = ends[1].item<int64_t>();
    TORCH_CHECK_INDEX(lo >= 0 && hi < num_nodes, "NeighborSampler: seed node ",
                      c10::unified::num(lo < 0 ? lo : hi), " is out of range for a graph of ",
                      c10::unified::num(num_nodes), " nodes");
    TORCH_CHECK_VALUE(distinct.numel() == nodes.numel(),
                      "NeighborSampler: a seed node appears twice in one batch (seeds must be distinct)");
  }
  const auto long_opts = nodes.options().dtype(at::kLong);
  SampledBatch out;
  for (size_t h = 0; h < fanouts.size(); ++h) {
    const int64_t fanout = fanouts[h];
    const int64_t n_dst = nodes.numel();
    // Both ends of every target's row in one gather: read in address order, a
    // row's two ends share a cache line (one read, not two, over PCIe when
    // rowptr is in unified memory), and the draw then reads no rowptr.
    const at::Tensor bounds = rowptr.index_select(0, at::cat({nodes, nodes + 1}));
    const at::Tensor begin = bounds.slice(0, 0, n_dst);
    const at::Tensor degree = bounds.slice(0, n_dst) - begin;
    const at::Tensor counts = fanout < 0 ? degree : degree.clamp_max(fanout);
    const at::Tensor ends = counts.cumsum(0);
    const at::Tensor offsets = ends - counts;
    const int64_t e = n_dst > 0 ? ends[-1].item<int64_t>() : 0;  // one sync per hop: the edge count
    at::Tensor slots = at::empty({e}, long_opts);
    at::Tensor src = at::empty({e}, long_opts);
    at::Tensor dst = at::empty({e}, long_opts);
    if (e > 0) {
      draw(col, begin, degree, fanout, offsets, seed,
           target_stream(static_cast<uint64_t>(stream), static_cast<int64_t>(h), 0), slots, src, dst);
    }
    // Relabel: local ids by first occurrence in [known nodes, sampled sources].
    const at::Tensor all = at::cat({nodes, src});
    auto [unique, inverse, unused] = at::_unique2(all, true, true, false);
    const int64_t u = unique.numel();
    const at::Tensor first =
        at::full({u}, std::numeric_limits<int64_t>::max(), long_opts)
            .scatter_reduce_(0, inverse, at::arange(all.numel(), long_opts), "amin", true);
    const at::Tensor order = first.argsort();
    const at::Tensor rank = at::empty({u}, long_opts).index_put_({order}, at::arange(u, long_opts));
    const at::Tensor src_local = rank.index_select(0, inverse.slice(0, n_dst));
    nodes = unique.index_select(0, order);
    Hop hop;
    hop.edge_index = at::stack({src_local, dst});
    if (return_slots) {
      hop.slots = slots;
    }
    hop.n_src = u;
    hop.n_dst = n_dst;
    out.hops.push_back(std::move(hop));
  }
  out.n_id = nodes;
  return out;
}

} // namespace torch_direct::sampler
