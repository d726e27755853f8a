// CPU neighbour sampler (see NeighborSampler.h). Each batch keeps one hash map
// from global to local ids across all of its hops, so a node found at any hop
// gets one local id and the blocks of consecutive hops share a prefix.

#include "c10_allocator/Text.h"
#include "csrc/aten/ParallelChunks.h"
#include "NeighborSampler.h"

#include "FlatHashMap.h"
#include "Random.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

namespace torch_direct::sampler {
namespace {

// Picks k distinct positions of [0, n), 0 < k < n, each k-subset equally
// likely: Floyd's algorithm (one bounded draw per pick, no O(n) scratch).
// Small k checks membership by a scan; large k through a hash set.
void choose_distinct(Rng& rng, int64_t n, int64_t k, std::vector<int64_t>& out, FlatHashMap& set) {
  out.clear();
  const bool small = k <= 32;
  if (!small) {
    set.reset(k);
  }
  for (int64_t j = n - k; j < n; ++j) {
    const auto t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(j) + 1));
    bool seen;
    if (small) {
      seen = std::find(out.begin(), out.end(), t) != out.end();
    } else {
      bool inserted;
      set.find_or_insert(t, 0, inserted);
      seen = !inserted;
      if (seen) {
        set.find_or_insert(j, 0, inserted);
      }
    }
    out.push_back(seen ? j : t);
  }
}

template <typename col_t>
SampledBatch sample_batch(const int64_t* rowptr, const col_t* col, int64_t num_nodes,
                          const at::Tensor& seeds, const std::vector<int64_t>& fanouts,
                          Rng rng, bool return_slots, bool pin_output) {
  // Page-locked results go to a GPU by an asynchronous DMA; pageable ones are
  // staged by the driver at a fraction of the speed, the host waiting.
  const auto long_opts = at::TensorOptions().dtype(at::kLong).pinned_memory(pin_output);
  const int64_t n_seeds = seeds.numel();
  const int64_t* seed_ids = seeds.const_data_ptr<int64_t>();
  int64_t expected = n_seeds;
  for (int64_t f : fanouts) {
    expected += expected * std::max<int64_t>(f, 1);
    if (expected > (int64_t{1} << 18)) {
      expected = int64_t{1} << 18;  // the map grows past this when it must
      break;
    }
  }
  FlatHashMap local(expected);
  FlatHashMap scratch_set;
  std::vector<int64_t> nodes;
  nodes.reserve(static_cast<size_t>(std::min(expected, num_nodes)));
  for (int64_t i = 0; i < n_seeds; ++i) {
    const int64_t v = seed_ids[i];
    TORCH_CHECK_INDEX(v >= 0 && v < num_nodes, "NeighborSampler: seed node ", c10::unified::num(v),
                      " is out of range for a graph of ", c10::unified::num(num_nodes), " nodes");
    bool inserted;
    local.find_or_insert(v, static_cast<int64_t>(nodes.size()), inserted);
    TORCH_CHECK_VALUE(inserted, "NeighborSampler: seed node ", c10::unified::num(v),
                      " appears twice in one batch (seeds must be distinct)");
    nodes.push_back(v);
  }

  SampledBatch out;
  std::vector<int64_t> picks;
  std::vector<int64_t> src;
  std::vector<int64_t> dst;
  std::vector<int64_t> slots;
  for (const int64_t fanout : fanouts) {
    const auto n_dst = static_cast<int64_t>(nodes.size());
    src.clear();
    dst.clear();
    slots.clear();
    auto emit = [&](int64_t target, int64_t slot) {
      const auto u = static_cast<int64_t>(col[slot]);
      bool inserted;
      const int64_t id = local.find_or_insert(u, static_cast<int64_t>(nodes.size()), inserted);
      if (inserted) {
        nodes.push_back(u);
      }
      src.push_back(id);
      dst.push_back(target);
      if (return_slots) {
        slots.push_back(slot);
      }
    };
    for (int64_t d = 0; d < n_dst; ++d) {
      const int64_t v = nodes[d];
      const int64_t begin = rowptr[v];
      const int64_t degree = rowptr[v + 1] - begin;
      if (fanout < 0 || degree <= fanout) {
        for (int64_t j = 0; j < degree; ++j) {
          emit(d, begin + j);
        }
      } else if (fanout > 0) {
        choose_distinct(rng, degree, fanout, picks, scratch_set);
        for (int64_t p : picks) {
          emit(d, begin + p);
        }
      }
    }
    Hop hop;
    const auto e = static_cast<int64_t>(src.size());
    hop.edge_index = at::empty({2, e}, long_opts);
    std::copy(src.begin(), src.end(), hop.edge_index.data_ptr<int64_t>());
    std::copy(dst.begin(), dst.end(), hop.edge_index.data_ptr<int64_t>() + e);
    if (return_slots) {
      hop.slots = at::empty({e}, long_opts);
      std::copy(slots.begin(), slots.end(), hop.slots.data_ptr<int64_t>());
    }
    hop.n_src = static_cast<int64_t>(nodes.size());
    hop.n_dst = n_dst;
    out.hops.push_back(std::move(hop));
  }
  out.n_id = at::empty({static_cast<int64_t>(nodes.size())}, long_opts);
  std::copy(nodes.begin(), nodes.end(), out.n_id.data_ptr<int64_t>());
  return out;
}

} // namespace

std::vector<SampledBatch> sample_neighbors(const at::Tensor& rowptr, const at::Tensor& col,
                                           const std::vector<at::Tensor>& batches,
                                           const std::vector<int64_t>& fanouts, uint64_t seed,
                                           const std::vector<int64_t>& streams, bool return_slots,
                                           bool pin_output) {
  TORCH_CHECK(rowptr.is_cpu() && rowptr.dim() == 1 && rowptr.scalar_type() == at::kLong &&
                  rowptr.is_contiguous() && rowptr.numel() >= 1,
              "NeighborSampler: rowptr must be a contiguous 1-D int64 CPU tensor");
  TORCH_CHECK(col.is_cpu() && col.dim() == 1 &&
                  (col.scalar_type() == at::kLong || col.scalar_type() == at::kInt) &&
                  col.is_contiguous(),
              "NeighborSampler: col must be a contiguous 1-D int32/int64 CPU tensor");
  TORCH_CHECK(streams.size() == batches.size(), "NeighborSampler: one stream per batch");
  for (const auto& b : batches) {
    TORCH_CHECK(b.is_cpu() && b.dim() == 1 && b.scalar_type() == at::kLong && b.is_contiguous(),
                "NeighborSampler: seed batches must be contiguous 1-D int64 CPU tensors");
  }
  const int64_t num_nodes = rowptr.numel() - 1;
  const int64_t* rp = rowptr.const_data_ptr<int64_t>();
  std::vector<SampledBatch> out(batches.size());
  at::native::unified::parallel_chunks(static_cast<int64_t>(batches.size()), 1, 0, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      Rng rng(seed, static_cast<uint64_t>(streams[b]));
      if (col.scalar_type() == at::kLong) {
        out[b] = sample_batch(rp, col.const_data_ptr<int64_t>(), num_nodes, batches[b], fanouts,
                              rng, return_slots, pin_output);
      } else {
        out[b] = sample_batch(rp, col.const_data_ptr<int32_t>(), num_nodes, batches[b], fanouts,
                              rng, return_slots, pin_output);
      }
    }
  });
  return out;
}

at::Tensor uniform_below(uint64_t seed, uint64_t stream, int64_t bound, int64_t n) {
  TORCH_CHECK_VALUE(bound > 0 && n >= 0, "uniform_below: needs bound > 0 and n >= 0");
  at::Tensor out = at::empty({n}, at::kLong);
  Rng rng(seed, stream);
  int64_t* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(bound)));
  }
  return out;
}

} // namespace torch_direct::sampler
